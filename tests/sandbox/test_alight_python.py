"""`python` as a command's program is the interpreter running alight: a command agent and a tests
reward run with a PATH that holds no python at all (no activated venv) and get this venv's own
interpreter, in every kind but docker; another interpreter named in the config is left as it is; a
program that cannot start gets one line naming it and the PATH it was looked up on."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from alight.command_agent import CommandAgent
from alight.config import schema
from alight.config.schema import SandboxConfig
from alight.rewards.tests import reward_from_tests
from alight.sandbox.base import SandboxError, with_alight_python
from alight.sandbox.docker import DockerSandbox
from alight.sandbox.factory import open_sandbox, sandbox_environment
from alight.sandbox.local import check_local
from alight.sandbox.process import run_process
from alight.store import MemoryStore
from alight.types import RolloutStatus
from tests.runner.test_command_agent import run_one

#: The folder of the interpreter running alight: first on a command's PATH.
VENV_BIN = os.path.dirname(sys.executable)
#: Exits 0 with the reward 1 only when it runs on this test's own interpreter, with its venv.
WHICH_PYTHON = (
    "import sys\n"
    "seen = (sys.executable, sys.prefix)\n"
    "if seen != (sys.argv[1], sys.argv[2]):\n"
    "    sys.exit(f'ran on {seen}')\n"
    "print(1)\n"
)
#: The same check as a test for pytest, run by a tests reward.
WHICH_PYTHON_TEST = (
    f"import sys\n\ndef test_python():\n    assert (sys.executable, sys.prefix) == {(sys.executable, sys.prefix)!r}\n"
)


def _no_python_on_path(kind: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind == "local":
        check_local()  # cached: it looks up unshare on the real PATH
    monkeypatch.setenv("PATH", "/nonexistent")


@pytest.mark.anyio
@pytest.mark.parametrize("kind", [None, "none", "local"])
@pytest.mark.parametrize("as_text", [False, True])
async def test_a_command_agent_runs_python_without_python_on_path(
    kind: str | None, as_text: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "which_python.py"
    script.write_text(WHICH_PYTHON)
    _no_python_on_path(kind, monkeypatch)
    argv = ["python", str(script), sys.executable, sys.prefix]
    sandbox = SandboxConfig(kind=kind) if kind is not None else None
    agent = CommandAgent(" ".join(argv) if as_text else argv, name="which", sandbox=sandbox)
    assert agent.command[0] == sys.executable  # as it is: not resolved to the base interpreter
    store = MemoryStore()
    done = await run_one(agent, store, max_attempts=1)
    [attempt] = await store.list_attempts(done.rollout_id)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == 1.0, attempt.error


@pytest.mark.anyio
@pytest.mark.parametrize("kind", [None, "none", "local"])
async def test_a_python_the_command_itself_calls_is_the_interpreter_running_alight(
    kind: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as an agent's own `python -c ...` (mini-swe-agent's bash tool): its folder is first on PATH
    script = tmp_path / "which_python.py"
    script.write_text(WHICH_PYTHON)
    _no_python_on_path(kind, monkeypatch)
    shell = f'exec python "{script}" "{sys.executable}" "{sys.prefix}"'
    sandbox = SandboxConfig(kind=kind, expose=[str(tmp_path)]) if kind is not None else None
    agent = CommandAgent(["/bin/sh", "-c", shell], name="nested", sandbox=sandbox)
    store = MemoryStore()
    done = await run_one(agent, store, max_attempts=1)
    [attempt] = await store.list_attempts(done.rollout_id)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == 1.0, attempt.error


@pytest.mark.parametrize(("kind", "as_text"), [("none", True), ("local", True), ("local", False)])
def test_a_tests_reward_runs_python_without_python_on_path(
    kind: str, as_text: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_python_on_path(kind, monkeypatch)
    argv = ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    config = schema.TestsRewardConfig(command=" ".join(argv) if as_text else argv, timeout_s=60)

    async def score() -> float | None:
        async with open_sandbox(SandboxConfig(kind=kind), source=None, allow=[]) as box:
            (box.workdir / "test_python.py").write_text(WHICH_PYTHON_TEST)
            return await reward_from_tests(box, config, {}, tmp_path)

    assert asyncio.run(score()) == 1.0  # 1 passed: pytest ran on this venv's interpreter


def test_another_interpreter_named_in_the_config_is_left_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("python3.11", "python"):
        (folder / name).symlink_to(sys.executable)  # a venv's python: a link to the base one
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert CommandAgent(["python3.11", "-c", "pass"]).command[0] == "python3.11"
    assert CommandAgent([str(folder / "python"), "-c", "pass"]).command[0] == str(folder / "python")
    assert CommandAgent("bin/python -c pass", cwd=tmp_path).command[0] == str(folder / "python")
    assert CommandAgent(["python3", "-c", "pass"]).command[0] == sys.executable
    docker = SandboxConfig(kind="docker", image="python:3.11-slim")
    assert CommandAgent(["python", "-c", "pass"], sandbox=docker).command[0] == "python"  # the image's
    for argv in (["python3.11", "-m", "pytest"], ["/usr/bin/python3", "-m", "pytest"], ["pythonw", "x"]):
        assert with_alight_python(argv, None) == argv
    assert with_alight_python(["python", "-m", "pytest"], DockerSandbox) == ["python", "-m", "pytest"]
    assert with_alight_python(["python3", "-m", "pytest"], None) == [sys.executable, "-m", "pytest"]


@pytest.mark.parametrize("kind", ["none", "local"])
def test_a_program_that_cannot_start_is_named_in_one_line_with_the_path(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kind none raises it (SandboxError); kind local's init prints it and exits 127. A folder of
    PATH the sandbox does not show (tmp_path here: a pyenv shims folder) is named as absent."""
    if kind == "local":
        check_local()
    path = f"/nonexistent:{tmp_path}:/usr/bin:/bin"
    monkeypatch.setenv("PATH", path)
    path = f"{VENV_BIN}:{path}"  # the interpreter's folder first, as an activated venv has it
    absent = "/nonexistent" if kind == "none" else f"/nonexistent, {tmp_path}"
    expected = f"cannot start 'no-such-program': not found on PATH ({path}; absent here: {absent})"

    async def go() -> str:
        async with open_sandbox(SandboxConfig(kind=kind), source=None, allow=[]) as box:
            try:
                result = await box.run(["no-such-program", "--flag"], env=sandbox_environment(box))
            except SandboxError as err:
                return str(err)
            assert result.code == 127
            return result.stderr_tail.decode()

    said = asyncio.run(go())
    assert said == (expected if kind == "none" else f"alight sandbox: {expected}\n")


