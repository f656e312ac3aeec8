"""Command agents (`agent.command`): a real program per attempt, run by a real `Runner` on a
MemoryStore. Rewards from stdout and the reward file, the task on stdin and in a file, a crash's
stderr tail on the attempt, the time limit killing the program and what it started."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from alight.command_agent import STDERR_TAIL_BYTES, CommandAgent, command_agent, parse_reward
from alight.errors import ConfigError
from alight.store import MemoryStore
from alight.tracing import make_tracer
from alight.types import AttemptStatus, LLMResource, Rollout, RolloutStatus, SpanKind, Task

pytestmark = pytest.mark.anyio


def script(tmp_path: Path, body: str, name: str = "agent.sh") -> CommandAgent:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return CommandAgent(["sh", str(path)], name="shell")


async def run_one(agent: CommandAgent, store: MemoryStore, task: Any = None, **fields: Any) -> Rollout:
    from alight.runner import Runner

    [queued] = await store.enqueue([Rollout(task=Task(input=task if task is not None else {"q": 1}), **fields)])
    runner = Runner(agent, store, tracer=make_tracer("light"), instrument=False, heartbeat_interval_s=0.2)
    assert await runner.run(max_rollouts=1, idle_exit_s=1.0) == 1
    return await store.get_rollout(queued.rollout_id)


def gone(pid: int) -> bool:
    """The process no longer runs (a zombie waiting for a reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status


async def test_the_last_reward_line_of_stdout_is_the_reward_and_the_task_comes_on_stdin_and_in_a_file(
    tmp_path: Path,
) -> None:
    store = MemoryStore()
    seen = tmp_path / "seen"
    agent = script(
        tmp_path,
        f"""cat > {seen}.stdin
cp "$ALIGHT_TASK_FILE" {seen}.file
env > {seen}.env
head -c 300000 /dev/zero | tr '\\0' 'x'; echo     # chatty on both streams: nothing blocks
head -c 300000 /dev/zero | tr '\\0' 'y' >&2
echo '{{"reward": 0.25}}'
echo '0.75'
echo '{{"answer": 3}}'
echo 'done, bye'
""",
    )
    task = {"question": "What is 2+2?", "result": "4", "n": [1, 2]}
    done = await run_one(agent, store, task)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == pytest.approx(0.75)
    assert json.loads((tmp_path / "seen.stdin").read_text()) == task
    assert json.loads((tmp_path / "seen.file").read_text()) == task
    env = dict(line.split("=", 1) for line in (tmp_path / "seen.env").read_text().splitlines() if "=" in line)
    assert env["ALIGHT_ROLLOUT_ID"] == done.rollout_id and env["ALIGHT_AGENT_NAME"] == "shell"
    [attempt] = await store.list_attempts(done.rollout_id)
    assert env["ALIGHT_ATTEMPT_ID"] == attempt.attempt_id
    spans = await store.query_spans(done.rollout_id)
    [agent_span] = [s for s in spans if s.kind is SpanKind.AGENT]
    assert agent_span.name == "shell" and env["ALIGHT_PARENT_SPAN_ID"] == agent_span.span_id


async def test_a_last_stdout_line_without_a_newline_is_still_read_as_the_reward(tmp_path: Path) -> None:
    store = MemoryStore()
    done = await run_one(script(tmp_path, "echo 0.25\nprintf '{\"reward\": 0.75}'\n"), store)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == pytest.approx(0.75)
    done = await run_one(script(tmp_path, "printf 0.5\n", name="alone.sh"), store)  # the only line
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == pytest.approx(0.5)


async def test_the_reward_file_wins_over_stdout(tmp_path: Path) -> None:
    agent = script(tmp_path, 'echo 1\nprintf \'{"reward": 0.5}\' > "$ALIGHT_REWARD_FILE"\n')
    done = await run_one(agent, MemoryStore())
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == pytest.approx(0.5)


async def test_no_reward_succeeds_without_one_and_a_bad_reward_file_fails(tmp_path: Path) -> None:
    store = MemoryStore()
    done = await run_one(script(tmp_path, "echo hello\n"), store)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward is None
    bad = script(tmp_path, 'echo lots > "$ALIGHT_REWARD_FILE"\n', name="bad.sh")
    done = await run_one(bad, store, max_attempts=1)
    assert done.status is RolloutStatus.FAILED
    [attempt] = await store.list_attempts(done.rollout_id)
    assert attempt.error is not None and "ALIGHT_REWARD_FILE holds 'lots'" in attempt.error


async def test_a_crash_fails_the_attempt_with_the_end_of_its_stderr(tmp_path: Path) -> None:
    store = MemoryStore()
    agent = script(
        tmp_path,
        "echo 'EARLY LINE' >&2\nhead -c 5000 /dev/zero | tr '\\0' 'z' >&2\necho >&2\n"
        "echo 'TypeError: cannot read the task' >&2\necho '{\"reward\": 1}'\nexit 3\n",
    )
    done = await run_one(agent, store, max_attempts=1)
    assert done.status is RolloutStatus.FAILED and done.reward is None
    [attempt] = await store.list_attempts(done.rollout_id)
    assert attempt.status is AttemptStatus.FAILED and attempt.error is not None
    assert "exited with code 3" in attempt.error and "Traceback" not in attempt.error
    assert attempt.error.rstrip().endswith("TypeError: cannot read the task")
    assert "EARLY LINE" not in attempt.error and len(attempt.error) < STDERR_TAIL_BYTES + 300


async def test_the_time_limit_kills_the_program_and_what_it_started(tmp_path: Path) -> None:
    store = MemoryStore()
    pids = tmp_path / "pids"
    agent = script(tmp_path, f"sleep 60 &\necho $! > {pids}\necho $$ >> {pids}\nsleep 60\n")
    started = time.monotonic()
    done = await run_one(agent, store, timeout_s=1.0, max_attempts=1)
    assert time.monotonic() - started < 10
    assert done.status is RolloutStatus.TIMEOUT
    [attempt] = await store.list_attempts(done.rollout_id)
    assert attempt.status is AttemptStatus.TIMEOUT and "timeout of 1 s" in (attempt.error or "")
    numbers = [int(line) for line in pids.read_text().split()]
    assert len(numbers) == 2
    deadline = time.monotonic() + 5
    while not all(gone(pid) for pid in numbers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(gone(pid) for pid in numbers), numbers


async def test_a_program_that_exits_leaving_a_child_holding_its_pipes_ends_promptly(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    agent = script(tmp_path, f"sleep 60 &\necho $! > {pids}\necho 0.5\n")
    started = time.monotonic()
    done = await run_one(agent, MemoryStore(), timeout_s=30.0)
    assert time.monotonic() - started < 10
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == pytest.approx(0.5)
    child = int(pids.read_text())
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child)


async def test_the_program_gets_the_agent_route_of_the_proxy(tmp_path: Path) -> None:
    store = MemoryStore()
    await store.add_resources({"llm": LLMResource(endpoint="http://127.0.0.1:9/", model="policy", api_key="k")})
    seen = tmp_path / "env"
    agent = script(tmp_path, f"env > {seen}\n")
    done = await run_one(agent, store)
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    [attempt] = await store.list_attempts(done.rollout_id)
    [agent_span] = [s for s in await store.query_spans(done.rollout_id) if s.kind is SpanKind.AGENT]
    route = (
        f"http://127.0.0.1:9/rollout/{done.rollout_id}/attempt/{attempt.attempt_id}"
        f"/agent/shell/trace/{agent_span.trace_id}/span/{agent_span.span_id}"
    )
    assert env["OPENAI_BASE_URL"] == route + "/v1" and env["ANTHROPIC_BASE_URL"] == route
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_API_KEY"] == "k" and env["ALIGHT_MODEL"] == "policy"


def test_parse_reward_reads_numbers_and_reward_objects_only() -> None:
    assert parse_reward("0.5") == 0.5 and parse_reward('{"reward": 2}') == 2.0 and parse_reward("-1") == -1.0
    for text in ('{"answer": 3}', '"0.5"', "true", "[1]", "reward: 1", '{"reward": "high"}', ""):
        assert parse_reward(text) is None, text
    with pytest.raises(Exception, match="not a finite number"):
        parse_reward("NaN")


def test_a_command_agent_is_checked_when_made_and_travels_to_workers(tmp_path: Path) -> None:
    agent = command_agent("node examples/node_agent/agent.js --flag 'a b'")
    assert agent.name == "agent" and agent.command == ["node", "examples/node_agent/agent.js", "--flag", "a b"]
    assert command_agent(["sh", "-c", "echo 1"], "calc").name == "calc"
    assert command_agent(["sh", "x.sh", 3]).command[2] == "3"
    copy = pickle.loads(pickle.dumps(agent))
    assert (copy.command, copy.name, copy.cwd) == (agent.command, agent.name, os.getcwd())
    for bad, why in [
        ("no-such-program-here x.js", "not found on PATH"),
        (["./missing/agent"], "is not an executable file"),
        ([], "must name a program"),
        ("node 'unclosed", "does not parse"),
        (["node", {"a": 1}], "must be a list of strings or a string"),
        ({"node": "agent.js"}, "must be a list of strings or a string"),
    ]:
        with pytest.raises(ConfigError, match=why) as raised:
            command_agent(bad)
        assert "\n" not in str(raised.value)
    with pytest.raises(ConfigError, match="without '/'"):
        command_agent(["sh"], "a/b")


POST_REWARD = """curl -sS --fail -X POST "$ALIGHT_STORE_URL/store/spans" -H 'content-type: application/json' -d \
"{\\"spans\\": [{\\"rollout_id\\": \\"$ALIGHT_ROLLOUT_ID\\", \\"attempt_id\\": \\"$ALIGHT_ATTEMPT_ID\\",\
 \\"parent_id\\": \\"$ALIGHT_PARENT_SPAN_ID\\", \\"name\\": \\"reward\\", \\"kind\\": \\"reward\\",\
 \\"attributes\\": {\\"reward.value\\": $1, \\"alight.agent.name\\": \\"$ALIGHT_AGENT_NAME\\"}}]}" > /dev/null
"""


async def test_rewards_the_program_posts_to_the_store_itself(tmp_path: Path, store_server: Any) -> None:
    """Over a real store server (the program reaches it at ALIGHT_STORE_URL, with curl): the last
    posted reward is the attempt's, and no second reward span is added."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    from alight.runner import Runner
    from alight.store.client import StoreClient

    (tmp_path / "post.sh").write_text(POST_REWARD)
    agent = script(tmp_path, f"sh {tmp_path / 'post.sh'} 0.2\nsh {tmp_path / 'post.sh'} 0.9\necho not a reward\n")
    async with StoreClient(store_server.url) as store:
        [queued] = await store.enqueue([Rollout(task=Task(input={"q": 1}))])
        runner = Runner(agent, store, tracer=make_tracer("light"), instrument=False)
        assert await runner.run(max_rollouts=1, idle_exit_s=1.0) == 1
        done = await store.get_rollout(queued.rollout_id)
        spans = await store.query_spans(done.rollout_id)
    assert done.status is RolloutStatus.SUCCEEDED and done.reward == pytest.approx(0.9)
    rewards = [s for s in spans if s.kind is SpanKind.REWARD]
    assert [s.attributes["reward.value"] for s in rewards] == [0.2, 0.9]
    [agent_span] = [s for s in spans if s.kind is SpanKind.AGENT]
    assert {s.parent_id for s in rewards} == {agent_span.span_id}


def test_the_proxy_reads_the_agent_and_its_span_from_the_path_before_the_headers() -> None:
    from alight import semconv
    from alight.proxy.recorder import CallContext

    path = {"rollout_id": "ro-1", "attempt_id": "at-1", "agent_name": "calc", "trace_id": "t1", "parent_span_id": "s1"}
    headers = {semconv.HEADER_AGENT_NAME: "other", semconv.HEADER_PARENT_SPAN_ID: "s2", semconv.HEADER_TRACE_ID: "t2"}
    context = CallContext.of(path, headers)
    assert (context.agent_name, context.trace_id, context.parent_id) == ("calc", "t1", "s1")
    context = CallContext.of({"rollout_id": "ro-1", "attempt_id": "at-1"}, headers)
    assert (context.agent_name, context.trace_id, context.parent_id) == ("other", "t2", "s2")
    assert context.sequence_id is None  # the store numbers it as it arrives
