"""The ledger of what each step trained on (`consumed.jsonl`): written with the metrics, cut back
with them on resume, and audited against the store: a rollout trained twice, a succeeded one of a
kept step never trained on, an attempt other than the rollout's last are each found."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alight.config.schema import LoggingConfig
from alight.store import MemoryStore
from alight.trainer.ledger import Audit, audit, read_ledger
from alight.trainer.metrics import MetricsLog
from alight.types import AttemptStatus, Rollout, Task


def test_the_ledger_is_written_with_the_metrics_and_cut_back_with_them(tmp_path: Path) -> None:
    cfg = LoggingConfig(plot=False)
    with MetricsLog(tmp_path, cfg, run_name="r") as log:
        log.log({"step": 0, "reward": 0.0})  # no update at step 0: no ledger line
        for step in (1, 2, 3):
            log.log({"step": step}, [[f"ro-{step}", f"at-{step}"]])
    assert [row["step"] for row in read_ledger(tmp_path)] == [1, 2, 3]
    with MetricsLog(tmp_path, cfg, run_name="r", resume=True) as resumed:
        resumed.truncate_after(1)  # resumed from step 1's checkpoint: steps 2 and 3 are redone
        resumed.log({"step": 2}, [["ro-2", "at-2b"]])
    assert read_ledger(tmp_path) == [
        {"step": 1, "attempts": [["ro-1", "at-1"]]},
        {"step": 2, "attempts": [["ro-2", "at-2b"]]},
    ]
    with MetricsLog(tmp_path, cfg, run_name="r"):  # a new run (not resumed) starts a new ledger
        pass
    assert read_ledger(tmp_path) == []


def test_the_audit_finds_what_was_trained_twice_lost_or_not_the_latest_attempt(tmp_path: Path) -> None:
    async def scenario() -> tuple[Audit, list[str]]:
        store = MemoryStore()
        ids = []
        for step in (1, 1, 1, 2, 3, 1):  # six rollouts; ids[4] of step 3, past the ledger's steps
            [rollout] = await store.enqueue([Rollout(task=Task(input="x"), max_attempts=2, metadata={"step": step})])
            ids.append(rollout.rollout_id)
        attempts = {}
        for _ in ids:
            claim = await store.dequeue("w")
            assert claim is not None
            attempts[claim.rollout.rollout_id] = [claim.attempt.attempt_id]
        first_of_retried = attempts[ids[2]][0]
        await store.finish_attempt(first_of_retried, AttemptStatus.FAILED)  # retried: a second attempt
        claim = await store.dequeue("w")
        assert claim is not None and claim.rollout.rollout_id == ids[2]
        attempts[ids[2]].append(claim.attempt.attempt_id)
        for held in attempts.values():
            await store.finish_attempt(held[-1], AttemptStatus.SUCCEEDED, reward=1.0)
        with MetricsLog(tmp_path, LoggingConfig(plot=False), run_name="r") as log:
            log.log({"step": 1}, [[ids[0], attempts[ids[0]][0]], [ids[2], first_of_retried]])
            log.log({"step": 2}, [[ids[0], attempts[ids[0]][0]], [ids[3], attempts[ids[3]][0]]], [ids[5]])
        return await audit(store, tmp_path), ids

    found, ids = asyncio.run(scenario())
    assert not found.clean and (found.steps, found.consumed) == (2, 4)
    assert found.twice == [ids[0]]  # in steps 1 and 2
    assert found.lost == [ids[1]]  # of step 1, succeeded, never trained on
    assert found.not_latest == [ids[2]]  # trained on its failed first attempt
    assert found.unconsumed == [ids[4]]  # of step 3: the ledger ends at step 2
    assert found.set_aside == 1  # ids[5]: left out on purpose (stale), so not lost
