"""APO through the real stack: SQLite store server, LLM proxy, runner processes running
`tests.fixtures.apo:keyword_agent`, each candidate's rollouts pinned to its own resource set. The
policy is the scripted OpenAI-compatible server behind the real LiteLLM engine (no model is needed:
the agent's reward depends on its prompt alone), so every score is exact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from alight.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    ApoConfig,
    EngineConfig,
    ExperimentConfig,
    LoggingConfig,
    RunnerConfig,
    SamplingConfig,
    TrainerConfig,
)
from tests.fixtures.apo import ScriptedOptimizer, prompt_score
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer

P0 = "Answer: {question}"
STEP = "Think step by step. Answer: {question}"
TIE = "Answer now: {question}"
BEST = "Be careful. Think step by step. Answer: {question}"
STEP_TIE = "Think step by step, quickly. Answer: {question}"


def rows(n: int, split: str) -> list[dict[str, Any]]:
    return [{"question": f"{split} question {i}?"} for i in range(n)]


def apo_config(tmp_path: Path, upstream_url: str, **apo: Any) -> ExperimentConfig:
    settings = {"prompt": P0, "rounds": 3, "beam_width": 2, "candidates": 3, "train_batch_size": 2, "val_size": 3}
    return ExperimentConfig(
        name="apo",
        agent=AgentConfig(entrypoint="tests.fixtures.apo:keyword_agent"),
        engine=EngineConfig(
            kind="litellm", model="openai/scripted", base_url=upstream_url, sampling=SamplingConfig(max_tokens=8)
        ),
        runner=RunnerConfig(n_runners=2, timeout_s=60),
        algorithm=AlgorithmConfig(name="apo", apo=ApoConfig(**{**settings, "n_traces": 1, **apo})),
        trainer=TrainerConfig(output_dir=str(tmp_path / "runs")),
        logging=LoggingConfig(plot=False, dashboard=False),
    )


class Recorder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.errors: list[str] = []

    def on_step(self, metrics: dict[str, Any]) -> None:
        self.steps.append(metrics)

    def on_error(self, message: str) -> None:
        self.errors.append(message)


@pytest.mark.slow
def test_the_beam_keeps_the_best_scored_prompt_and_records_every_candidate(tmp_path: Path) -> None:
    from alight.trainer.loops import LoopInput
    from alight.trainer.loops.apo import ApoLoop

    optimizer = ScriptedOptimizer(
        {
            P0: f"<prompt>{STEP}</prompt> <prompt>{TIE}</prompt> <prompt>no placeholder here</prompt>",
            STEP: [BEST, STEP_TIE],  # STEP_TIE ties STEP (0.5): the older STEP stays in the beam
            BEST: "\x00\x01",  # garbage: refused, the parent stays
        }
    )
    recorder = Recorder()
    run_dir = tmp_path / "run"
    with ScriptedOpenAIServer(lambda request: answer("ok"), model=None) as upstream:
        cfg = apo_config(tmp_path, upstream.url)
        run = LoopInput(cfg, run_dir, rows(6, "train"), rows(5, "val"), watchers=[recorder])
        loop = ApoLoop(run, optimizer=optimizer)
        result = loop.run()

    assert (run_dir / "apo" / "best_prompt.txt").read_text() == BEST
    best = json.loads((run_dir / "apo" / "best_prompt.json").read_text())
    assert best["score"] == 1.0 and best["round"] == 2 and best["prompt"] == BEST
    history = [json.loads(line) for line in (run_dir / "apo" / "history.jsonl").read_text().splitlines()]
    by_prompt = {h["prompt"]: h for h in history if h["error"] is None}
    # Every scored prompt scored exactly what its text earns: each rollout ran with its own candidate.
    assert {p: h["score"] for p, h in by_prompt.items()} == {p: prompt_score(p) for p in by_prompt}
    assert set(by_prompt) == {P0, STEP, TIE, BEST, STEP_TIE}
    assert by_prompt[STEP]["parent"] == by_prompt[P0]["id"] and by_prompt[BEST]["parent"] == by_prompt[STEP]["id"]
    assert by_prompt[STEP]["critique"] == f"scripted critique of {P0!r} from 1 traces"
    refused = [h for h in history if h["error"] is not None]
    reasons = sorted(h["error"].split(":")[0] for h in refused)
    # Round 2: P0 (still in the beam) proposes its round-1 edits again; round 3: garbage, then repeats.
    assert reasons == ["already scored"] * 4 + ["holds control characters"] + ["placeholders differ"] * 2
    assert all(h["score"] is None for h in refused)

    # Per round: the best score never drops; a tie (TIE vs P0, 0.0) keeps the older prompt.
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3] == [m["step"] for m in recorder.steps]
    assert [m["apo/best_score"] for m in metrics] == [0.0, 0.5, 1.0, 1.0]
    assert [m["apo/best_prompt"] for m in metrics] == [P0, STEP, BEST, BEST]
    assert [m["apo/candidates_scored"] for m in metrics] == [0, 2, 2, 0]
    assert result.val_reward_start == 0.0 and result.val_reward_end == 1.0 and result.steps == 3
    assert any("refused" in e for e in recorder.errors)

    # The optimiser read the lowest-reward trace of the parent's train batch: the conversation, the reward.
    prompt, traces = optimizer.calls[0]
    assert prompt == P0 and len(traces) == 1
    assert "system: Answer: train question" in traces[0] and "assistant: ok" in traces[0]
    assert traces[0].endswith("reward: 0")
    # The beam of each round, best first: [P0], [STEP, P0] (TIE lost the tie), [BEST, STEP].
    assert [call[0] for call in optimizer.calls] == [P0, STEP, P0, BEST, STEP]


@pytest.mark.slow
def test_fit_runs_apo_with_an_llm_optimiser_from_the_config(tmp_path: Path) -> None:
    """`Trainer.fit` dispatches algorithm apo; the optimiser is an OpenAI-compatible endpoint reached
    through the litellm engine (a second scripted server here: critique, then edits)."""
    from alight.trainer import Trainer

    def optimiser(request: dict[str, Any]) -> dict[str, Any]:
        system = request["messages"][0]["content"]
        if "explain" in system:  # the critique request
            return answer("Ask the agent to reason step by step.")
        return answer(f"Here you go:\n<prompt>{STEP}</prompt>")

    with (
        ScriptedOpenAIServer(lambda request: answer("ok"), model=None) as upstream,
        ScriptedOpenAIServer(optimiser, model=None) as critic,
    ):
        cfg = apo_config(tmp_path, upstream.url, rounds=1, candidates=1)
        cfg.algorithm.apo.optimizer = EngineConfig(kind="litellm", model="openai/critic", base_url=critic.url)
        result = Trainer(cfg, run_dir=tmp_path / "run").fit(None, rows(4, "train"), rows(3, "val"))
        edit_request = critic.requests[-1].body["messages"][-1]["content"]
    assert "Ask the agent to reason step by step." in edit_request and "{question}" in edit_request
    assert (tmp_path / "run" / "apo" / "best_prompt.txt").read_text() == STEP
    assert result.val_reward_start == 0.0 and result.val_reward_end == 0.5
