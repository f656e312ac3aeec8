"""The asynchronous RL loop (`trainer.mode: async`): runners never wait for the update.

Groups are fed to the runners continuously within the staleness bound (`alight.trainer.loops.feeder`);
each step takes `batch_size` complete groups as soon as they are there, adapts them, and updates
while the next groups run; the engine then switches to the new weights between calls (calls in
flight finish on the weights they started with; every LLM span records the version that served
it). Rows served by older weights than those being updated are marked stale: the backend trains
them with decoupled PPO and a truncated importance weight (`algorithm.is_cap`).

`max_staleness: 0` is the synchronous algorithm: one batch outstanding at a time, every row fresh.

Resuming: the checkpoint holds the feeder's state (batches drawn, groups outstanding, totals);
groups enqueued after it are reused when their batch comes again (none is enqueued twice, none
trained twice in the resumed run's lineage); attempts in flight when the run died are run again
by the store, counted (`async/resume_in_flight`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.trainer.ledger import SET_ASIDE
from alight.trainer.loops import LoopInput, LoopKind
from alight.trainer.loops.common import (
    adapt,
    drive_steps,
    execute,
    rl_parts,
    start_stack,
    step_info,
    train_metrics,
    update_and_serve,
)
from alight.trainer.loops.feeder import Feeder, Group
from alight.trainer.result import FitResult
from alight.trainer.rollouts import StepRollouts
from alight.trainer.validation import Schedule

if TYPE_CHECKING:
    from alight.algorithms.lightning import LightningRL
    from alight.trainer.session import RunSession
    from alight.trainer.stack import LocalStack

logger = logging.getLogger(__name__)

STATE_KEY = "async"  # the feeder's state in a checkpoint's trainer state


class AsyncRLLoop(LoopKind):
    """One asynchronous RL run in `run_dir` (see the module docstring); `run()` does all of it."""

    def __init__(self, run: LoopInput) -> None:
        self.cfg = run.cfg
        self.train_rows = run.train_rows
        self.session, self.policy, self.validator, self.total_steps = rl_parts(run)
        self.began = time.time()  # attempts claimed before and live then were in flight when a resumed run died

    def run(self) -> FitResult:
        session = self.session
        with session:
            checkpoint = session.resume_point() if session.resume else None
            info = step_info(session, self.total_steps)
            info.update(mode="async", max_staleness=self.cfg.trainer.max_staleness)
            session.announce(info)
            return execute(session, self.policy, lambda: self._train(checkpoint))

    def _train(self, checkpoint: tuple[Path, dict[str, Any], Any] | None) -> None:
        served = self.policy.prepare(checkpoint)
        state = checkpoint[1].get(STATE_KEY) if checkpoint is not None else None
        with start_stack(self.session, str(served), weights_version=self.session.progress.step) as stack:
            schedule = Schedule(self.cfg.trainer, self.total_steps)
            self.session.run_async(self._steps(stack, schedule, state))

    async def _steps(self, stack: LocalStack, schedule: Schedule, state: dict[str, Any] | None) -> None:
        from alight.algorithms.lightning import LightningRL

        cfg = self.cfg
        rl = LightningRL.from_config(cfg.adapter, cfg.algorithm, tokenizer=self.policy.tokenizer)
        steps = FedSteps(self, rl, state)
        await drive_steps(self.session, self.policy, stack, self.validator, schedule, steps)

    async def _step(self, rollouts: StepRollouts, feeder: Feeder, rl: LightningRL, step: int) -> dict[str, Any]:
        t = self.cfg.trainer
        started, wall_started = time.monotonic(), time.time()
        version = step - 1  # the weights being updated
        before = dict(feeder.counts)
        groups = await feeder.take(version, t.step_timeout_s, t.min_batch_fraction)
        wait_s = time.monotonic() - started
        logger.info("step %d trains groups %s", step, " ".join(f"{g.gid}@{g.staleness}" for g in groups))

        ended = await rollouts.store.list_rollouts(ids=[i for g in groups for i in g.ids])
        batch, stats, adapt_s = await adapt(rollouts, rl, self.policy, ended)
        if batch is not None:  # rows served by older weights: decoupled PPO against the proximal policy
            batch.mark_stale({i for g in groups if g.staleness > 0 for i in g.ids})

        update, update_s = await update_and_serve(rollouts, self.session, self.policy, batch, step)
        step_s = time.monotonic() - started
        timings = {"rollout_s": wait_s, "adapt_s": adapt_s, "update_s": update_s, "generation_s": step_s}
        busy = [r.rollout_id for r in ended] + [i for g in feeder.outstanding.values() for i in g.ids]
        metrics = await train_metrics(rollouts, step, ended, batch, update, timings, busy=busy, since=wall_started)
        metrics["epoch"] = round(feeder.sampler.epoch, 3)
        metrics.update(self._staleness(groups, feeder, before))
        metrics[SET_ASIDE], feeder.set_aside = feeder.set_aside, []  # to the ledger: stale, not trained on
        if stats is not None:
            metrics["adapter/truncated"] = stats.prompts_truncated + stats.responses_truncated
        metrics["timing/step_s"] = time.monotonic() - started
        progress = self.session.progress  # moved together: any checkpoint from here on resumes here
        progress.step, progress.position = step, feeder.sampler.position
        progress.extra[STATE_KEY] = feeder.state()
        return metrics

    def _staleness(self, groups: list[Group], feeder: Feeder, before: dict[str, int]) -> dict[str, Any]:
        """The staleness histogram of the groups trained, and the dropped/requeued groups (this
        step's and the run's totals)."""
        counts = feeder.counts
        out: dict[str, Any] = {
            f"async/staleness_{k}": sum(1 for g in groups if g.staleness == k) for k in range(feeder.max_staleness + 1)
        }
        out["async/staleness_mean"] = sum(g.staleness for g in groups) / len(groups) if groups else 0.0
        out["async/groups"] = len(groups)
        out["async/outstanding_groups"] = len(feeder.outstanding)
        for key in ("dropped", "requeued", "resume_in_flight"):
            out[f"async/{key}"] = counts.get(key, 0) - before.get(key, 0)
            out[f"async/{key}_total"] = counts.get(key, 0)
        return out


class FedSteps:
    """The async loop's plan in `drive_steps`: the feeder is made (from the checkpoint's feeder
    `state`) and resumed before step 0, topped up before each step, and closed after the last."""

    def __init__(self, loop: AsyncRLLoop, rl: LightningRL, state: dict[str, Any] | None) -> None:
        self.step_zero = loop.policy.warm_start_metrics
        self.loop, self.rl, self.state = loop, rl, state
        self.feeder: Feeder | None = None

    async def start(self, rollouts: StepRollouts, session: RunSession) -> None:
        from alight.trainer.sampler import TaskSampler

        t, state, progress = self.loop.cfg.trainer, self.state, session.progress
        # each batch drew batch_size rows: the feeder's state says where the sampler stands
        position = int(state["batches"]) * t.batch_size if state else progress.position
        sampler = TaskSampler(len(self.loop.train_rows), t.batch_size, t.seed, position)
        feeder = self.feeder = Feeder(
            rollouts,
            self.loop.train_rows,
            sampler,
            batch_size=t.batch_size,
            group_size=t.group_size,
            max_staleness=t.max_staleness,
            on_stale=t.on_stale,
            state=state,
        )
        if session.resume:
            await rollouts.resume_after(progress.step, ("val",))  # the feeder finds the train groups
            await feeder.resume(self.loop.began)

    async def step(self, rollouts: StepRollouts, step: int) -> dict[str, Any]:
        """Step `step` on the feeder's next complete groups, once it has made room under the bound."""
        assert self.feeder is not None
        await self.feeder.top_up()  # the new version made room under the bound
        return await self.loop._step(rollouts, self.feeder, self.rl, step)

    async def end(self, rollouts: StepRollouts) -> None:
        assert self.feeder is not None
        await self.feeder.close()
