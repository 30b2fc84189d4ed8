"""The operator API: dead letters (list, inspect, retry, dismiss) and sending commands.

:func:`create_api` is the one composition point: it takes the runtime from
:func:`~rhumbatron.runtime.bootstrap.bootstrap` and an :class:`Authenticator`
(:func:`authenticator_from_settings` picks the one the settings name). uvicorn serves it
locally; :mod:`rhumbatron.api.lambda_handler` serves it behind API Gateway.

Importing this package imports FastAPI: the other roles never import it.
"""

from __future__ import annotations

from rhumbatron.api.app import create_api
from rhumbatron.api.auth import (
    SCOPES,
    Authenticator,
    JwtAuth,
    Principal,
    StaticTokenAuth,
    authenticator_from_settings,
)
from rhumbatron.api.errors import ErrorDetail, ErrorResponse

__all__ = [
    "SCOPES",
    "Authenticator",
    "ErrorDetail",
    "ErrorResponse",
    "JwtAuth",
    "Principal",
    "StaticTokenAuth",
    "authenticator_from_settings",
    "create_api",
]
