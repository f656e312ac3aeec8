"""`reward.kind: tests`: the pass/fail parsers (table tests), and end to end through a store server
and a runner pool: a command agent edits a tiny repository in its sandbox, then the hidden tests
(which it never sees) decide the reward: 2 of 3 pass (the third errors) -> 2/3."""

from __future__ import annotations

import asyncio
import pickle
import shlex
import sys
import time
from pathlib import Path

import pytest

from alight.agent import AgentFailure
from alight.command_agent import CommandAgent
from alight.config import schema
from alight.config.schema import RewardConfig, SandboxConfig
from alight.rewards.tests import Counts, check_hidden, parse_junit, parse_pytest_summary, reward_from_tests
from alight.runner.pool import RunnerPool
from alight.sandbox.factory import open_sandbox
from alight.sandbox.local import check_local
from alight.store.client import StoreClient
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.types import Rollout, RolloutStatus, Span, SpanKind, Task

AGENT = Path(__file__).with_name("fixing_agent.py")

PYTEST_JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1"
failures="1" skipped="1" tests="5" time="0.1"><testcase classname="t" name="test_a" time="0.001"/>
<testcase classname="t" name="test_b" time="0.001"/><testcase classname="t" name="test_c"><failure
message="assert 1 == 2">x</failure></testcase><testcase classname="t" name="test_d"><error message="fixture">
e</error></testcase><testcase classname="t" name="test_e"><skipped message="skip"/></testcase></testsuite>
</testsuites>"""
#: Another tool's report: a bare <testsuite>, several suites, failures and errors in nested suites.
OTHER_JUNIT = """<testsuites><testsuite name="a"><testcase name="1"/><testcase name="2"><failure/></testcase>
</testsuite><testsuite name="b"><testsuite name="b.inner"><testcase name="3"><error type="Boom"/></testcase>
<testcase name="4"/></testsuite></testsuite></testsuites>"""


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (PYTEST_JUNIT, Counts(2, 1, 1)),
        (OTHER_JUNIT, Counts(2, 1, 1)),
        ('<testsuite name="s"><testcase name="x"/><testcase name="y"><skipped/></testcase></testsuite>', Counts(1)),
        ("<testsuites/>", Counts()),
        ("<html><body>no</body></html>", None),
        ("not xml at all", None),
        ("", None),
    ],
)
def test_junit_reports(report: str, expected: Counts | None) -> None:
    assert parse_junit(report) == expected


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("..F\n=========== 3 passed, 1 failed, 2 errors in 0.12s ===========", Counts(3, 1, 2)),
        ("1 failed in 2.00s", Counts(0, 1, 0)),
        ("5 passed in 0.01s", Counts(5)),
        ("2 passed, 1 skipped, 1 xfailed, 1 xpassed in 0.30s", Counts(2)),
        ("3 passed, 2 warnings in 1.20s", Counts(3)),
        ("1 failed, 2 passed, 1 deselected in 61.23s (0:01:01)", Counts(2, 1, 0)),
        ("=== 1 error in 0.10s ===", Counts(0, 0, 1)),
        ("==== 1 passed, 1 rerun in 0.2s ====", Counts(1)),
        ("no tests ran in 0.01s", Counts()),
        ("collected 0 items\n\n============ no tests ran in 0.01s ============", Counts()),
        ("4 passed in 0.1s\nlater output: 9 passed without a time", Counts(4)),
        ("Traceback (most recent call last):\nImportError: no module", None),
        ("", None),
    ],
)
def test_pytest_summaries(output: str, expected: Counts | None) -> None:
    assert parse_pytest_summary(output) == expected


def _tiny_repo(root: Path) -> tuple[Path, Path]:
    """A repository with a bug in add(), and its hidden tests: two pass once it is fixed, one errors."""
    repo, hidden = root / "task" / "repo", root / "task" / "tests"
    repo.mkdir(parents=True)
    hidden.mkdir()
    (repo / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (hidden / "test_calc.py").write_text(
        "import pytest\nfrom calc import add\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n"
        "def test_add_zero():\n    assert add(4, 0) == 4\n\n"
        "@pytest.fixture\ndef broken():\n    raise RuntimeError('a fixture that errors')\n\n"
        "def test_with_a_broken_fixture(broken):\n    pass\n"
    )
    return repo, hidden


@pytest.mark.parametrize(("kind", "junit_xml"), [("local", ".alight-report.xml"), ("none", None)])
def test_the_hidden_tests_decide_the_reward_after_the_agent_edits_its_working_copy(
    tmp_path: Path, kind: str, junit_xml: str | None
) -> None:
    if kind == "local":
        check_local()
    repo, hidden = _tiny_repo(tmp_path)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += [f"--junitxml={junit_xml}"] if junit_xml else []
    reward = RewardConfig(
        kind="tests", tests=schema.TestsRewardConfig(command=command, files="tests", junit_xml=junit_xml)
    )
    sandbox = SandboxConfig(kind=kind, workdir="repo", time_s=60)
    agent = CommandAgent([sys.executable, str(AGENT)], name="fixer", sandbox=sandbox, reward=reward)
    assert pickle.loads(pickle.dumps(agent)).sandbox == sandbox  # it travels to pool workers and Ray actors
    with (
        StoreServer(SqliteStore(tmp_path / "store.db")) as store_server,
        RunnerPool(agent, store_server.url, n_runners=1, instrument=False, heartbeat_interval_s=0.5),
    ):
        rollout, error, spans = asyncio.run(
            _one(store_server.url, {"repo": str(repo), "tests": str(hidden), "isolated": kind == "local"})
        )
    assert rollout.status == RolloutStatus.SUCCEEDED, error
    assert rollout.reward == pytest.approx(2 / 3)
    [tests] = [span for span in spans if span.kind is SpanKind.REWARD and span.name == "tests"]
    assert tests.attributes["tests.passed"] == 2 and tests.attributes["tests.failed"] == 0
    assert tests.attributes["tests.errors"] == 1 and "pytest" in tests.attributes["tests.command"]
    assert "return a - b" in (repo / "calc.py").read_text()  # the agent edited its copy, not the task


async def _one(store_url: str, task: dict[str, object]) -> tuple[Rollout, str | None, list[Span]]:
    async with StoreClient(store_url) as store:
        [queued] = await store.enqueue([Rollout(task=Task(input=task), timeout_s=120.0)])
        deadline = time.monotonic() + 120
        while (rollout := await store.get_rollout(queued.rollout_id)).status in (
            RolloutStatus.QUEUING,
            RolloutStatus.RUNNING,
        ):
            assert time.monotonic() < deadline, "the rollout did not end"
            await asyncio.sleep(0.2)
        [attempt] = await store.list_attempts(rollout.rollout_id)
        return rollout, attempt.error, list(await store.query_spans(rollout.rollout_id))


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("print('collected 0 items'); print('no tests ran in 0.01s')", "reward.tests: {cmd} ran no tests"),
        (
            "print('Segfault'); raise SystemExit(139)",
            "reward.tests: no pass/fail counts in the output of {cmd} (exit 139)",
        ),
        ("import time; time.sleep(30)", "reward.tests: {cmd} ran past reward.tests.timeout_s=1.0s"),
        ("print('1 passed, 1 failed in 0.1s')", None),
    ],
)
def test_no_tests_or_no_counts_fail_the_attempt_in_one_line(tmp_path: Path, script: str, expected: str | None) -> None:
    command = [sys.executable, "-c", script]
    config = schema.TestsRewardConfig(command=command, junit_xml="report.xml", timeout_s=1.0)

    async def score() -> float | None:
        async with open_sandbox(SandboxConfig(), source=None, allow=[]) as box:
            (box.workdir / "report.xml").write_text(PYTEST_JUNIT)  # left by the agent: not the tests' answer
            return await reward_from_tests(box, config, {}, tmp_path)

    if expected is None:
        assert asyncio.run(score()) == 0.5  # the summary, since the command wrote no report of its own
        return
    with pytest.raises(AgentFailure) as caught:
        asyncio.run(score())
    assert str(caught.value) == expected.format(cmd=shlex.join(command))


def test_hidden_tests_readable_inside_the_sandbox_refuse_the_attempt(tmp_path: Path) -> None:
    """The agent must not read the tests that score it: a local sandbox that exposes them (an
    `expose` entry above them, or the program's own folder holding them) refuses to start it."""
    check_local()
    repo, hidden = _tiny_repo(tmp_path)
    program = [sys.executable, str(AGENT)]
    config = schema.TestsRewardConfig(command=["true"], files="tests")
    task = {"repo": str(repo), "tests": str(hidden)}

    async def check(expose: list[str], argv: list[str]) -> None:
        async with open_sandbox(SandboxConfig(kind="local", expose=expose), source=repo, allow=[]) as box:
            check_hidden(box, config, task, tmp_path, argv)

    asyncio.run(check([str(repo)], program))  # the repository alone: the tests stay hidden
    for expose, argv in (([str(tmp_path)], program), ([], [sys.executable, str(hidden / "test_calc.py")])):
        with pytest.raises(AgentFailure) as caught:
            asyncio.run(check(expose, argv))
        assert str(caught.value).startswith(f"reward.tests.files: the hidden tests {hidden} are readable inside")


def test_an_agent_that_could_read_its_hidden_tests_fails_before_it_starts(tmp_path: Path) -> None:
    check_local()
    repo, hidden = _tiny_repo(tmp_path)
    reward = RewardConfig(kind="tests", tests=schema.TestsRewardConfig(command=["true"], files="tests"))
    sandbox = SandboxConfig(kind="local", workdir="repo", time_s=60, expose=[str(tmp_path)])
    agent = CommandAgent([sys.executable, str(AGENT)], name="fixer", sandbox=sandbox, reward=reward)
    with (
        StoreServer(SqliteStore(tmp_path / "store.db")) as store_server,
        RunnerPool(agent, store_server.url, n_runners=1, instrument=False, heartbeat_interval_s=0.5),
    ):
        rollout, error, _ = asyncio.run(_one(store_server.url, {"repo": str(repo), "tests": str(hidden)}))
    assert rollout.status == RolloutStatus.FAILED
    assert error is not None and f"the hidden tests {hidden} are readable inside the sandbox" in error
    assert "return a - b" in (repo / "calc.py").read_text()
