"""Fine-tuning from a stored run, through the real stack: a source store recorded by the real proxy
(runner processes, the calculator fixture agent, the litellm engine with the tiny model's
tokenizer), read only; its selection exported as chat rows that `datasets` loads and that
`warm_start.data` turns back into the same token ids; and `alight train` fine-tuning the fresh
tiny model on it, its greedy validation reward rising.

The source run's answers come from the scripted OpenAI-compatible server: it stands in for a
stronger model (none can run or be downloaded here). It calls `add(1, 2)`, then answers 3 (the
agent's reward 1) for questions about an even number and 4 (reward 0) for odd ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.in_process import alight_here
from tests.cli.test_dev_and_trace import alight
from tests.cli.test_dev_eval import even_right_script
from tests.fixtures.openai_server import ScriptedOpenAIServer

AGENT = "tests.fixtures.sample_agents:calculator"
EVEN = list(range(0, 24, 2))  # train questions the source run got right (each twice: a group of 2)
ODD = list(range(1, 24, 2))


def make_source_run(run_dir: Path, tiny_dir: Path) -> None:
    """A finished run's store: a group of 2 train rollouts per question 0..23, and 2 validation ones."""
    from alight.config.schema import AgentConfig, EngineConfig, ExperimentConfig, RunnerConfig
    from alight.store.client import StoreClient
    from alight.trainer.stack import LocalStack
    from alight.types import Rollout, RolloutMode, Task

    def task(i: int) -> Task:
        return Task(input={"question": f"What is {i} + 2?"})

    with ScriptedOpenAIServer(even_right_script) as upstream:
        engine = EngineConfig(kind="litellm", model="openai/scripted", base_url=upstream.url, tokenizer=str(tiny_dir))
        cfg = ExperimentConfig(
            agent=AgentConfig(entrypoint=AGENT), engine=engine, runner=RunnerConfig(n_runners=2, timeout_s=60)
        )
        with LocalStack(cfg, run_dir) as stack:
            rollouts = [
                Rollout(task=task(i), group_id=f"train-s1-t{i}", metadata={"step": 1, "split": "train", "row": i})
                for i in sorted(EVEN + ODD)
                for _ in range(2)
            ]
            rollouts += [Rollout(task=task(i), mode=RolloutMode.VAL, metadata={"split": "val"}) for i in (30, 31)]

            async def run() -> None:
                assert stack.store_url is not None
                async with StoreClient(stack.store_url) as store:
                    ids = [r.rollout_id for r in await store.enqueue(rollouts)]
                    for _ in range(120):
                        if len(await store.wait_for_rollouts(ids, timeout=1.0)) == len(ids):
                            return
                    raise AssertionError("the source rollouts did not end")

            asyncio.run(run())