def test_a_script_whose_interpreter_is_missing_names_it(tmp_path: Path) -> None:
    script = tmp_path / "agent"
    script.write_text("#!/nonexistent/python -u\nprint(1)\n")
    script.chmod(0o755)
    for program, cwd in ((str(script), "/"), ("./agent", str(tmp_path))):
        with pytest.raises(SandboxError) as caught:
            asyncio.run(run_process([program], cwd=cwd, env={"PATH": "/usr/bin:/bin"}))
        assert str(caught.value) == f"cannot start {program!r}: its #! interpreter /nonexistent/python is not found"


@pytest.mark.anyio
async def test_a_command_agent_whose_program_the_local_sandbox_hides_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A program found on the host's PATH at config load, in a folder the local sandbox does not
    show (as a pyenv shim is): the attempt fails naming it and the folder absent inside."""
    check_local()
    folder = tmp_path / "shims"
    folder.mkdir()
    (folder / "my-agent").write_text("#!/bin/sh\necho 1\n")
    (folder / "my-agent").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:/usr/bin:/bin")
    agent = CommandAgent(["my-agent"], sandbox=SandboxConfig(kind="local"))
    store = MemoryStore()
    done = await run_one(agent, store, max_attempts=1)
    [attempt] = await store.list_attempts(done.rollout_id)
    assert done.status is RolloutStatus.FAILED and attempt.error is not None
    seen = f"{VENV_BIN}:{folder}:/usr/bin:/bin"
    line = f"alight sandbox: cannot start 'my-agent': not found on PATH ({seen}; absent here: {folder})"
    assert attempt.error.endswith(f"exited with code 127; the end of its stderr:\n{line}")
