"""The API's operations as MCP tools, read off its OpenAPI document, and a tool call as the
API request it stands for.

A tool's name is the operation's ID; its input is an object of the operation's path and
query parameters (by the names the API uses) and, when the operation takes one, ``body``
(the request body's schema). A read-only tool (``GET``) says so; a destructive one — it
deletes, closes or cancels what cannot be had back, or acts on the cluster — also needs
``confirm: true``, so an agent cannot do it by accident. The description says what the
operation does, when to use it and what it changes (the operation's summary and docs).

A call is the HTTP request of the operation, sent to the API in process with the caller's
bearer token: the API authenticates, checks the scope, validates, audits and answers, and
the tool returns the answer's JSON — an error answer (the API's error model) as a tool
error. Nothing of the API is re-implemented here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

__all__ = ["DESTRUCTIVE", "Operation", "ToolCaller", "operations"]

#: Operations that delete, close or cancel what cannot be had back, or act on the cluster
#: or on other systems again (a replay re-runs reactions): their tools need ``confirm``.
DESTRUCTIVE = frozenset(
    {
        "dismiss_dead_letter",
        "dismiss_dead_letter_group",
        "clean_up_project",
        "archive_project",
        "remove_app",
        "decline_change",
        "cancel_change",
        "fail_task",
        "release_claim",
        "delete_subscription",
        "delete_schedule",
        "replay",
        "replay_skipped",
        "repair_log",
        "cancel_workflow",
        "terminate_workflow",
    }
)
_METHODS = ("get", "post", "put", "patch", "delete")
_REF = re.compile(r"#/components/schemas/([A-Za-z0-9_.\-]+)")


@dataclass(frozen=True, slots=True)
class Operation:
    """One API operation, as a tool."""

    name: str
    method: str
    path: str
    title: str
    description: str
    path_params: tuple[str, ...]
    query_params: tuple[str, ...]
    has_body: bool
    input_schema: Mapping[str, Any]

    @property
    def read_only(self) -> bool:
        return self.method == "GET"

    @property
    def destructive(self) -> bool:
        return self.name in DESTRUCTIVE


def operations(openapi: Mapping[str, Any]) -> list[Operation]:
    """Every operation of the document, as a tool, in the document's order."""
    components = openapi.get("components", {}).get("schemas", {})
    found: list[Operation] = []
    for path, item in openapi["paths"].items():
        for method in _METHODS:
            op = item.get(method)
            if op is not None:
                found.append(_operation(path, method.upper(), op, components))
    return found


def _operation(
    path: str, method: str, op: Mapping[str, Any], components: Mapping[str, Any]
) -> Operation:
    name = str(op["operationId"])
    properties: dict[str, Any] = {}
    required: list[str] = []
    path_params: list[str] = []
    query_params: list[str] = []
    for param in op.get("parameters", []):
        where, param_name = param["in"], param["name"]
        if where not in ("path", "query"):
            continue
        param_schema = dict(param.get("schema", {}))
        if param.get("description"):
            param_schema["description"] = param["description"]
        properties[param_name] = param_schema
        (path_params if where == "path" else query_params).append(param_name)
        if param.get("required"):
            required.append(param_name)
    body = op.get("requestBody")
    if body is not None:
        properties["body"] = body["content"]["application/json"]["schema"]
        if body.get("required"):
            required.append("body")
    destructive = name in DESTRUCTIVE
    if destructive:
        properties["confirm"] = {
            "type": "boolean",
            "const": True,
            "description": "true: you mean it. This operation cannot be undone (see the "
            "description); ask the person you act for when unsure.",
        }
        required.append("confirm")
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    defs = _definitions(properties, components)
    if defs:
        schema["$defs"] = defs
    rewritten = json.loads(_REF.sub(r"#/$defs/\1", json.dumps(schema)))
    return Operation(
        name=name,
        method=method,
        path=path,
        title=str(op.get("summary") or name),
        description=_description(method, path, op, destructive),
        path_params=tuple(path_params),
        query_params=tuple(query_params),
        has_body=body is not None,
        input_schema=rewritten,
    )


def _definitions(value: Any, components: Mapping[str, Any]) -> dict[str, Any]:
    """The component schemas ``value`` refers to, and those they refer to."""
    defs: dict[str, Any] = {}
    pending = set(_REF.findall(json.dumps(value)))
    while pending:
        name = pending.pop()
        if name in defs or name not in components:
            continue
        defs[name] = components[name]
        pending |= set(_REF.findall(json.dumps(components[name]))) - set(defs)
    return defs


def _description(method: str, path: str, op: Mapping[str, Any], destructive: bool) -> str:
    parts = [str(op.get("summary") or "").rstrip(".") + "."]
    if op.get("description"):
        parts.append(" ".join(str(op["description"]).split()))
    if method == "GET":
        parts.append("Read-only: it changes nothing.")
    elif destructive:
        parts.append("It cannot be undone: pass confirm: true. Audited.")
    else:
        parts.append("It changes state. Audited.")
    parts.append(f"(API: {method} {path}.)")
    return " ".join(parts)


@dataclass
class ToolCaller:
    """Calls the API's operations in process: ``client`` is an ``httpx.AsyncClient`` over
    the API's ASGI app."""

    client: httpx.AsyncClient
    by_name: Mapping[str, Operation]

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None, token: str | None
    ) -> tuple[bool, Any]:
        """``(is_error, answer)``: the operation's JSON answer, or why the call could not
        be made (an unknown tool, an unknown argument, a missing confirmation)."""
        op = self.by_name.get(name)
        if op is None:
            return True, {"error": {"code": "unknown_tool", "message": f"no tool {name!r}"}}
        args = dict(arguments or {})
        accepted = {*op.path_params, *op.query_params, *(["body"] if op.has_body else [])}
        if op.destructive and args.pop("confirm", None) is not True:
            return True, _refusal(
                "confirmation_required",
                f"{name} cannot be undone: call it again with confirm: true",
                "confirm",
            )
        unknown = sorted(set(args) - accepted)
        if unknown:
            return True, _refusal(
                "invalid_request",
                f"{name} takes {', '.join(sorted(accepted)) or 'no arguments'}; not "
                f"{', '.join(unknown)}",
                unknown[0],
            )
        missing = [p for p in op.path_params if p not in args]
        if missing:
            return True, _refusal("invalid_request", f"{name} needs {missing[0]}", missing[0])
        url = op.path
        for param in op.path_params:
            url = url.replace("{" + param + "}", quote(str(args[param]), safe=""))
        query = {p: args[p] for p in op.query_params if args.get(p) is not None}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        response = await self.client.request(
            op.method,
            url,
            params=query,
            json=args.get("body") if op.has_body else None,
            headers=headers,
        )
        try:
            answer = response.json()
        except ValueError:
            answer = {"status": response.status_code, "text": response.text}
        return response.status_code >= 400, answer


def _refusal(code: str, message: str, field: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "field": field}}
