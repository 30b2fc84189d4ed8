"""``/docs`` offline and public (issue #20): the Swagger UI page, everything it loads and the
OpenAPI document answer without a token, from the API itself; every operation still asks
for one. ``tests/e2e/test_docs_offline.py`` renders the page in a browser with no way out;
``tests/lambda_/test_template.py`` checks the same routes are the public ones at the edge.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from rhumbatron.api import JwtAuth, StaticTokenAuth, create_api
from rhumbatron.api.docs_page import DOCS_STATIC
from rhumbatron.core.clock import ManualClock
from rhumbatron.runtime.bootstrap import Rhumbatron

from .conftest import TestClient

pytestmark = pytest.mark.integration

#: What the page loads: Swagger UI's script, style and icon, and the document it renders.
PAGE_LOADS = {
    f"{DOCS_STATIC}/swagger-ui-bundle.js": "text/javascript",
    f"{DOCS_STATIC}/swagger-ui.css": "text/css",
    f"{DOCS_STATIC}/favicon.png": "image/png",
    "/openapi.json": "application/json",
}
#: The routes that answer without a token.
PUBLIC_OPERATIONS = {"GET /health"}


def _loaded_by(page: str) -> set[str]:
    """The URLs a Swagger UI page loads: its links, its scripts and the document's ``url``."""
    return set(re.findall(r'(?:href|src)="([^"]*)"', page)) | set(
        re.findall(r"\burl: '([^']*)'", page)
    )


@pytest.fixture(params=["static-tokens", "jwt"])
def anonymous(
    request: pytest.FixtureRequest, runtime: Rhumbatron, clock: ManualClock
) -> Iterator[TestClient]:
    """A client that sends no token, to the API with either authenticator (jwt: the cloud's)."""
    auth = (
        StaticTokenAuth(runtime.settings.api_tokens)
        if request.param == "static-tokens"
        else JwtAuth(
            clock=clock, issuer="https://login.example.test/", audience="api", secret="s" * 32
        )
    )
    with TestClient(create_api(runtime, auth)) as client:
        yield client


def test_the_docs_page_and_all_it_loads_answer_without_a_token_from_the_api_itself(
    anonymous: TestClient,
) -> None:
    # WHEN the docs page is fetched without a token
    page = anonymous.get("/docs")
    # THEN it is Swagger UI's page, loading its assets and the document from the API alone
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert _loaded_by(page.text) == set(PAGE_LOADS), page.text
    # AND each of those answers without a token too
    for url, content_type in PAGE_LOADS.items():
        response = anonymous.get(url)
        assert response.status_code == 200, url
        assert response.headers["content-type"].startswith(content_type), url
        assert response.content, url
    assert "/dead-letters" in anonymous.get("/openapi.json").json()["paths"]


def test_the_public_assets_are_only_the_ones_the_page_loads(anonymous: TestClient) -> None:
    # The package ships more (ReDoc's script, which this API does not offer), and a public
    # route must serve exactly what the page needs: nothing else, nothing outside the folder.
    for name in ("redoc.standalone.js", "__init__.py", "..%2f__init__.py", "missing.js"):
        response = anonymous.get(f"{DOCS_STATIC}/{name}")
        assert response.status_code == 404, name


def test_every_operation_but_health_answers_401_without_a_token(anonymous: TestClient) -> None:
    # GIVEN every operation the OpenAPI document lists, its path parameters filled in
    document = anonymous.get("/openapi.json").json()
    operations = {
        f"{method.upper()} {path}": operation
        for path, methods in document["paths"].items()
        for method, operation in methods.items()
    }
    # THEN the document itself says only /health needs no token
    assert {name for name, op in operations.items() if not op.get("security")} == (
        PUBLIC_OPERATIONS
    )
    # AND each other operation, called without one, is refused before it does anything
    answers = {}
    for name in set(operations) - PUBLIC_OPERATIONS:
        method, path = name.split(" ", 1)
        response = anonymous.request(method, re.sub(r"\{[^}]+\}", "x", path))
        answers[name] = (response.status_code, response.json()["error"]["code"])
    assert len(answers) > 40
    assert {name: a for name, a in answers.items() if a != (401, "missing_token")} == {}


def test_the_docs_page_loads_from_the_prefix_it_is_served_under(runtime: Rhumbatron) -> None:
    # GIVEN the API behind a proxy that serves it under a prefix (uvicorn --root-path; in the
    #   cloud Mangum sets none, as the HTTP API's $default stage adds none)
    api = create_api(runtime, StaticTokenAuth({}))
    with TestClient(api, root_path="/stage") as client:
        # WHEN the page is fetched there
        page = client.get("/stage/docs")
        # THEN what it loads is under the same prefix, on the same host, and is there
        assert page.status_code == 200
        assert _loaded_by(page.text) == {f"/stage{url}" for url in PAGE_LOADS}
        for url in PAGE_LOADS:
            assert client.get(f"/stage{url}").status_code == 200, url
