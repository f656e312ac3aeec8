"""`reward.kind: tests`: the share of a test command's tests that pass in the attempt's working copy.

After the agent's program exits 0, the task's hidden tests (the folder named by the task field
`reward.tests.files`) are copied into the working copy under their own folder name (tasks/x/tests
-> <working copy>/tests, over files of the same name), `reward.tests.command` runs in the same
sandbox with its own time limit and the cleared environment (`python` or `python3` as its program
is the interpreter running alight, as for `agent.command`), and the reward is
passed / (passed + failed + errors), read from the JUnit XML report `reward.tests.junit_xml` when the
command wrote one, else from pytest's summary line. No tests, or counts that cannot be read, fail
the attempt with a one-line reason. The run is recorded as a REWARD span with the counts.
"""

from __future__ import annotations

import re
import shlex
import shutil
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alight import semconv
from alight.agent import AgentFailure
from alight.config.schema import TestsRewardConfig
from alight.errors import ConfigError
from alight.sandbox.base import Sandbox, task_folder, with_alight_python
from alight.sandbox.factory import sandbox_environment
from alight.tracing.context import current_frame
from alight.types import SpanKind

#: Attribute names of the tests' REWARD span.
PASSED, FAILED, ERRORS, COMMAND = "tests.passed", "tests.failed", "tests.errors", "tests.command"
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?|rerun)\b")


@dataclass(frozen=True)
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.errors

    @property
    def reward(self) -> float:
        return self.passed / self.total


def parse_junit(text: str) -> Counts | None:
    """The counts of a JUnit XML report (<testsuites>, or a single <testsuite>, of <testcase>s with
    <failure>, <error> or <skipped>; skipped cases are not counted). None when it is not JUnit XML."""
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return None
    if root.tag not in ("testsuites", "testsuite"):
        return None
    passed = failed = errors = 0
    for case in root.iter("testcase"):
        tags = {child.tag for child in case}
        if "error" in tags:
            errors += 1
        elif "failure" in tags:
            failed += 1
        elif "skipped" not in tags:
            passed += 1
    return Counts(passed, failed, errors)


def parse_pytest_summary(text: str) -> Counts | None:
    """The counts of pytest's last summary line ("== 3 passed, 1 failed, 2 errors in 0.1s ==",
    "1 failed in 2s", "no tests ran in 0.01s" with -q or not); None when there is none."""
    for line in reversed(text.splitlines()):
        line = line.strip().strip("=").strip()
        if re.search(r"\bno tests ran\b", line):
            return Counts()
        found = _COUNT.findall(line)
        if found and re.search(r"\bin [\d.]+s\b", line):
            counts = {word.rstrip("s") if word.startswith("error") else word: int(n) for n, word in found}
            return Counts(counts.get("passed", 0), counts.get("failed", 0), counts.get("error", 0))
    return None


def check_tests_reward(tests: TestsRewardConfig, agent_command: Any) -> None:
    """One-line ConfigErrors for reward.kind=tests without what it needs: a command agent (its
    `agent_command`; None for a Python entrypoint) and a test command."""
    if agent_command is None:
        raise ConfigError("reward.kind tests runs in a command agent's sandbox: set agent.command")
    if not tests.command:
        raise ConfigError("reward.kind tests needs reward.tests.command (e.g. 'python -m pytest -q')")
    if not tests.timeout_s > 0:
        raise ConfigError(f"reward.tests.timeout_s must be positive, got {tests.timeout_s!r}")
    _argv(tests.command)


def _argv(command: Any) -> list[str]:
    if isinstance(command, str):
        try:
            return shlex.split(command)
        except ValueError as err:
            raise ConfigError(f"reward.tests.command {command!r} does not parse: {err}") from None
    return [str(part) for part in command]


def check_hidden(box: Sandbox, config: TestsRewardConfig, task: Any, base: Path, argv: Sequence[str]) -> None:
    """AgentFailure, in one line, when the task's hidden tests are readable inside `box` by the
    agent's `argv` (an `agent.sandbox.expose` entry, or the program's own folder, holding them):
    the agent must not see the tests that score it. Checked before the agent starts."""
    folder = task_folder(task, config.files, base, "reward.tests.files")
    shown = box.shows(folder, argv) if folder is not None else None
    if shown is not None:
        raise AgentFailure(
            f"reward.tests.files: the hidden tests {folder} are readable inside the sandbox through {shown};"
            " expose narrower folders (agent.sandbox.expose) or keep the tests outside the program's folder"
        )


async def reward_from_tests(box: Sandbox, config: TestsRewardConfig, task: Any, base: Path) -> float | None:
    """Copy the hidden tests in, run the test command in `box`: the share that passed, or None when
    it is recorded as the attempt's REWARD span (inside an attempt, where the runner takes it from
    there). AgentFailure, in one line, when no share can be read."""
    folder = task_folder(task, config.files, base, "reward.tests.files")
    if folder is not None:
        shutil.copytree(folder, box.workdir / folder.name, symlinks=True, dirs_exist_ok=True)
    argv = with_alight_python(_argv(config.command), box)
    command = shlex.join(argv)
    report = box.workdir / config.junit_xml if config.junit_xml else None
    if report is not None:
        report.unlink(missing_ok=True)  # a report the agent left is not the tests' answer
    result = await box.run(argv, env=sandbox_environment(box), timeout_s=config.timeout_s)
    if result.timed_out:
        raise AgentFailure(f"reward.tests: {command} ran past reward.tests.timeout_s={config.timeout_s}s")
    counts = None
    if report is not None and report.is_file():
        counts = parse_junit(report.read_text(errors="replace"))
    if counts is None:
        counts = parse_pytest_summary((result.stdout_tail + b"\n" + result.stderr_tail).decode(errors="replace"))
    if counts is None:
        raise AgentFailure(f"reward.tests: no pass/fail counts in the output of {command} (exit {result.code})")
    if counts.total == 0:
        raise AgentFailure(f"reward.tests: {command} ran no tests")
    return None if _record(counts, command) else counts.reward


def _record(counts: Counts, command: str) -> bool:
    frame = current_frame()
    if frame is None:
        return False
    attrs = {
        semconv.REWARD_VALUE: counts.reward,
        semconv.REWARD_SOURCE: "tests",
        semconv.REWARD_NAME: "tests",
        PASSED: counts.passed,
        FAILED: counts.failed,
        ERRORS: counts.errors,
        COMMAND: command,
    }
    frame.attempt.rewards.append(counts.reward)
    frame.attempt.record("tests", SpanKind.REWARD, attrs, frame=frame)
    return True
