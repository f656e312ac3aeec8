"""APO's pure parts as tables: reading the optimiser's answer, checking candidates (the length
limit on both sides), scoring a prompt from its rollouts (failed ones count 0), the beam, trace
rendering, and the search itself with an in-memory `evaluate` (the real-stack run is in
tests/trainer/test_apo_loop.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

import pytest

from alight.algorithms.apo import (
    Candidate,
    LLMOptimizer,
    PromptSearch,
    Scored,
    SearchSettings,
    check_candidate,
    parse_candidates,
    render_trace,
    select_beam,
)
from alight.algorithms.apo.checks import check_apo
from alight.config.schema import ApoConfig
from alight.errors import ConfigError
from alight.trainer.loops.apo import score_prompts
from alight.types import Rollout, RolloutStatus, Task
from tests.fixtures.apo import ScriptedOptimizer, prompt_score


@pytest.mark.parametrize(
    ("answer", "n", "expected"),
    [
        ("<prompt>A {q}</prompt> and <prompt>B {q}</prompt>", 5, ["A {q}", "B {q}"]),
        ("<prompt>A</prompt><prompt>B</prompt><prompt>C</prompt>", 2, ["A", "B"]),  # at most n
        ("<PROMPT>\n  A  \n</PROMPT><prompt>A</prompt><prompt> </prompt>", 5, ["A"]),  # stripped, no repeats
        ("Sure!\n```text\nFenced prompt\n```\nand\n```\nSecond\n```", 5, ["Fenced prompt", "Second"]),
        ("  Just the new prompt.  ", 3, ["Just the new prompt."]),  # a bare answer is one candidate
        ("", 3, []),
        ("   \n ", 3, []),
        ("<prompt>never closed", 3, []),  # a broken tag is no prompt, not the whole answer
        ("<prompt>A</prompt>", 0, []),
    ],
)
def test_parse_candidates(answer: str, n: int, expected: list[str]) -> None:
    assert parse_candidates(answer, n) == expected


@pytest.mark.parametrize(
    ("candidate", "parent", "error"),
    [
        ("Solve {question} carefully", "Solve {question}", None),
        ("Be brief.", "", None),
        ("", "Solve {question}", "empty prompt"),
        ("x" * 10, "p", None),  # exactly the limit: accepted
        ("x" * 11, "p", "longer than 10 characters (11)"),
        (" Solve {question} ", "Solve {question}", "same as its parent"),
        ("Solve\x00 {question}", "Solve {question}", "holds control characters"),
        ("Line one\n\tline two {question}", "Solve {question}", None),
        ("Solve {question", "Solve {question}", "not a valid template (unbalanced { or })"),
        ("Solve it", "Solve {question}", "placeholders differ: drops {question}"),
        ("Solve {question} {hint}", "Solve {question}", "placeholders differ: adds {hint}"),
        ("Use {{braces}} for {question}", "Solve {question}", None),  # escaped braces are text
    ],
)
def test_check_candidate(candidate: str, parent: str, error: str | None) -> None:
    assert check_candidate(candidate, parent, 10 if parent == "p" else 200) == error


def test_the_beam_keeps_the_best_and_ties_keep_the_older() -> None:
    pool = [
        Candidate(0, 0, "a", None, score=0.5),
        Candidate(1, 1, "b", 0, score=0.5),
        Candidate(2, 1, "c", 0, score=0.75),
        Candidate(3, 1, "d", 0, score=None, error="refused"),
        Candidate(4, 1, "e", 0, score=0.25),
    ]
    assert [c.id for c in select_beam(pool, 2)] == [2, 0]
    assert [c.id for c in select_beam(list(reversed(pool)), 3)] == [2, 0, 1]
    assert select_beam(pool[3:4], 2) == []


def test_render_trace_shows_the_conversation_tools_and_reward_within_bounds() -> None:
    spans = [
        {
            "kind": "llm",
            "attributes": {
                "llm.request.messages": [
                    {"role": "system", "content": "Use the tool."},
                    {"role": "user", "content": "What is 2+3?"},
                ],
                "llm.response.message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"function": {"name": "calculate", "arguments": '{"expression": "2+3"}'}}],
                },
            },
        },
        {"kind": "tool", "name": "lookup", "attributes": {"tool.arguments": {"q": 1}, "tool.output": "nothing"}},
    ]
    text = render_trace(spans, 0.0, 1000)
    assert text.splitlines() == [
        "system: Use the tool.",
        "user: What is 2+3?",
        'assistant: [tool call] calculate({"expression": "2+3"})',
        '[tool] lookup({"q": 1}) -> nothing',
        "reward: 0",
    ]
    long = render_trace(
        [{"kind": "llm", "attributes": {"llm.request.messages": [{"role": "user", "content": "x" * 5000}]}}], None, 300
    )
    assert len(long) <= 300 and "characters cut" in long and long.endswith("reward: none (the rollout failed)")
    assert render_trace([], 1.0, 200) == "(no LLM call or tool call was recorded)\nreward: 1"


def test_the_search_with_a_deterministic_evaluator() -> None:
    """Scores come from the prompt text; traces are the rollout ids: the search alone, exactly."""
    asked: list[tuple[list[str], int, str]] = []

    async def evaluate(prompts: Sequence[str], round_: int, split: str) -> list[Scored]:
        asked.append((list(prompts), round_, split))
        return [Scored(prompt_score(p), {f"{p}#{i}": prompt_score(p) + i for i in range(3)}) for p in prompts]

    async def traces(rewards: Mapping[str, float | None]) -> list[str]:
        return list(rewards)

    optimizer = ScriptedOptimizer(
        {"Go": ["Go step by step", "Go on"], "Go step by step": "<prompt>Be careful, step by step</prompt>"}
    )
    search = PromptSearch(SearchSettings(rounds=2, beam_width=1, candidates=2, n_traces=2), optimizer, evaluate, traces)
    best = asyncio.run(search.run("Go"))
    assert best.prompt == "Be careful, step by step" and best.score == 1.0
    assert optimizer.calls[0] == ("Go", ["Go#0", "Go#1"])  # the two lowest-reward rollouts, lowest first
    assert [(a[1], a[2]) for a in asked] == [(0, "val"), (1, "train"), (1, "val"), (2, "train"), (2, "val")]
    assert asked[2][0] == ["Go step by step", "Go on"]
    assert [(c.prompt, c.score) for c in search.history] == [
        ("Go", 0.0),
        ("Go step by step", 0.5),
        ("Go on", 0.0),
        ("Be careful, step by step", 1.0),
    ]


def test_a_prompt_whose_rollouts_failed_scores_them_zero_and_cannot_win_on_fewer_scored_rollouts() -> None:
    """Prompt A's one succeeded rollout earned 1; of its others one failed (with a reward emitted
    before the crash), one timed out, one never ended. B's four earned 0.5 each. A scores 1/4
    (failed, timed-out and unfinished count 0, not skipped: skipped, A would score 1 and win)
    and B, though newer, takes the beam; the failed rollouts are A's lowest (None) for the traces."""

    def ended(rid: str, status: RolloutStatus, reward: float | None) -> Rollout:
        return Rollout(rollout_id=rid, task=Task(input={"question": rid}), status=status, reward=reward)

    finished = [
        ended("a0", RolloutStatus.SUCCEEDED, 1.0),
        ended("a1", RolloutStatus.FAILED, 1.0),
        ended("a2", RolloutStatus.TIMEOUT, None),
        *(ended(f"b{i}", RolloutStatus.SUCCEEDED, 0.5) for i in range(4)),
    ]
    a, b = score_prompts([["a0", "a1", "a2", "a3"], [f"b{i}" for i in range(4)]], finished)
    assert (a.score, b.score) == (0.25, 0.5)
    assert a.rewards == {"a0": 1.0, "a1": None, "a2": None, "a3": None}
    pool = [Candidate(0, 0, "A", None, score=a.score), Candidate(1, 1, "B", 0, score=b.score)]
    assert [c.prompt for c in select_beam(pool, 1)] == ["B"]


