"""An agent written with the `anthropic` SDK (examples/anthropic/agent.py) through the whole real
stack: `alight dev` starts the store, the proxy on the embedded tiny model and the runner pool; the
agent's non-streamed tool-loop call (`solver`) and streamed answer (`writer`) reach the proxy's
`/v1/messages` and are recorded with the engine's token ids, and the adapter's `agent_match` selects
them by agent. (The untrained tiny model does not call tools: tool use through the proxy and the
SDK's instrumentation is in tests/proxy/test_anthropic_api.py and tests/tracing/test_anthropic_sdk.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from alight import semconv
from alight.adapters import SpanAdapter
from alight.types import Span, SpanKind

pytest.importorskip("anthropic")
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "anthropic.yaml"


def stored_spans(run_dir: Path, rollout_ids: list[str]) -> dict[str, list[Span]]:
    from alight.store.sqlite import SqliteStore

    async def read() -> dict[str, list[Span]]:
        store = SqliteStore(run_dir / "store.db")
        try:
            return {rid: await store.query_spans(rid) for rid in rollout_ids}
        finally:
            await store.close()

    return asyncio.run(read())


def test_anthropic_sdk_agent_through_the_pool_on_the_embedded_engine(tmp_path: Path) -> None:
    run_dir = tmp_path / "dev"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "alight", "dev", str(CONFIG), "--n", "2", "--json", "--run-dir", str(run_dir),
         "runner.n_runners=2", "engine.sampling.max_tokens=8"],
        capture_output=True, text=True, timeout=240, cwd=REPO, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["rollouts"]
    assert [row["status"] for row in rows] == ["succeeded", "succeeded"], rows
    spans = stored_spans(run_dir, [row["rollout_id"] for row in rows])
    for row in rows:
        rollout_spans = spans[row["rollout_id"]]
        llm = [s for s in rollout_spans if s.kind == SpanKind.LLM]
        assert [(s.attributes[semconv.AGENT_NAME], s.attributes[semconv.LLM_STREAM]) for s in llm] == [
            ("solver", False),
            ("writer", True),
        ]
        for span in llm:
            a = span.attributes
            assert (a[semconv.LLM_API], a[semconv.LLM_SOURCE], a[semconv.LLM_TOKEN_IDS_SOURCE]) == (
                "anthropic",
                "proxy",
                "engine",
            )
            assert a[semconv.LLM_PROMPT_TOKEN_IDS] and 0 < len(a[semconv.LLM_RESPONSE_TOKEN_IDS]) <= 8
            assert len(a[semconv.LLM_RESPONSE_LOGPROBS]) == len(a[semconv.LLM_RESPONSE_TOKEN_IDS])
            assert a[semconv.LLM_REQUEST_SAMPLING]["max_tokens"] == 8  # from llm.sampling_parameters
        solver = llm[0].attributes
        assert solver[semconv.LLM_REQUEST_TOOLS][0]["function"]["name"] == "add"
        assert solver[semconv.LLM_REQUEST_MESSAGES][0]["role"] == "system"
        agents = {s.span_id: s.name for s in rollout_spans if s.kind == SpanKind.AGENT}
        assert [agents.get(str(s.parent_id)) for s in llm] == ["solver", "writer"]  # nested under their agents

        def selected(match: str | None, spans_: list[Span] = rollout_spans, row_: dict = row) -> list[str | None]:
            adapted = SpanAdapter(agent_match=match).adapt(spans_, rollout_id=row_["rollout_id"], reward=row_["reward"])
            return [t.agent_name for t in adapted.transitions]

        assert selected("solver|writer") == ["solver", "writer"]
        assert selected("solver") == ["solver"]
        assert selected("writer") == ["writer"]
        first = SpanAdapter(agent_match="solver").adapt(rollout_spans, rollout_id=row["rollout_id"]).transitions[0]
        assert list(first.prompt_ids) == llm[0].attributes[semconv.LLM_PROMPT_TOKEN_IDS]
        assert list(first.response_ids) == llm[0].attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
