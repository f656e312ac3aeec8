"""The OpenAPI document of a server's routes, built from the pydantic models that validate them.

The store and the proxy add their routes with Starlette's `add_route` (hot routes skip FastAPI's
body models), so FastAPI cannot describe them: each server lists its `Operation`s instead, and
`document` turns them into OpenAPI 3.1 (the schema a client or a fuzzer tests against).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

_PARAM = re.compile(r"{(\w+)(?::\w+)?}")
_ERROR = {"description": "an error, as JSON on one line", "content": {"application/json": {"schema": {}}}}


@dataclass(frozen=True)
class Operation:
    """One route: its path (Starlette syntax), method, JSON body model and query parameters."""

    path: str
    method: str
    summary: str
    body: type[BaseModel] | None = None
    query: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> JSON schema


def document(title: str, operations: Sequence[Operation]) -> dict[str, Any]:
    """An OpenAPI 3.1 document describing `operations` (bodies under `components.schemas`)."""
    models = sorted({op.body for op in operations if op.body is not None}, key=lambda m: m.__name__)
    refs, defs = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/components/schemas/{model}"
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        parameters: list[dict[str, Any]] = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
            for name in _PARAM.findall(op.path)
        ]
        parameters += [{"name": name, "in": "query", "schema": schema} for name, schema in op.query.items()]
        entry: dict[str, Any] = {
            "summary": op.summary,
            "operationId": f"{op.method.lower()}{re.sub(r'[^A-Za-z0-9]+', '_', op.path)}",
            "responses": {"200": {"description": "the answer"}, "4XX": _ERROR, "5XX": _ERROR},
        }
        if parameters:
            entry["parameters"] = parameters
        if op.body is not None:
            schema = refs[(op.body, "validation")]
            entry["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        paths.setdefault(_PARAM.sub(r"{\1}", op.path), {})[op.method.lower()] = entry
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": defs.get("$defs", {})},
    }