def test_max_prompt_chars_accepts_a_prompt_of_exactly_the_limit_and_refuses_one_more() -> None:
    """The limit is inclusive in the search (a candidate of 20 characters is scored, 21 refused
    unscored) and in the config check of the initial prompt."""
    at, over = "Go " + "x" * 17, "Go " + "y" * 18
    assert (len(at), len(over)) == (20, 21)

    async def evaluate(prompts: Sequence[str], round_: int, split: str) -> list[Scored]:
        return [Scored(0.5, {f"{p}#0": 0.5}) for p in prompts]

    async def traces(rewards: Mapping[str, float | None]) -> list[str]:
        return list(rewards)

    settings = SearchSettings(rounds=1, beam_width=1, candidates=2, max_prompt_chars=20)
    search = PromptSearch(settings, ScriptedOptimizer({"Go": [at, over]}), evaluate, traces)
    asyncio.run(search.run("Go"))
    made = {c.prompt: c for c in search.history[1:]}
    assert made[at].error is None and made[at].score == 0.5
    assert made[over].error == "longer than 20 characters (21)" and made[over].score is None
    check_apo(ApoConfig(prompt="p" * 20, max_prompt_chars=20))
    with pytest.raises(ConfigError, match=r"longer than algorithm\.apo\.max_prompt_chars=20"):
        check_apo(ApoConfig(prompt="p" * 21, max_prompt_chars=20))


def test_the_llm_optimiser_survives_a_failing_model_and_garbage() -> None:
    async def down(messages: list[dict[str, str]]) -> str:
        raise ConnectionError("refused")

    answers = iter(["the critique", "<prompt>"])

    async def garbage(messages: list[dict[str, str]]) -> str:
        return next(answers)

    failed = asyncio.run(LLMOptimizer(down).propose("p", ["t"], 2))
    assert failed.candidates == [] and failed.error == "critique call failed: ConnectionError: refused"
    weak = asyncio.run(LLMOptimizer(garbage).propose("p", ["t"], 2))
    assert weak.critique == "the critique" and weak.candidates == [] and weak.error == "the answer holds no prompt"
