"""SQLite-only guarantees: several processes on one file, durability after SIGKILL, crash recovery."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from alight.errors import StoreError
from alight.store.sqlite import SqliteStore
from alight.types import AttemptStatus, Rollout, RolloutStatus, Span, Task

pytestmark = pytest.mark.anyio

# A worker process: says "ready", waits for "go" on stdin (so all workers contend at once), then
# claims rollouts from the shared file until the queue is empty, finishes each, and prints
# "rollout_id attempt_id" for every claim.
_DEQUEUE_WORKER = textwrap.dedent(
    """
    import asyncio, sys
    from alight.store.sqlite import SqliteStore
    from alight.types import AttemptStatus, Span

    async def main() -> None:
        store = SqliteStore(sys.argv[1])
        print("ready", flush=True)
        sys.stdin.readline()
        while (claim := await store.dequeue(sys.argv[2])) is not None:
            await store.start_attempt(claim.attempt.attempt_id)
            rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id
            await store.add_spans([Span(rollout_id=rid, attempt_id=aid, name="s") for _ in range(5)])
            await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
            print(claim.rollout.rollout_id, claim.attempt.attempt_id, flush=True)
        await store.close()

    asyncio.run(main())
    """
)


async def test_concurrent_dequeues_from_several_processes(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with SqliteStore(db) as store:
        queued = await store.enqueue([Rollout(task=Task(input=i)) for i in range(600)])
        workers = [
            subprocess.Popen(
                [sys.executable, "-c", _DEQUEUE_WORKER, str(db), f"worker-{i}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [w.communicate(timeout=120)[0] for w in workers]
        assert [w.returncode for w in workers] == [0, 0, 0, 0]
        claims = [line.split() for out in outputs for line in out.splitlines()]
        assert len(claims) == 600
        assert {rid for rid, _ in claims} == {r.rollout_id for r in queued}
        assert len({aid for _, aid in claims}) == 600
        counts = await store.count_by_status()
        assert counts[RolloutStatus.SUCCEEDED] == 600
        # More than one process did real work (the test is about concurrency, not one fast worker).
        assert sum(1 for out in outputs if out.strip()) >= 2


# A writer that prints an acknowledgement line after each operation returns (i.e. committed):
#   E rollout_id | C rollout_id attempt_id | S attempt_id span_id... | F rollout_id
_KILLED_WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from alight.store.sqlite import SqliteStore
    from alight.types import AttemptStatus, Rollout, Span, Task

    async def main() -> None:
        store = SqliteStore(sys.argv[1])
        i = 0
        while True:
            [r] = await store.enqueue([Rollout(task=Task(input=i), max_attempts=1)])
            print("E", r.rollout_id, flush=True)
            claim = await store.dequeue("w")
            await store.start_attempt(claim.attempt.attempt_id)
            print("C", claim.rollout.rollout_id, claim.attempt.attempt_id, flush=True)
            spans = [Span(rollout_id=r.rollout_id, attempt_id=claim.attempt.attempt_id, name=f"s{k}") for k in range(5)]
            await store.add_spans(spans)
            print("S", claim.attempt.attempt_id, *[s.span_id for s in spans], flush=True)
            if i % 2 == 0:
                await store.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=float(i))
                print("F", r.rollout_id, flush=True)
            i += 1

    asyncio.run(main())
    """
)


async def test_acknowledged_writes_survive_sigkill_and_live_attempts_are_requeued(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    writer = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout is not None
    acks: list[list[str]] = []
    while len(acks) < 400:
        line = writer.stdout.readline()
        assert line, "the writer stopped before it was killed"
        acks.append(line.split())
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=10)
    # Acknowledged before the kill; the kill may cut the last line short, and a cut line is no ack.
    *complete, _partial = writer.stdout.read().split("\n")
    acks += [line.split() for line in complete]

    enqueued = [a[1] for a in acks if a[0] == "E"]
    claimed = {a[1]: a[2] for a in acks if a[0] == "C"}
    spans = {a[1]: set(a[2:]) for a in acks if a[0] == "S"}
    finished = {a[1] for a in acks if a[0] == "F"}
    async with SqliteStore(db) as store:
        stored = {r.rollout_id: r for r in await store.list_rollouts()}
        assert set(enqueued) <= set(stored)
        for rollout_id in enqueued:
            rollout = stored[rollout_id]
            attempts = await store.list_attempts(rollout_id)
            if rollout_id in finished:
                assert rollout.status is RolloutStatus.SUCCEEDED
                continue
            # Unfinished at the kill: the live attempt is recovered as timed out, the rollout requeued.
            assert rollout.status is RolloutStatus.QUEUING
            if rollout_id in claimed:
                assert [a.attempt_id for a in attempts] == [claimed[rollout_id]]
                assert attempts[0].status is AttemptStatus.TIMEOUT
        for attempt_id, span_ids in spans.items():
            rollout_id = next(r for r, a in claimed.items() if a == attempt_id)
            got = {s.span_id for s in await store.query_spans(rollout_id, attempt_id)}
            assert span_ids <= got
        # The requeued rollouts can run again.
        claim = await store.dequeue("after-restart")
        assert claim is not None and claim.rollout.status is RolloutStatus.RUNNING
    assert len(finished) >= 50


async def test_a_second_live_process_does_not_recover_the_first_ones_attempts(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with SqliteStore(db) as first:
        await first.enqueue([Rollout(task=Task(input=1))])
        claim = await first.dequeue("w")
        assert claim is not None
        async with SqliteStore(db) as second:
            attempt = (await second.list_attempts(claim.rollout.rollout_id))[0]
            assert attempt.status is AttemptStatus.PREPARING
        await first.start_attempt(claim.attempt.attempt_id)
    # Every user closed cleanly with an attempt still live: the next opener recovers it.
    async with SqliteStore(db) as reopened:
        [attempt] = await reopened.list_attempts(claim.rollout.rollout_id)
        assert attempt.status is AttemptStatus.TIMEOUT and "store's process stopped" in (attempt.error or "")
        assert (await reopened.get_rollout(claim.rollout.rollout_id)).status is RolloutStatus.QUEUING


async def test_spans_from_two_processes_get_distinct_sequence_ids(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with SqliteStore(db) as one, SqliteStore(db) as two:
        await one.enqueue([Rollout(task=Task(input=1))])
        claim = await one.dequeue("w")
        assert claim is not None
        rid, aid = claim.rollout.rollout_id, claim.attempt.attempt_id

        async def write(store: SqliteStore, tag: str) -> None:
            for k in range(20):
                await store.add_spans([Span(rollout_id=rid, attempt_id=aid, name=f"{tag}{k}")])
                await asyncio.sleep(0)

        await asyncio.gather(write(one, "a"), write(two, "b"))
        seqs = [s.sequence_id for s in await one.query_spans(rid)]
        assert seqs == list(range(1, 41))


async def test_opening_a_store_of_another_schema_version_fails_in_one_line(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    async with SqliteStore(db):
        pass
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(StoreError, match="schema version 99") as err:
        SqliteStore(db)
    assert "\n" not in str(err.value)


def test_an_unopenable_path_fails_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot open store") as err:
        SqliteStore(blocker / "store.db")
    assert "\n" not in str(err.value)


def test_a_file_that_is_not_a_database_fails_in_one_line(tmp_path: Path) -> None:
    bogus = tmp_path / "store.db"
    bogus.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="cannot open store") as err:
        SqliteStore(bogus)
    assert "\n" not in str(err.value)
