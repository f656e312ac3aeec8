"""A vLLM server that dies is restarted: on the weights of the last update, with a call in flight
answered (not failed), by the watcher when no call comes, within a budget, and its leftovers killed.

The server is the stand-in `vllm` command (tests/engines/fake_vllm.py), a real process killed with
SIGKILL; its answers name a digest of the weights it serves. The restart policy's arithmetic is
tested on its own first."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alight.engines import vllm_engine
from alight.engines.base import ChatRequest
from alight.engines.vllm_engine import VLLMEngine
from alight.engines.vllm_server import VLLMLauncher
from alight.errors import ConfigError, EngineUnavailableError
from alight.restarts import RestartPolicy, Restarts

MESSAGES = [{"role": "user", "content": "2+3?"}]


def test_the_backoff_doubles_to_its_cap_and_the_budget_counts_the_last_window_only() -> None:
    now = [0.0]
    restarts = Restarts(RestartPolicy(backoff_s=1.0, max_backoff_s=3.0, budget=3, window_s=100.0), clock=lambda: now[0])
    assert [restarts.next_delay() for _ in range(3)] == [1.0, 2.0, 3.0]  # 4 capped at 3
    assert restarts.next_delay() is None and restarts.count == 3  # the budget is spent: not counted
    now[0] = 99.0
    assert restarts.next_delay() is None and restarts.recent == 3
    now[0] = 100.5  # the first three left the window: the backoff starts over
    assert restarts.next_delay() == 1.0 and restarts.count == 4 and restarts.recent == 1
    assert Restarts(RestartPolicy(budget=0)).next_delay() is None
    with pytest.raises(ValueError):
        RestartPolicy(window_s=0)


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    script = Path(__file__).with_name("fake_vllm.py")
    monkeypatch.setattr(vllm_engine, "find_vllm", lambda *a, **k: VLLMLauncher((sys.executable, str(script)), "gpu"))
    yield


def _engine(tiny_dir: Path, tmp_path: Path, **options: object) -> VLLMEngine:
    options = {"restart_backoff_s": 0.05, "watch_interval_s": 0.2, **options}
    return VLLMEngine("tiny", cache_dir=tiny_dir, work_dir=tmp_path, startup_timeout_s=60, **options)  # type: ignore[arg-type]


def _log_count(tmp_path: Path, text: str) -> int:
    return (tmp_path / "vllm.log").read_text().count(text)


async def _wait_for(condition: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


def _kill(engine: VLLMEngine) -> None:
    assert engine._process is not None and engine._process.pid is not None
    os.kill(engine._process.pid, signal.SIGKILL)  # the server alone, as the OOM killer does


pytestmark = pytest.mark.anyio


async def test_a_call_in_flight_when_the_server_dies_is_answered_by_the_restarted_server_on_the_new_weights(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import load_file

    monkeypatch.setenv("FAKE_VLLM_DELAY_S", "2.0")  # each answer takes 2 s: time to kill it mid-call
    engine = _engine(tiny_dir, tmp_path, watch_interval_s=60.0)  # no watcher: the call itself recovers
    request = ChatRequest(model="tiny", messages=MESSAGES)
    await engine.start()
    try:
        original = (await engine.chat(request)).text
        state = {k: v + 1.0 for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
        await engine.update_weights(state, 3)
        updated = (await engine.chat(request)).text
        assert updated != original
        call = asyncio.ensure_future(engine.chat(request))
        await _wait_for(lambda: _log_count(tmp_path, "fake vllm weights: begin") == 3)  # it reached the server
        _kill(engine)
        answer = await asyncio.wait_for(call, 60)
        assert answer.text == updated and answer.weights_version == 3  # the weights of the last update
        assert engine.restarts == 1 and _log_count(tmp_path, "fake vllm serving") == 2
    finally:
        await engine.close()


async def test_the_watcher_restarts_a_dead_server_before_any_call(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = _engine(tiny_dir, tmp_path)
    await engine.start()
    try:
        _kill(engine)
        await _wait_for(lambda: _log_count(tmp_path, "fake vllm serving") == 2)
        await _wait_for(lambda: engine._died() is None and engine._launches == 2)
        assert engine.restarts == 1
        assert (await engine.chat(ChatRequest(model="tiny", messages=MESSAGES))).text.startswith("weights ")
    finally:
        await engine.close()
    assert any("exited with code -9; restarting it" in r.getMessage() for r in caplog.records)


async def test_a_call_made_while_the_server_restarts_waits_for_it(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path
) -> None:
    engine = _engine(tiny_dir, tmp_path, restart_backoff_s=0.5)
    await engine.start()
    try:
        _kill(engine)
        await _wait_for(lambda: engine._recovery is not None and engine._recovery.locked())  # the watcher restarts it
        # answered once the server is back, not after a failed send hangs in connection retries
        answer = await asyncio.wait_for(engine.chat(ChatRequest(model="tiny", messages=MESSAGES)), 30)
        assert answer.text.startswith("weights ") and engine.restarts == 1
    finally:
        await engine.close()


async def test_past_its_budget_a_dying_server_fails_calls_at_once(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path
) -> None:
    engine = _engine(tiny_dir, tmp_path, max_restarts=1, watch_interval_s=60.0)
    request = ChatRequest(model="tiny", messages=MESSAGES)
    await engine.start()
    try:
        _kill(engine)
        await engine.chat(request)  # restarted once: within the budget
        _kill(engine)
        with pytest.raises(EngineUnavailableError, match="restarted 1 times within 600 s already"):
            await engine.chat(request)
        started = time.monotonic()
        with pytest.raises(EngineUnavailableError, match="max_restarts"):
            await engine.chat(request)
        assert time.monotonic() - started < 1.0 and engine.restarts == 1
    finally:
        await engine.close()


async def test_a_server_that_cannot_start_again_is_tried_again_at_the_next_call(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path
) -> None:
    engine = _engine(tiny_dir, tmp_path, watch_interval_s=60.0)
    request = ChatRequest(model="tiny", messages=MESSAGES)
    await engine.start()
    try:
        (tmp_path / "model" / "crash").touch()  # the next start exits with code 3
        _kill(engine)
        with pytest.raises(EngineUnavailableError, match="did not start again"):
            await engine.chat(request)
        (tmp_path / "model" / "crash").unlink()
        assert (await engine.chat(request)).text.startswith("weights ")
        assert engine.restarts == 2
    finally:
        await engine.close()


def test_restart_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="max_restarts"):
        VLLMEngine("tiny", base_url="http://127.0.0.1:1/v1", max_restarts=-1)


async def test_a_temporary_work_dir_loses_its_weight_copies_at_close_and_keeps_the_log(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `work_dir` the engine serves from a temporary folder: left behind, its copies of a
    real model's weights (hundreds of MB a run) would fill /tmp run after run."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    engine = VLLMEngine("tiny", cache_dir=tiny_dir, startup_timeout_s=60)
    await engine.start()
    folder = engine._work_dir
    assert folder is not None and folder.parent == tmp_path and (folder / "model" / "config.json").is_file()
    await engine.close()
    assert not (folder / "model").exists() and (folder / "vllm.log").is_file()
    kept = _engine(tiny_dir, tmp_path / "given")  # a folder the caller names is left as it is
    await kept.start()
    await kept.close()
    assert (tmp_path / "given" / "model" / "config.json").is_file()


async def test_a_server_that_dies_while_restarting_on_new_weights_is_started_again_on_them(
    fake_vllm: None, tiny_dir: Path, tmp_path: Path
) -> None:
    """The CPU build loads new weights by a restart: a server killed while that restart starts
    (the soak's engine kill found it) is started again, within the budget, not a failed run."""
    from safetensors.torch import load_file

    engine = _engine(tiny_dir, tmp_path, reload="restart", watch_interval_s=60.0)
    request = ChatRequest(model="tiny", messages=MESSAGES)
    await engine.start()
    try:
        original = (await engine.chat(request)).text
        (tmp_path / "model" / "crash_once").touch()  # the next start dies (exit code 3)
        state = {k: v + 1.0 for k, v in load_file(str(tiny_dir / "model.safetensors")).items()}
        await engine.update_weights(state, 2)
        answer = await engine.chat(request)
        assert answer.text != original and answer.weights_version == 2 and engine.restarts == 1
        assert _log_count(tmp_path, "fake vllm serving") == 2  # at start, and after the start that died
    finally:
        await engine.close()
