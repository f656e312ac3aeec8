"""A property-based fuzzer over an OpenAPI document: hypothesis strategies drawn from its JSON
Schemas, requests sent to a real server, every answer's status counted.

Written here rather than taken from schemathesis or hypothesis-jsonschema: neither is in the pinned
dev set (constraints/cpu.txt), and each brings its own pins (schemathesis: ~20 packages, among them
its own hypothesis and jsonschema ranges) into a set the verl and agent-framework pins already hold
tight. The subset of JSON Schema covered is what pydantic writes for alight's bodies: types, enum,
const, anyOf/oneOf/allOf, $ref, properties/required/additionalProperties, items, bounds, lengths,
patterns. Requests are schema-valid bodies, bodies with one field swapped for any JSON value, and
any JSON at all; query strings valid or with one bad value; path parameters drawn from known ids,
any text and edge numbers. Integers lean to their edges (64-bit limits and just past them): with
the 64-bit bounds of `limit` taken off, a run finds the 500 they prevent.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Json = Any

# Values at the edges of what servers store: 32/64-bit limits and just past them, a 23-digit number.
EDGE_INTS = [0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**22]
EDGE_FLOATS = [0.0, -0.0, 1e-300, 1e300, -1e300, 1.7976931348623157e308]
EDGES: st.SearchStrategy[Json] = st.sampled_from(EDGE_INTS) | st.sampled_from(EDGE_FLOATS)

ANY_JSON: st.SearchStrategy[Json] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | EDGES
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


class SchemaStrategies:
    """Strategies for the JSON Schemas of one OpenAPI document (its `components.schemas`)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.components: dict[str, Any] = document.get("components", {}).get("schemas", {})

    def of(self, schema: dict[str, Any]) -> st.SearchStrategy[Json]:
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return st.deferred(lambda: self.of(self.components[name]))
        if "const" in schema:
            return st.just(schema["const"])
        if "enum" in schema:
            return st.sampled_from(schema["enum"])
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return st.one_of([self.of(option) for option in schema[key]])
        if "allOf" in schema:
            return self.of(schema["allOf"][0])
        kind = schema.get("type")
        if isinstance(kind, list):
            return st.one_of([self.of({**schema, "type": one}) for one in kind])
        builder = self._builders().get(kind)
        return builder(schema) if builder is not None else ANY_JSON

    def _builders(self) -> dict[Any, Callable[[dict[str, Any]], st.SearchStrategy[Json]]]:
        return {
            "null": lambda s: st.none(),
            "boolean": lambda s: st.booleans(),
            "integer": self._integer,
            "number": self._number,
            "string": self._string,
            "array": self._array,
            "object": self._object,
        }

    def _integer(self, schema: dict[str, Any]) -> st.SearchStrategy[int]:
        low = schema.get("minimum", -(2**70))
        if "exclusiveMinimum" in schema:
            low = int(schema["exclusiveMinimum"]) + 1
        high = schema.get("maximum", 2**70)
        if "exclusiveMaximum" in schema:
            high = int(schema["exclusiveMaximum"]) - 1
        edges = [value for value in EDGE_INTS if low <= value <= high]
        return st.integers(min_value=int(low), max_value=int(high)) | st.sampled_from(edges or [int(low)])

    def _number(self, schema: dict[str, Any]) -> st.SearchStrategy[float]:
        return st.floats(
            min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
            max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in schema,
            exclude_max="exclusiveMaximum" in schema,
            allow_nan=False,
            allow_infinity=False,
        )

    def _string(self, schema: dict[str, Any]) -> st.SearchStrategy[str]:
        low, high = schema.get("minLength", 0), min(schema.get("maxLength", 30), 30)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: low <= len(s) <= high)
        return st.text(min_size=low, max_size=max(high, low))

    def _array(self, schema: dict[str, Any]) -> st.SearchStrategy[list[Json]]:
        items = self.of(schema.get("items", {}))
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 3), 3))

    def _object(self, schema: dict[str, Any]) -> st.SearchStrategy[dict[str, Json]]:
        properties: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        fixed = st.fixed_dictionaries(
            {name: self.of(sub) for name, sub in properties.items() if name in required},
            optional={name: self.of(sub) for name, sub in properties.items() if name not in required},
        )
        extra = schema.get("additionalProperties")
        if properties or extra is False:
            return fixed
        values = self.of(extra) if isinstance(extra, dict) else ANY_JSON
        return st.dictionaries(st.text(max_size=10), values, max_size=3)


