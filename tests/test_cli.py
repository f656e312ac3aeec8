"""The `alight` command: help, version, and `alight store` as a real subprocess."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from alight.store.client import StoreClient
from alight.store.wire import IDEMPOTENCY_HEADER
from alight.types import AttemptStatus, Rollout, RolloutStatus, Span, Task

ALIGHT = [sys.executable, "-m", "alight"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"alight store exited early: {proc.communicate()[1]}"
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError(f"no store server at {url}")


@contextmanager
def store_server(*args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    port = free_port()
    proc = subprocess.Popen(
        [*ALIGHT, "store", "--port", str(port), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def test_help_and_version() -> None:
    result = subprocess.run([*ALIGHT, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "store" in result.stdout
    version = subprocess.run([*ALIGHT, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("alight ")


@pytest.mark.parametrize("command", [[], ["store"], ["serve"], ["dev"], ["train"], ["trace"], ["runner"], ["eval"]])
def test_help_shows_flags_as_flags(command: list[str]) -> None:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    result = subprocess.run([*ALIGHT, *command, "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout
    assert "--help " in result.stdout


def test_each_command_has_a_one_line_summary() -> None:
    # The first paragraph of a command's docstring is its line in `alight --help`: a line break
    # inside it shows there as a stray break.
    from alight.cli.app import app

    for command in app.registered_commands:
        doc = command.callback.__doc__ if command.callback else None
        assert doc, command.callback
        assert "\n" not in doc.strip().split("\n\n")[0], command.callback


def test_store_serves_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    with store_server("--db", str(db)) as (url, proc):

        async def use() -> str:
            async with StoreClient(url) as client:
                [rollout] = await client.enqueue([Rollout(task=Task(input={"q": 1}))])
                claim = await client.dequeue("w")
                assert claim is not None
                await client.add_spans(
                    [Span(rollout_id=rollout.rollout_id, attempt_id=claim.attempt.attempt_id, name="s")]
                )
                await client.finish_attempt(claim.attempt.attempt_id, AttemptStatus.SUCCEEDED, reward=1.0)
                return rollout.rollout_id

        import asyncio

        rollout_id = asyncio.run(use())
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        # about 1 run in 20 under load has ended with -2 (KeyboardInterrupt escaping): keep what it said
        assert code == 0, f"exit code {code}; stderr: {proc.stderr.read()[-3000:] if proc.stderr else ''}"
    # Everything it acknowledged is in the file.
    with store_server("--db", str(db)) as (url, _):

        async def check() -> None:
            async with StoreClient(url) as client:
                rollout = await client.get_rollout(rollout_id)
                assert rollout.status is RolloutStatus.SUCCEEDED and rollout.reward == 1.0
                assert len(await client.query_spans(rollout_id)) == 1

        asyncio.run(check())


def test_store_server_killed_and_restarted_recovers_live_attempts(tmp_path: Path) -> None:
    import asyncio

    db = tmp_path / "store.db"
    with store_server("--db", str(db)) as (url, proc):

        async def claim_two() -> list[str]:
            async with StoreClient(url) as client:
                queued = await client.enqueue([Rollout(task=Task(input=i)) for i in range(3)])
                for _ in range(2):
                    claim = await client.dequeue("w")
                    assert claim is not None
                    await client.start_attempt(claim.attempt.attempt_id)
                return [r.rollout_id for r in queued]

        ids = asyncio.run(claim_two())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    with store_server("--db", str(db)) as (url, _):

        async def check() -> None:
            async with StoreClient(url) as client:
                rollouts = await client.list_rollouts(ids=ids)
                assert [r.status for r in rollouts] == [RolloutStatus.QUEUING] * 3
                for rid in ids[:2]:
                    [attempt] = await client.list_attempts(rid)
                    assert attempt.status is AttemptStatus.TIMEOUT

        asyncio.run(check())


def test_store_on_a_busy_port_fails_in_one_line_with_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([*ALIGHT, "store", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["store", "--port", "0"], "Invalid value"),
        (["store", "--port", "notaport"], "Invalid value"),
        (["no-such-command"], "No such command"),
    ],
)
def test_bad_arguments_exit_2(args: list[str], expected: str) -> None:
    result = subprocess.run([*ALIGHT, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert expected in result.stderr


def test_store_with_an_unusable_db_path_fails_in_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = subprocess.run(
        [*ALIGHT, "store", "--port", str(free_port()), "--db", str(blocker / "store.db")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: cannot open store")
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("flag", "value", "expected"),
    [
        ("--max-wait", "0", "the store's max wait must be a finite number of seconds > 0, got 0.0"),
        ("--max-wait", "nan", "the store's max wait must be a finite number of seconds > 0, got nan"),
        ("--write-id-retention", "-1", "write-id retention must be a finite number of seconds > 0, got -1.0"),
        ("--write-id-retention", "inf", "write-id retention must be a finite number of seconds > 0, got inf"),
        ("--max-write-ids", "0", "max write ids must be a whole number >= 1, got 0"),
    ],
)
def test_store_limit_flags_refuse_bad_values_in_one_line(tmp_path: Path, flag: str, value: str, expected: str) -> None:
    db = tmp_path / "store.db"
    command = [*ALIGHT, "store", "--port", str(free_port()), "--db", str(db), flag, value]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip()) == (2, f"error: {expected}")
    assert not db.exists()  # refused before the store file is made


def test_store_limit_flags_reach_the_server_and_the_store(tmp_path: Path) -> None:
    """--max-wait cuts a long /store/wait; --max-write-ids 1 keeps only the newest write id, so an
    older write retried after a restart is applied again (with the default, it is answered)."""
    db = tmp_path / "store.db"
    body = {"resources": {"llm": {"type": "llm", "endpoint": "http://127.0.0.1:9/v1", "model": "m"}}}

    def publish(url: str, key: str) -> int:
        answer = httpx.post(f"{url}/store/resources", json=body, headers={IDEMPOTENCY_HEADER: key}, timeout=10)
        assert answer.status_code == 200, answer.text
        return int(answer.json()["version"])

    with store_server("--db", str(db), "--max-wait", "0.5", "--max-write-ids", "1") as (url, _):
        queued = Rollout(task=Task(input=1)).model_dump(mode="json")
        assert httpx.post(f"{url}/store/enqueue", json={"rollouts": [queued]}, timeout=10).status_code == 200
        started = time.monotonic()
        waited = httpx.post(
            f"{url}/store/wait", json={"rollout_ids": [queued["rollout_id"]], "timeout": 60}, timeout=30
        )
        assert waited.json() == [] and time.monotonic() - started < 10
        assert (publish(url, "rq-a"), publish(url, "rq-b")) == (1, 2)
    with store_server("--db", str(db), "--max-write-ids", "1") as (url, _):  # the store prunes on open
        assert publish(url, "rq-b") == 2  # the newest id is kept: answered, not applied
        assert publish(url, "rq-a") == 3  # the older one was dropped: applied again
