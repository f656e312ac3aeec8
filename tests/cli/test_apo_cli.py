"""APO as a user meets it: `alight train` with algorithm apo (bad settings: one line, exit 2; a
shrunk calc_apo run end to end), `alight dev --prompt` (the agent reads that prompt), the prompt
files, and the system prompt `alight serve --system-prompt` adds."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from alight.algorithms.apo import load_prompt
from alight.errors import ConfigError
from tests.cli.in_process import alight_here
from tests.cli.test_dev_and_trace import alight, write_config
from tests.fixtures.apo import prompt_score
from tests.fixtures.openai_server import ScriptedOpenAIServer, answer

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("algorithm.apo.beam_width=0", "algorithm.apo.beam_width"),
        ("algorithm.apo.prompt='Solve {oops'", "algorithm.apo.prompt"),
        ("algorithm.apo.optimizer.kind=gpt", "algorithm.apo.optimizer.kind"),
        ("algorithm.apo.bogus=1", "bogus"),
    ],
)
def test_bad_apo_settings_fail_in_one_line_with_exit_code_2(override: str, named: str, tmp_path: Path) -> None:
    done = alight_here("train", "configs/calc_apo.yaml", override, f"trainer.output_dir={tmp_path}", "--no-dashboard")
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines
    assert done.stdout == "" and not list(tmp_path.iterdir())


def test_load_prompt_from_a_run_directory_a_json_or_a_text_file(tmp_path: Path) -> None:
    (tmp_path / "run" / "apo").mkdir(parents=True)
    (tmp_path / "run" / "apo" / "best_prompt.txt").write_text("Think {question}\n")
    (tmp_path / "best.json").write_text(json.dumps({"prompt": "From JSON", "score": 1.0}))
    (tmp_path / "plain.md").write_text("Plain")
    assert load_prompt(tmp_path / "run") == "Think {question}\n"
    assert load_prompt(str(tmp_path / "best.json")) == "From JSON"
    assert load_prompt(tmp_path / "plain.md") == "Plain"
    for missing in (tmp_path, tmp_path / "nope.txt"):
        with pytest.raises(ConfigError):
            load_prompt(missing)
    (tmp_path / "bad.json").write_text("[1]")
    with pytest.raises(ConfigError, match="no 'prompt' key"):
        load_prompt(tmp_path / "bad.json")


def test_the_served_engine_adds_the_system_prompt_to_requests_without_one() -> None:
    from alight.engines.base import ChatRequest
    from alight.engines.litellm_engine import LiteLLMEngine
    from alight.engines.system_prompt import SystemPromptEngine

    async def ask(engine: SystemPromptEngine, messages: list[dict[str, str]]) -> None:
        await engine.chat(ChatRequest(model="scripted", messages=messages))

    with ScriptedOpenAIServer(lambda request: answer("ok"), model=None) as upstream:
        engine = SystemPromptEngine(
            LiteLLMEngine("openai/scripted", base_url=upstream.url, served_name="scripted"), "Be careful."
        )
        asyncio.run(ask(engine, [{"role": "user", "content": "hi"}]))
        asyncio.run(ask(engine, [{"role": "system", "content": "Mine."}, {"role": "user", "content": "hi"}]))
        sent = [r.body["messages"] for r in upstream.requests]
    assert sent[0] == [{"role": "system", "content": "Be careful."}, {"role": "user", "content": "hi"}]
    assert sent[1][0] == {"role": "system", "content": "Mine."} and len(sent[1]) == 2


@pytest.mark.slow
def test_dev_with_prompt_publishes_it_to_the_agent(tmp_path: Path) -> None:
    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "apo").mkdir()
    (tmp_path / "best" / "apo" / "best_prompt.txt").write_text("Be careful with {question}")
    config = write_config(tmp_path, entrypoint="tests.fixtures.apo:keyword_agent")
    with ScriptedOpenAIServer(lambda request: answer("ok"), model=None) as upstream:
        done = alight(
            "dev", str(config), "--n", "2", "--endpoint", upstream.url, "--model", "scripted",
            "--prompt", str(tmp_path / "best"), "--run-dir", str(tmp_path / "run"), "--json",
        )  # fmt: skip
        systems = [r.body["messages"][0] for r in upstream.requests]
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["reward"] for r in report["rollouts"]] == [prompt_score("Be careful")] * 2
    expected = [{"role": "system", "content": f"Be careful with What is {i} + 2?"} for i in range(2)]
    assert sorted(systems, key=str) == expected  # two runners: either order
    missing = alight_here("dev", str(config), "--prompt", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


SHRUNK = [
    "warm_start.steps=20",
    "warm_start.size=200",
    "warm_start.batch_size=8",
    "data.train_size=40",
    "data.val_size=4",
    "algorithm.apo.rounds=1",
    "algorithm.apo.val_size=4",
    "algorithm.apo.train_batch_size=2",
    "algorithm.apo.candidates=2",
    "algorithm.apo.optimizer.sampling.max_tokens=24",
    "runner.n_runners=2",
    "engine.sampling.max_tokens=32",
]


@pytest.mark.slow
def test_calc_apo_runs_end_to_end_through_the_cli(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = alight(
        "train", "configs/calc_apo.yaml", *SHRUNK, f"trainer.output_dir={tmp_path}", "--run-dir", str(run_dir),
        "--no-dashboard", "--json", timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    steps = [line for line in lines if "event" not in line]
    assert [s["step"] for s in steps] == [0, 1] and lines[-1]["event"] == "end"
    history = [json.loads(line) for line in (run_dir / "apo" / "history.jsonl").read_text().splitlines()]
    assert len(history) >= 2 and history[0]["prompt"] == "Use the calculator."
    scored = [h for h in history if h["score"] is not None]
    best = max(scored, key=lambda h: (h["score"], -h["id"]))  # the best score, the older on a tie
    assert (run_dir / "apo" / "best_prompt.txt").read_text() == best["prompt"] == steps[-1]["apo/best_prompt"]
    assert steps[-1]["apo/best_score"] == best["score"] >= steps[0]["apo/best_score"]
