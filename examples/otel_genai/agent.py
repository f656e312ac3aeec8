"""A stock OpenTelemetry SDK agent that reports GenAI-convention spans to alight's store over OTLP/HTTP.

Nothing here imports alight. The standard OTEL_* variables point the SDK's OTLP/HTTP exporter at
the store and name the rollout and attempt the spans belong to (resource attributes):

    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://127.0.0.1:4747/v1/traces
    OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<token>      # only when the store has a token
    OTEL_RESOURCE_ATTRIBUTES=service.name=weather-agent,alight.rollout_id=ro-...,alight.attempt_id=at-...

Without alight.rollout_id/alight.attempt_id there, the script first claims a fresh rollout from the
store (plain HTTP: enqueue, dequeue, start) and finishes its attempt afterwards, so it runs alone
against `alight store`. The model's answers are canned (no model is called): in a real agent they
come from the LLM client, and its GenAI instrumentation writes these spans.

    python examples/otel_genai/agent.py [--store http://127.0.0.1:4747]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import urllib.request
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

MODEL = "gpt-4o-mini"
QUESTION = "What's the weather in Paris?"


def run_agent(tracer: Any) -> str:
    """One agent run: a chat call that asks for a tool, the tool, a failing tool, a final chat call."""
    with tracer.start_as_current_span(
        "invoke_agent weather-agent",
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "weather-agent",
            "gen_ai.agent.id": "agent-1",
            "gen_ai.provider.name": "openai",
        },
    ):
        user = {"role": "user", "parts": [{"type": "text", "content": QUESTION}]}
        call = {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"location": "Paris"}}
        chat(tracer, [user], {"role": "assistant", "parts": [call], "finish_reason": "tool_calls"}, (42, 9))
        result = tool(tracer, "get_weather", "call_1", {"location": "Paris"}, lambda: "rainy, 57°F")
        with contextlib.suppress(TimeoutError):  # the agent answers without the forecast
            tool(tracer, "get_forecast", "call_2", {"location": "Paris", "days": 3}, forecast_service)
        history = [
            user,
            {"role": "assistant", "parts": [call]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": result}]},
        ]
        answer = f"It is {result} in Paris."
        reply = {"role": "assistant", "parts": [{"type": "text", "content": answer}], "finish_reason": "stop"}
        chat(tracer, history, reply, (61, 11))
        return answer


def chat(tracer: Any, messages: list[dict[str, Any]], reply: dict[str, Any], usage: tuple[int, int]) -> None:
    with tracer.start_as_current_span(f"chat {MODEL}", kind=SpanKind.CLIENT) as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": MODEL,
                "gen_ai.request.temperature": 0.7,
                "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "You report the weather."}]),
                "gen_ai.input.messages": json.dumps(messages),
                "gen_ai.response.model": f"{MODEL}-2024-07-18",
                "gen_ai.output.messages": json.dumps([reply]),
                "gen_ai.response.finish_reasons": [reply["finish_reason"]],
                "gen_ai.usage.input_tokens": usage[0],
                "gen_ai.usage.output_tokens": usage[1],
            }
        )


def tool(tracer: Any, name: str, call_id: str, arguments: dict[str, Any], fn: Any) -> str:
    with tracer.start_as_current_span(f"execute_tool {name}", record_exception=False) as span:
        span.set_attributes(
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": call_id,
                "gen_ai.tool.call.arguments": json.dumps(arguments),
            }
        )
        try:
            result = str(fn())
        except Exception as err:
            span.record_exception(err)
            span.set_attribute("error.type", type(err).__name__)
            span.set_status(Status(StatusCode.ERROR, str(err)))
            raise
        span.set_attribute("gen_ai.tool.call.result", result)
        return result


def forecast_service() -> str:
    raise TimeoutError("forecast service did not answer in 5 s")


# -- running alone: claim a rollout from the store over its HTTP API -------------------------------


def _post(store: str, path: str, body: Any, token: str | None) -> Any:
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(f"{store}{path}", data=json.dumps(body).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


def claim_rollout(store: str, token: str | None) -> tuple[str, str]:
    """A new rollout enqueued and claimed: (rollout id, attempt id)."""
    _post(store, "/store/enqueue", {"rollouts": [{"task": {"input": {"question": QUESTION}}, "mode": "dev"}]}, token)
    claim = _post(store, "/store/dequeue", {"worker_id": "otel-example"}, token)
    attempt_id = claim["attempt"]["attempt_id"]
    _post(store, f"/store/attempts/{attempt_id}/start", {}, token)
    return claim["rollout"]["rollout_id"], attempt_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", default="http://127.0.0.1:4747", help="the store server's URL")
    args = parser.parse_args()
    token = os.environ.get("ALIGHT_TOKEN") or None
    resource = Resource.create()  # service.name and alight.* ids from OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES
    attempt_id = None
    if "alight.attempt_id" not in resource.attributes:
        rollout_id, attempt_id = claim_rollout(args.store, token)
        resource = resource.merge(Resource({"alight.rollout_id": rollout_id, "alight.attempt_id": attempt_id}))
        print(f"rollout {rollout_id}")
    if resource.attributes.get("service.name", "").startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "weather-agent"}))
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or f"{args.store}/v1/traces"
    headers = (
        None if os.environ.get("OTEL_EXPORTER_OTLP_HEADERS") or not token else {"authorization": f"Bearer {token}"}
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint, headers=headers)))
    print(run_agent(provider.get_tracer("weather-agent")))
    provider.shutdown()  # flushes the spans to the store
    if attempt_id is not None:  # ours to finish
        _post(args.store, f"/store/attempts/{attempt_id}/finish", {"status": "succeeded", "reward": 1.0}, token)


if __name__ == "__main__":
    main()
