"""The adapter on real traces: a multi-agent LangGraph graph (writer, checker, rewriter) run by the
runner pool through alight's proxy in front of the embedded tiny model, optimising the writer and
the rewriter only.

A group of 4 rollouts of one task is recorded once (store server over SQLite, real proxy, real
engine, so the LLM spans carry the engine's token ids and log-probs); then both adapter modes and
several credit modes run on the same traces, and `alight trace --transitions` shows them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from alight import semconv
from alight.algorithms import LightningRL
from alight.chat_template import render_prompt, render_reply
from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.types import Rollout, RolloutStatus, Span, SpanKind, Task, Transition

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
GROUP = "g-writers"
TRAINED = "writer|rewriter"


@dataclass
class Recorded:
    db: Path
    rollouts: list[Rollout]
    spans: dict[str, list[Span]]
    tokenizer: Any


async def _record(store_url: str, proxy_url: str) -> tuple[list[Rollout], dict[str, list[Span]]]:
    from alight.store.client import StoreClient
    from alight.types import LLMResource

    async with StoreClient(store_url) as store:
        await store.add_resources({"llm": LLMResource(endpoint=proxy_url, model="tiny")})
        task = Task(input={"question": "Why is the sky blue?"})
        queued = [Rollout(task=task, group_id=GROUP, timeout_s=120) for _ in range(4)]
        ids = [r.rollout_id for r in await store.enqueue(queued)]
        assert len(await store.wait_for_rollouts(ids, timeout=180)) == 4, "rollouts did not end in time"
        rollouts = [await store.get_rollout(i) for i in ids]
        return rollouts, {i: await store.query_spans(i) for i in ids}


@pytest.fixture(scope="module")
def recorded(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    from transformers import AutoTokenizer

    from alight.engines.embedded import EmbeddedEngine
    from alight.proxy import Proxy, ProxyServer
    from alight.runner import RunnerPool
    from alight.store.client import StoreClient
    from alight.store.server import StoreServer
    from alight.store.sqlite import SqliteStore

    db = tmp_path_factory.mktemp("run") / "store.db"
    engine = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=12, batch_wait_ms=2)
    with (
        StoreServer(SqliteStore(db)) as store_server,
        ProxyServer(Proxy(engine, StoreClient(store_server.url))) as proxy,
    ):
        with RunnerPool("tests.fixtures.writer_agents:write_check_rewrite", store_server.url, n_runners=2):
            rollouts, spans = asyncio.run(_record(store_server.url, proxy.url))
        proxy.flush()
    yield Recorded(db, rollouts, spans, AutoTokenizer.from_pretrained(tiny_dir))


def _llm(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.kind == SpanKind.LLM]


def _adapt(recorded: Recorded, **adapter: Any) -> tuple[dict[str, list[Transition]], Any]:
    rl = LightningRL.from_config(AdapterConfig(agent_match=TRAINED, **adapter), AlgorithmConfig(advantage="grpo"))
    transitions, stats = rl.adapt_rollouts(recorded.rollouts, recorded.spans)
    by_rollout: dict[str, list[Transition]] = {r.rollout_id: [] for r in recorded.rollouts}
    for t in transitions:
        by_rollout[t.rollout_id].append(t)
    return by_rollout, stats


def _grpo(rewards: list[float]) -> list[float]:
    r = np.asarray(rewards)
    return list((r - r.mean()) / (r.std(ddof=1) + 1e-6))


def test_the_traces_are_real(recorded: Recorded) -> None:
    for rollout in recorded.rollouts:
        assert rollout.status == RolloutStatus.SUCCEEDED, rollout
        llm = _llm(recorded.spans[rollout.rollout_id])
        assert [s.attributes[semconv.AGENT_NAME] for s in llm] == ["writer", "checker", "rewriter", "rewriter"]
        for span in llm:
            a = span.attributes
            assert a[semconv.LLM_SOURCE] == "proxy" and a[semconv.LLM_TOKEN_IDS_SOURCE] == "engine"
            assert len(a[semconv.LLM_RESPONSE_LOGPROBS]) == len(a[semconv.LLM_RESPONSE_TOKEN_IDS]) > 0
    assert len({r.reward for r in recorded.rollouts}) > 1, "sampled rollouts should not all score the same"


def test_transition_mode_keeps_writer_and_rewriter_calls_with_their_ids(recorded: Recorded) -> None:
    by_rollout, stats = _adapt(recorded)
    assert stats.calls_skipped_agent == 4 and stats.transitions == 12 and stats.logprobs_missing == 0
    advantages = _grpo([r.reward or 0.0 for r in recorded.rollouts])
    tok = recorded.tokenizer
    for rollout, advantage in zip(recorded.rollouts, advantages, strict=True):
        kept = [s for s in _llm(recorded.spans[rollout.rollout_id]) if s.attributes[semconv.AGENT_NAME] != "checker"]
        transitions = by_rollout[rollout.rollout_id]
        assert [t.agent_name for t in transitions] == ["writer", "rewriter", "rewriter"]
        assert [t.step_index for t in transitions] == [0, 1, 2]
        for t, span in zip(transitions, kept, strict=True):
            a = span.attributes
            assert t.span_id == span.span_id and t.group_id == GROUP
            assert t.prompt_ids == a[semconv.LLM_PROMPT_TOKEN_IDS]
            assert t.response_ids == a[semconv.LLM_RESPONSE_TOKEN_IDS]
            assert t.response_logprobs == a[semconv.LLM_RESPONSE_LOGPROBS]
            # The ids are the templated conversation: the prompt the engine rendered, then the reply.
            messages, reply = a[semconv.LLM_REQUEST_MESSAGES], a[semconv.LLM_RESPONSE_MESSAGE]
            templated = render_prompt(tok, messages, None) + render_reply(tok, messages, None, reply)
            # A finished reply ends with the end token the model sampled (<|im_end|> or eos), which
            # the template writes as <|im_end|>; a cut one (finish "length") has none.
            finished = a[semconv.LLM_FINISH_REASON] == "stop"
            if finished:
                assert t.response_ids[-1] in (tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id)
            generated = t.response_ids[:-1] if finished else t.response_ids
            assert tok.decode(t.prompt_ids + generated, skip_special_tokens=False) + "<|im_end|>\n" == templated
            # identity credit: every transition gets the episode reward and the rollout's GRPO advantage.
            assert t.reward == rollout.reward
            assert t.advantage == pytest.approx(advantage, abs=1e-9)


def test_credit_modes_on_the_same_traces(recorded: Recorded) -> None:
    rewards = [r.reward or 0.0 for r in recorded.rollouts]
    last, _ = _adapt(recorded, credit="last")
    for rollout, advantage in zip(recorded.rollouts, _grpo(rewards), strict=True):
        transitions = last[rollout.rollout_id]
        assert [t.reward for t in transitions] == [0.0, 0.0, rollout.reward]
        assert [t.advantage for t in transitions][:2] == [0.0, 0.0]
        assert transitions[-1].advantage == pytest.approx(advantage, abs=1e-9)
    gamma = 0.5
    discounted, _ = _adapt(recorded, credit="discounted", gamma=gamma)
    for rollout in recorded.rollouts:
        r = rollout.reward or 0.0
        assert [t.reward for t in discounted[rollout.rollout_id]] == pytest.approx([gamma**2 * r, gamma * r, r])
    # Per-transition credit: advantages are pooled over the group's transitions.
    flat = [t for rollout in recorded.rollouts for t in discounted[rollout.rollout_id]]
    assert [t.advantage for t in flat] == pytest.approx(_grpo([t.reward for t in flat]), abs=1e-9)


def test_trajectory_mode_on_the_same_traces(recorded: Recorded) -> None:
    by_rollout, stats = _adapt(recorded, mode="trajectory")
    advantages = _grpo([r.reward or 0.0 for r in recorded.rollouts])
    merged = 0
    for rollout, advantage in zip(recorded.rollouts, advantages, strict=True):
        writer, _, first, second = _llm(recorded.spans[rollout.rollout_id])
        p1, r1 = first.attributes[semconv.LLM_PROMPT_TOKEN_IDS], first.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
        p2, r2 = second.attributes[semconv.LLM_PROMPT_TOKEN_IDS], second.attributes[semconv.LLM_RESPONSE_TOKEN_IDS]
        transitions = by_rollout[rollout.rollout_id]
        assert transitions[0].prompt_ids == writer.attributes[semconv.LLM_PROMPT_TOKEN_IDS]
        assert all(t.reward == rollout.reward for t in transitions)
        assert all(t.advantage == pytest.approx(advantage, abs=1e-9) for t in transitions)
        if p2[: len(p1) + len(r1)] != p1 + r1:
            # The rewriter's next prompt does not extend its first call's ids: the only causes are
            # the client re-sending a reply whose invalid UTF-8 became U+FFFD (re-tokenised
            # differently), or an eos the template writes back as <|im_end|>. Then the call starts
            # a new sequence.
            drifted = "\ufffd" in (first.attributes[semconv.LLM_RESPONSE_MESSAGE].get("content") or "")
            assert drifted or r1[-1] == recorded.tokenizer.eos_token_id
            assert [t.agent_name for t in transitions] == ["writer", "rewriter", "rewriter"]
            continue
        merged += 1
        assert [t.agent_name for t in transitions] == ["writer", "rewriter"]
        rewriter = transitions[1]
        inserted = p2[len(p1) + len(r1) :]
        assert rewriter.prompt_ids == p1
        assert rewriter.response_ids == r1 + inserted + r2
        assert rewriter.response_mask == [1] * len(r1) + [0] * len(inserted) + [1] * len(r2)
        assert rewriter.metadata["span_ids"] == [first.span_id, second.span_id]
    assert stats.trajectory_merges == merged and stats.trajectory_fallbacks == 4 - merged


def _alight(*args: str) -> subprocess.CompletedProcess[str]:
    path = f"{REPO / 'src'}{os.pathsep}{REPO}"  # this checkout's code (whichever is installed), then tests.*
    env = {**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "alight", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_trace_shows_the_transitions(recorded: Recorded, tmp_path: Path) -> None:
    rollout = recorded.rollouts[0]
    expected, _ = _adapt(recorded)
    shown = _alight(
        "trace", str(recorded.db.parent), "--rollout", rollout.rollout_id, "--transitions",
        f"adapter.agent_match={TRAINED}", "--json",
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["settings"]["agent_match"] == TRAINED and len(data["group"]) == 4
    rows = data["transitions"]
    want = expected[rollout.rollout_id]
    assert [r["agent_name"] for r in rows] == [t.agent_name for t in want]
    assert [r["prompt_ids"] for r in rows] == [t.prompt_ids for t in want]
    assert [r["advantage"] for r in rows] == pytest.approx([t.advantage for t in want])

    config = tmp_path / "exp.yaml"
    config.write_text(
        "agent:\n  entrypoint: tests.fixtures.writer_agents:write_check_rewrite\n"
        f"adapter:\n  agent_match: '{TRAINED}'\n  credit: last\n"
    )
    table = _alight(
        "trace", str(recorded.db), "--rollout", rollout.rollout_id, "--transitions", "--config", str(config)
    )
    assert table.returncode == 0, table.stderr
    assert "credit last" in table.stdout and "writer|rewriter" in table.stdout
    lines = [line for line in table.stdout.splitlines() if "│" in line]
    assert [line.split("│")[2].strip() for line in lines] == ["writer", "rewriter", "rewriter"]