def mutated(valid: st.SearchStrategy[Json]) -> st.SearchStrategy[Json]:
    """A schema-valid value with one field (of an object) swapped for any JSON value."""

    def swap(value: Json, key: str, junk: Json) -> Json:
        if isinstance(value, dict) and value:
            value = dict(value)
            value[key if key in value else sorted(value)[len(key) % len(value)]] = junk
            return value
        return junk

    return st.builds(swap, valid, st.text(max_size=10), ANY_JSON)


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, Any] = field(default_factory=dict)
    body: bytes | None = None


def calls(document: dict[str, Any], known_ids: list[str]) -> st.SearchStrategy[Call]:
    """Requests for the operations of `document`."""
    schemas = SchemaStrategies(document)
    path_values = st.sampled_from(known_ids) | st.text(min_size=1, max_size=30) | EDGES.map(str)
    options: list[st.SearchStrategy[Call]] = []
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            params = operation.get("parameters", [])
            names = [p["name"] for p in params if p["in"] == "path"]
            # valid values, or one bad value among valid ones: so each bad value reaches the handler
            valid_query = st.fixed_dictionaries(
                {}, optional={p["name"]: schemas.of(p["schema"]) for p in params if p["in"] == "query"}
            )
            query = st.one_of(
                valid_query, valid_query, mutated(valid_query).map(lambda q: q if isinstance(q, dict) else {})
            )
            body = st.none()
            if "requestBody" in operation:
                valid = schemas.of(operation["requestBody"]["content"]["application/json"]["schema"])
                body = st.one_of(valid, valid, mutated(valid), ANY_JSON).map(lambda value: json.dumps(value).encode())
                body = body | st.sampled_from([b"", b"{", b"[" * 3000, b"NaN", b'{"a": 1e999}'])

            def build(
                values: list[str], q: dict[str, Any], b: bytes | None, path: str = path, m: str = method, n: Any = names
            ) -> Call:
                filled = path
                for name, value in zip(n, values, strict=True):
                    filled = filled.replace(f"{{{name}}}", quote(value, safe=""), 1)
                return Call(m.upper(), filled, q, b)

            strategy = st.builds(
                build,
                st.lists(path_values, min_size=len(names), max_size=len(names)),
                query,
                body,
            )
            options.append(strategy)
    return st.one_of(options)


@dataclass
class Report:
    statuses: Counter[int] = field(default_factory=Counter)  # answers by status
    failures: list[str] = field(default_factory=list)  # each 5xx: its request and answer

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def fuzz(base_url: str, known_ids: list[str], *, max_examples: int, credentials: list[str] | None = None) -> Report:
    """Send `max_examples` generated requests (derandomized: the same ones every run) to the
    server at `base_url`, every operation of its `/openapi.json`, each with one of `credentials`
    as its bearer (none: no Authorization header; the document is read with the first)."""
    keys: list[str | None] = list(credentials) if credentials else [None]
    report = Report()
    with httpx.Client(base_url=base_url, timeout=60) as client:
        auth = {"Authorization": f"Bearer {keys[0]}"} if keys[0] else {}
        document = client.get("/openapi.json", headers=auth).raise_for_status().json()

        # Without credentials, the very requests of earlier runs (a second strategy would change them).
        signed = st.tuples(calls(document, known_ids), st.sampled_from(keys)) if credentials else None
        plain = calls(document, known_ids).map(lambda call: (call, None))

        @settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(signed if signed is not None else plain)
        def send(sent: tuple[Call, str | None]) -> None:
            call, key = sent
            headers = {"content-type": "application/json"} if call.body is not None else {}
            if key is not None:
                headers["Authorization"] = f"Bearer {key}"
            answer = client.request(
                call.method, call.path, params=call.query or None, content=call.body, headers=headers
            )
            report.statuses[answer.status_code] += 1
            if answer.status_code >= 500:
                request = f"{call.method} {call.path} {call.query} {call.body!r:.300}"
                report.failures.append(f"{request} -> {answer.text:.300}")

        send()
    return report