@pytest.fixture(scope="module")
def source_run(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    run_dir = tmp_path_factory.mktemp("source") / "run"
    make_source_run(run_dir, tiny_dir)
    return run_dir


def fingerprint(directory: Path) -> dict[str, str]:
    """Every file's name and content hash: a read must leave all of them as they were."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_export_writes_chat_rows_datasets_loads_and_warm_start_turns_back_into_the_same_ids(
    source_run: Path, tiny_dir: Path, tmp_path: Path
) -> None:
    import datasets
    from transformers import AutoTokenizer

    from alight.adapters.demonstrations import demonstration_transitions
    from alight.config.schema import AdapterConfig, AlgorithmConfig
    from alight.data import load_rows
    from alight.trainer.sft_source import read_selection

    before = fingerprint(source_run)
    out = tmp_path / "sft.jsonl"
    done = alight_here("trace", str(source_run), "--export-sft", str(out), "--json")  # in this process
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # 48 train rollouts (+2 val, excluded), 2 calls each; the 24 right ones' calls are 2 pairs per
    # question, each pair the same ids: 12 questions x 2 calls kept, 24 duplicates dropped.
    assert (report["rollouts"], report["eligible"], report["transitions"]) == (50, 48, 96)
    assert (report["selected"], report["duplicates"], report["below_bar"], report["rows"]) == (24, 24, 48, 24)

    loaded = datasets.load_dataset("json", data_files=str(out), split="train")
    assert loaded.num_rows == 24 and set(loaded.column_names) == {"messages", "tools"}
    assert {row["messages"][-1]["role"] for row in loaded} == {"assistant"}
    calls = [row for row in loaded if row["messages"][-1].get("tool_calls")]  # the first call offered `add`
    assert len(calls) == 12 and all(row["tools"][0]["function"]["name"] == "add" for row in calls)

    # The rows are what warm_start.data reads: each row's last assistant message becomes exactly
    # the transition the run recorded (the same prompt and response token ids).
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    selection = read_selection(str(source_run), AdapterConfig(), AlgorithmConfig(name="sft"))
    recorded = [(list(t.prompt_ids), list(t.response_ids)) for t in selection.transitions]
    rebuilt = []
    for row in load_rows(str(out)):
        transitions, _ = demonstration_transitions([row], tokenizer, mode="transition")
        rebuilt.append((list(transitions[-1].prompt_ids), list(transitions[-1].response_ids)))
    assert rebuilt == recorded

    # A path without .jsonl is a Hugging Face dataset directory; best_of_group keeps one rollout per group.
    done = alight_here("trace", str(source_run), "--export-sft", str(tmp_path / "ds"), "--select", "best_of_group")
    assert done.returncode == 0, done.stderr
    assert "wrote 24 chat rows" in done.stdout and datasets.load_from_disk(str(tmp_path / "ds")).num_rows == 24
    # --split val: the validation rollouts (questions 30 and 31, one right)
    done = alight_here("trace", str(source_run), "--export-sft", str(tmp_path / "v.jsonl"), "--split", "val", "--json")
    assert json.loads(done.stdout)["rows"] == 2

    assert fingerprint(source_run) == before  # nothing written, not even -wal/-shm files


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_fine_tuning_from_the_store_raises_greedy_validation_reward(source_run: Path, tmp_path: Path) -> None:
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"question": f"What is {i} + 2?"}) + "\n" for i in (24, 25, 26, 27)))
    config = tmp_path / "sft.yaml"
    config.write_text(
        f"name: sfttest\nagent:\n  entrypoint: {AGENT}\ndata:\n  val: {val}\n"
        "engine:\n  sampling:\n    max_tokens: 72\nrunner:\n  n_runners: 2\n  timeout_s: 120\n"
        "algorithm:\n  name: sft\n  lr: 3.0e-3\n  sft:\n    batch_size: 8\n"
        f"trainer:\n  steps: 100\n  val_every: 0\n  save_every: 0\n  output_dir: {tmp_path / 'runs'}\n"
    )
    before = fingerprint(source_run)
    done = alight("train", str(config), f"data.from_store={source_run}", "--no-dashboard", timeout=360)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines()]
    steps = [e for e in events if "step" in e and "event" not in e]
    end = next(e for e in events if e.get("event") == "end")
    assert [s["step"] for s in steps] == list(range(101))
    first = steps[0]
    assert (first["sft/selected"], first["sft/duplicates"], first["sft/eligible"]) == (24, 24, 48)
    assert end["val/reward_start"] == 0.0 and end["val/reward_end"] >= 0.75, (end, first)
    assert steps[-1]["actor/loss"] < steps[1]["actor/loss"]

    run_dir = Path(end["run_dir"])
    assert (run_dir / "checkpoints" / "step_000100" / "model.safetensors").is_file()  # what `alight serve RUN` serves
    assert fingerprint(source_run) == before


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("data.from_store={missing}", "no run directory"),
        ("data.from_store={empty_dir}", "not a run directory"),
        ("data.from_store={source}", "no transition selected"),  # nothing reaches the bar below
        ("algorithm.sft.select=best", "algorithm.sft.select"),
        ("algorithm.name=grpo", "algorithm.name=sft"),
    ],
)
def test_bad_input_fails_in_one_line_with_exit_code_2(
    override: str, named: str, tmp_path: Path, tiny_dir: Path
) -> None:
    """The missing store and the empty selection need no real run: a store with one failed rollout."""
    from alight.store.sqlite import SqliteStore
    from alight.types import Rollout, Task

    source = tmp_path / "src"

    async def one_rollout() -> None:
        store = SqliteStore(source / "store.db")
        await store.enqueue([Rollout(task=Task(input="x"))])
        await store.close()

    asyncio.run(one_rollout())
    (tmp_path / "empty").mkdir()
    value = override.format(missing=tmp_path / "nope", empty_dir=tmp_path / "empty", source=source)
    store_override = [] if value.startswith("data.from_store") else [f"data.from_store={source}"]
    done = alight(
        "train", "configs/calc_sft.yaml", value, *store_override, f"trainer.output_dir={tmp_path / 'runs'}",
        "warm_start.steps=0", "--no-dashboard",
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1 and named in lines[0], lines


def test_the_config_names_the_required_store_in_one_line() -> None:
    done = alight("train", "configs/calc_sft.yaml", "--no-dashboard")
    assert done.returncode == 2 and "data.from_store" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_reading_a_live_store_sees_its_latest_writes_and_leaves_it_unchanged(tmp_path: Path) -> None:
    """A run still writing (its write-ahead log open): the read-only copy holds every commit."""
    from alight.store.sqlite import SqliteStore
    from alight.trainer.sft_source import source_store
    from alight.types import Rollout, Task

    async def main() -> None:
        live = SqliteStore(tmp_path / "store.db")
        try:
            await live.enqueue([Rollout(rollout_id=f"ro-{i}", task=Task(input=i)) for i in range(3)])
            assert (tmp_path / "store.db-wal").exists()
            before = fingerprint(tmp_path)
            async with source_store(str(tmp_path)) as copy:
                assert [r.rollout_id for r in await copy.list_rollouts()] == ["ro-0", "ro-1", "ro-2"]
                assert Path(copy.path).parent != tmp_path  # type: ignore[attr-defined]
            # The database and its log are as they were; readers of a live store take their read
            # marks in its shared-memory index (-shm), as every SQLite reader of a WAL database does.
            after = fingerprint(tmp_path)
            assert {k: v for k, v in after.items() if not k.endswith("-shm")} == {
                k: v for k, v in before.items() if not k.endswith("-shm")
            }
        finally:
            await live.close()

    asyncio.run(main())


def test_a_store_url_is_read_with_the_token_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from alight.store.memory import MemoryStore
    from alight.store.server import StoreServer
    from alight.trainer.sft_source import source_store
    from alight.types import Rollout, Task

    async def listed(url: str) -> list[str]:
        async with source_store(url) as store:
            return [r.rollout_id for r in await store.list_rollouts()]

    server = StoreServer(MemoryStore(), token="s3cret").start()
    try:
        asyncio.run(_enqueue(server.local_url, "s3cret", Rollout(rollout_id="ro-x", task=Task(input=1))))
        monkeypatch.setenv("ALIGHT_TOKEN", "s3cret")
        assert asyncio.run(listed(server.local_url)) == ["ro-x"]
    finally:
        server.stop()


async def _enqueue(url: str, token: str, rollout: Any) -> None:
    from alight.store.client import StoreClient

    async with StoreClient(url, token=token) as store:
        await store.enqueue([rollout])
