"""Adding a part's kind is one new file plus its registration: an engine and a backend written in a
file of the test's own (no module of alight names them) run through the commands that use them:
`alight dev` serves the agent's calls from the new engine, a training run updates with the new
backend. What the rest of alight asks of a kind (can its weights be trained?) comes from the kind's
own class."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from alight.config.loading import load_config, to_object
from alight.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

ENGINE = '''
"""An engine of the test's own: answers by rule (the calculator's tool call, then its answer)."""

from alight.engines.base import EngineCapabilities
from tests.proxy.scripted import ScriptedEngine


class RuleEngine(ScriptedEngine):
    capabilities = EngineCapabilities(trainable=False)  # nothing to train: rules, not weights

    @classmethod
    def options_from_config(cls, engine, model):
        return {"model": engine.served_name, "text": "The answer is 3", "tool_arguments": {"add": {"a": 1, "b": 2}}}

    @classmethod
    def loads_model(cls, engine):
        return False
'''

BACKEND = '''
"""A backend of the test's own: the embedded update, counted in a file (the trainer's process)."""

import os
from pathlib import Path

from alight.backends.embedded import EmbeddedBackend


class CountingBackend(EmbeddedBackend):
    def update(self, batch):
        count = Path(os.environ["COUNTED_UPDATES"])
        count.write_text(str(int(count.read_text() or 0) + 1) if count.exists() else "1")
        return {**super().update(batch), "actor/counted": 1.0}
'''


def write_config(tmp_path: Path, *lines: str) -> Path:
    rows = "".join(json.dumps({"question": f"What is {i} + 2?"}) + "\n" for i in range(4))
    (tmp_path / "val.jsonl").write_text(rows)
    path = tmp_path / "seam.yaml"
    path.write_text(
        f"name: seam\ntrainer:\n  output_dir: {tmp_path / 'runs'}\n"
        "agent:\n  entrypoint: tests.fixtures.sample_agents:calculator\n"
        f"data:\n  train: {tmp_path / 'val.jsonl'}\n  val: {tmp_path / 'val.jsonl'}\n"
        "runner:\n  n_runners: 2\n  timeout_s: 60\n" + "".join(line + "\n" for line in lines)
    )
    return path


@pytest.fixture
def new_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Writes `name.py` with `source` into a folder on sys.path: the new kind's one file."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.syspath_prepend(str(REPO))

    def write(name: str, source: str) -> str:
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def test_a_new_engine_is_one_file_and_its_registration(tmp_path: Path, new_module, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from alight.commands.dev import run_dev
    from alight.engines.factory import ENGINES
    from alight.trainer.checks import validate

    module = new_module("rule_engine", ENGINE)
    ENGINES.register("rules", f"{module}:RuleEngine")
    try:
        monkeypatch.chdir(REPO)
        cfg = to_object(load_config(write_config(tmp_path), ["engine.kind=rules"]))
        run = run_dev(cfg, n=2)
        assert [r.reward for r in run.results] == [1.0, 1.0]  # its answers reached the agent through the proxy
        assert all(r.llm_calls == 2 for r in run.results)
        with pytest.raises(ConfigError, match=r"engine\.kind rules serves a model alight cannot update; train with"):
            validate(cfg)  # what training asks of the kind, answered by its class
    finally:
        ENGINES.unregister("rules")
    with pytest.raises(ConfigError, match=r"engine\.kind must be one of embedded, vllm, litellm, got 'rules'"):
        validate(cfg, training=False)  # gone with its registration


@pytest.mark.timeout(300)
def test_a_new_backend_is_one_file_and_its_registration(tmp_path: Path, new_module, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from alight.backends.factory import register_backend, unregister_backend
    from alight.trainer import Trainer

    module = new_module("counting_backend", BACKEND)
    register_backend("counting", f"{module}:CountingBackend")
    counted = tmp_path / "updates"
    monkeypatch.setenv("COUNTED_UPDATES", str(counted))
    monkeypatch.chdir(REPO)
    overrides = [
        "trainer.backend=counting", "trainer.steps=1", "trainer.batch_size=1", "trainer.group_size=2",
        "trainer.val_every=0", "trainer.val_size=1", "engine.sampling.max_tokens=8", "logging.plot=false",
        "logging.dashboard=false", "algorithm.entropy_coef=0.01",
    ]  # fmt: skip
    try:
        result = Trainer(to_object(load_config(write_config(tmp_path), overrides))).fit()
    finally:
        unregister_backend("counting")
    assert counted.read_text() == "1"  # the new class made the run's one update
    assert result.metrics[-1]["actor/counted"] == 1.0
    with pytest.raises(ConfigError, match=r"trainer\.backend must be one of embedded, verl, got 'counting'"):
        Trainer(to_object(load_config(write_config(tmp_path), overrides))).fit()
