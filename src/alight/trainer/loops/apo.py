"""The APO run (`algorithm.name: apo`): the policy is prepared as for RL (the tiny model built, the
warm start when configured), then no weight ever changes: the search (`alight.algorithms.apo`)
rewrites the prompt agents read as a `PromptTemplate` resource.

Each prompt scored is published as its own resource set (the `llm` resource plus the prompt) and
its rollouts are pinned to that version, so the candidates of a round run together through the same
runners without seeing each other's prompt. Validation rollouts are greedy (`trainer.val_temperature`)
on the first `algorithm.apo.val_size` validation rows; train batches sample as the engine is set.
A prompt's score is the mean reward of all its rollouts, a failed or unfinished one counting 0.
The run directory gets `apo/best_prompt.txt`, `apo/best_prompt.json` and `apo/history.jsonl`
(updated every round) and one `metrics.jsonl` line per round (round 0: the initial prompt).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from alight.algorithms.apo import (
    Chat,
    LLMOptimizer,
    Optimizer,
    PromptSearch,
    RoundReport,
    Scored,
    append_history,
    read_traces,
    save_best,
)
from alight.algorithms.apo.checks import search_settings
from alight.config.schema import EngineConfig, ExperimentConfig
from alight.engines.factory import engine_class
from alight.errors import ConfigError, TrainingError
from alight.trainer import checkpoint as ckpt
from alight.trainer.loops import LoopInput, LoopKind
from alight.trainer.loops.common import execute, start_stack
from alight.trainer.policy import Policy
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.sampler import TaskSampler
from alight.trainer.session import RunSession
from alight.trainer.stack import LocalStack
from alight.types import PromptTemplate, Rollout

if TYPE_CHECKING:
    from alight.engines import Engine

logger = logging.getLogger(__name__)

POLICY = "policy"  # algorithm.apo.optimizer.model: the policy's own (warm-started) model as the optimiser


def score_prompts(ids_of: Sequence[Sequence[str]], ended: Sequence[Rollout]) -> list[Scored]:
    """Each prompt's score from its rollouts (`ids_of[i]`: prompt i's): the mean reward over all of
    them, a failed, timed-out or unfinished rollout counting 0 (not skipped: a prompt whose agent
    crashes half the time scores half)."""
    by_id = {r.rollout_id: r for r in ended}
    results = []
    for ids in ids_of:
        rewards = {
            rid: (by_id[rid].reward if rid in by_id and by_id[rid].status.value == "succeeded" else None) for rid in ids
        }
        results.append(Scored(statistics.fmean((r or 0.0) for r in rewards.values()), rewards))
    return results


class ApoLoop(LoopKind):
    """One APO run in `run_dir`; `run()` does all of it. `optimizer` replaces the configured
    optimiser LLM (`algorithm.apo.optimizer`), e.g. a scripted one in tests."""

    trains_weights = False  # prompts change, weights do not (a backend only for a warm start)

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        from alight.algorithms.apo.checks import check_apo
        from alight.backends.factory import check_backend

        check_apo(cfg.algorithm.apo)
        if engine_class(cfg.engine.kind).capabilities.trainable and cfg.warm_start.steps > 0 and cfg.warm_start.data:
            check_backend(cfg)

    def __init__(self, run: LoopInput, *, optimizer: Optimizer | None = None) -> None:
        cfg, apo, val_rows = run.cfg, run.cfg.algorithm.apo, run.val_rows
        if run.resume:
            raise ConfigError("--resume: an APO run does not resume; start a new one (its best prompt is in apo/)")
        if not val_rows:
            raise ConfigError("algorithm apo scores prompts on validation tasks: set data.val")
        self.cfg = cfg
        self.apo = apo
        self.settings = search_settings(apo)
        self.train_rows = run.train_rows
        self.val_rows = val_rows[: apo.val_size]
        self.session = RunSession(cfg, run.run_dir, watchers=run.watchers)
        self.policy = Policy(cfg, self.session)
        self._engine = engine_class(cfg.engine.kind)
        self.optimizer = optimizer
        self.optimizer_engine: Engine | None = None
        if optimizer is None:  # bad optimiser options fail here, before anything starts
            self.optimizer_engine = _make_engine(apo.optimizer)
        self.served_model = cfg.engine.model
        self.round_started = time.monotonic()

    def run(self) -> FitResult:
        cfg, apo = self.cfg, self.apo
        with self.session as session:
            session.announce(
                {
                    "total_steps": apo.rounds,
                    "algorithm": "apo",
                    "model": cfg.engine.model,
                    "optimizer": f"{apo.optimizer.kind}:{apo.optimizer.model}" if self.optimizer is None else "custom",
                    "n_runners": cfg.runner.n_runners,
                    "batch_size": apo.train_batch_size,
                    "group_size": 1,
                    "val_size": len(self.val_rows),
                    "beam_width": apo.beam_width,
                    "warm_start_steps": cfg.warm_start.steps if self._warm_starts() else 0,
                }
            )
            return execute(session, self.policy, self._search_prompts)

    # -- the policy: prepared once, never updated ---------------------------------------------------
    def _warm_starts(self) -> bool:
        return self._engine.capabilities.trainable and self.policy.warm_starts()

    def _served(self) -> str:
        """The model the engine serves: warm-started (the backend trains it, then is closed), the
        tiny model, or the configured model as it is (any engine kind: APO updates no weight)."""
        cfg = self.cfg
        if self._warm_starts():
            served = self.policy.prepare()
            self.policy.close()  # its memory is the engine's now
            return str(served)
        ckpt.seed_everything(cfg.trainer.seed)
        if self._engine.loads_model(cfg.engine):  # resolved once, as the run's starting weights
            return str(self.policy.base_model())
        return cfg.engine.model

    # -- the search -----------------------------------------------------------------------------------
    def _search_prompts(self) -> None:
        self.served_model = self._served()
        initial = {self.apo.resource: PromptTemplate(template=self.apo.prompt)}
        with start_stack(self.session, self.served_model, weights_version=0, extra_resources=initial) as stack:
            self.session.run_async(self._search(stack))

    async def _search(self, stack: LocalStack) -> None:
        store = stack.trainer_store()
        try:
            rollouts = StepRollouts(store, stack, self.cfg, self.session.events)
            sampler = TaskSampler(len(self.train_rows), self.apo.train_batch_size, self.cfg.trainer.seed, 0)
            optimizer = self.optimizer or LLMOptimizer(await self._optimizer_chat())

            async def evaluate(prompts: Sequence[str], round_: int, split: str) -> list[Scored]:
                return await self._evaluate(stack, rollouts, sampler, prompts, round_, split)

            async def traces(rewards: Mapping[str, float | None]) -> list[str]:
                await rollouts.flush()
                return await read_traces(store, rewards, self.apo.trace_chars)

            self.round_started = time.monotonic()
            search = PromptSearch(self.settings, optimizer, evaluate, traces, on_round=self._on_round)
            best = await search.run(self.apo.prompt)
            logger.info("APO: best prompt (id %d, round %d) scores %.4f", best.id, best.round, best.score or 0.0)
        finally:
            if self.optimizer_engine is not None:
                await self.optimizer_engine.close()
            await store.close()

    async def _optimizer_chat(self) -> Chat:
        from alight.engines.base import ChatRequest, SamplingParams

        spec = self.apo.optimizer
        assert self.optimizer_engine is not None  # made in __init__: no optimiser was handed in
        if spec.model == POLICY:  # the model the policy engine serves (after the warm start), loaded again
            await self.optimizer_engine.close()
            self.optimizer_engine = _make_engine(dataclasses.replace(spec, model=self.served_model))
        engine = self.optimizer_engine
        self.session.events.on_stage("loading the optimiser", 0, 1)
        await engine.start()
        calls = itertools.count()

        async def chat(messages: list[dict[str, str]]) -> str:
            sampling = SamplingParams(
                temperature=spec.sampling.temperature,
                top_p=spec.sampling.top_p,
                max_tokens=spec.sampling.max_tokens,
                seed=self.cfg.trainer.seed * 1_000_003 + next(calls),  # seeded run, a fresh draw per call
                logprobs=False,
            )
            request = ChatRequest(model=engine.model_names[0], messages=messages, sampling=sampling)
            generation = await engine.chat(request)
            return str(generation.message.get("content") or "")

        return chat

    async def _evaluate(
        self,
        stack: LocalStack,
        rollouts: StepRollouts,
        sampler: TaskSampler,
        prompts: Sequence[str],
        round_: int,
        split: str,
    ) -> list[Scored]:
        """Each prompt on the split's tasks (val: the validation rows; train: a fresh batch per
        prompt), all at once, each prompt's rollouts pinned to its own resource set."""
        from alight.data import task_input

        t, field = self.cfg.trainer, self.cfg.data.input_field
        sampling = {"temperature": t.val_temperature} if split == "val" else None
        ids_of: list[list[str]] = []
        for index, prompt in enumerate(prompts):
            resources = {**stack.resources(), self.apo.resource: PromptTemplate(template=prompt)}
            version = (await rollouts.store.add_resources(resources)).version
            if split == "val":
                rows, tasks = list(range(len(self.val_rows))), [task_input(r, field) for r in self.val_rows]
            else:
                rows = sampler.next_batch()
                tasks = [task_input(self.train_rows[i], field) for i in rows]
            meta = {"apo_prompt": index, "resources_version": version}
            ids_of.append(
                await rollouts.enqueue(
                    round_, split, tasks, rows, 1, sampling=sampling, resources_version=version, metadata=meta
                )
            )
        every = [rid for ids in ids_of for rid in ids]
        try:
            ended = await rollouts.wait(round_, every, t.step_timeout_s, t.min_batch_fraction)
        finally:
            rollouts.set_sampling(every, None)
        await rollouts.summarise(ended, split)  # reports failed rollouts' errors to the watchers
        if not any(r.status.value == "succeeded" for r in ended):
            raise TrainingError(
                f"round {round_}: every {split} rollout failed; see {self.session.run_dir / 'train.log'}"
            )
        return score_prompts(ids_of, ended)

    def _on_round(self, report: RoundReport) -> None:
        best = report.best
        scored = [c for c in report.candidates if c.score is not None]
        refused = [c for c in report.candidates if c.error is not None]
        run_dir = self.session.run_dir
        append_history(run_dir, report.candidates)
        save_best(run_dir, best)
        if refused:
            example = refused[0].error
            self.session.events.on_error(
                f"round {report.round}: {len(refused)} of {len(report.candidates)} candidates refused ({example})"
            )
        now = time.monotonic()
        metrics: dict[str, Any] = {
            "step": report.round,
            "val/reward_mean": best.score,
            "apo/best_score": best.score,
            "apo/round_best_score": max((c.score for c in scored if c.score is not None), default=None),
            "apo/candidates_scored": len(scored) if report.round else 0,
            "apo/candidates_refused": len(refused),
            "apo/beam_size": len(report.beam),
            "apo/best_id": best.id,
            "apo/best_round": best.round,
            "apo/best_prompt": best.prompt,
            "timing/round_s": now - self.round_started,
        }
        if report.train_score is not None:
            metrics["train/reward_mean"] = report.train_score
        if report.round == 0:
            metrics.update(self.policy.warm_start_metrics)  # its loss and time, as RL's step 0 logs them
        self.round_started = now
        self.session.progress.step = report.round
        self.session.record(metrics)


def _make_engine(spec: EngineConfig) -> Engine:
    from alight.engines.factory import engine_options, make_engine

    return make_engine(spec.kind, **engine_options(spec))
