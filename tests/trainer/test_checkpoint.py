"""Checkpoints with a real EmbeddedBackend: servable, pruned, found, and RNG states that round-trip."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from alight.algorithms.batch import TransitionBatch
from alight.backends.embedded import EmbeddedBackend
from alight.config.schema import AlgorithmConfig, LoraConfig
from alight.errors import ConfigError
from alight.trainer import checkpoint as ckpt
from alight.types import Transition

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def trained(tiny_dir: Path, **algorithm: Any) -> EmbeddedBackend:
    """A backend one update away from the base model."""
    backend = EmbeddedBackend(tiny_dir, AlgorithmConfig(lr=1e-2, **algorithm))
    rows = [
        Transition.unchecked([5, 6, 7], [8, 9], 1.0, "ro-0", advantage=1.0),
        Transition.unchecked([5, 6], [10, 11, 12], 0.0, "ro-1", advantage=-1.0),
    ]
    backend.update(TransitionBatch.from_transitions(rows, 0))
    return backend


def save(run_dir: Path, step: int, backend: Any, tiny_dir: Path, *, keep: int = 3, extra: Any = None) -> Path:
    return ckpt.save_checkpoint(
        run_dir,
        step,
        backend,
        {"position": 4 * step, "weights_version": step},
        tokenizer_dir=tiny_dir,
        rng=ckpt.rng_state(extra),
        keep=keep,
    )


class NoWeights:
    """A backend that saves an empty directory: for the tests about which directories count."""

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)


@pytest.mark.parametrize("lora", [False, True])
def test_a_checkpoint_is_a_servable_model_directory(tiny_dir: Path, tmp_path: Path, lora: bool) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    backend = trained(tiny_dir, lora=LoraConfig(enabled=lora))
    path = save(tmp_path, 7, backend, tiny_dir)
    assert path == tmp_path / "checkpoints" / "step_000007"

    model = AutoModelForCausalLM.from_pretrained(path)
    served = model.state_dict()
    expected = backend.engine_weights()  # LoRA merged in
    assert set(served) == set(expected)
    for key, value in expected.items():
        assert torch.equal(served[key], value), key
    tokenizer, base_tokenizer = AutoTokenizer.from_pretrained(path), AutoTokenizer.from_pretrained(tiny_dir)
    messages = [{"role": "user", "content": "2+2?"}]
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == (
        base_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    )

    state, rng = ckpt.load_state(path)
    assert state == {"position": 28, "weights_version": 7, "step": 7}
    assert set(rng) == {"python", "numpy", "torch", "extra"}


def test_only_the_newest_keep_checkpoints_stay(tiny_dir: Path, tmp_path: Path) -> None:
    backend = trained(tiny_dir)
    for step in (1, 2, 3, 4):
        save(tmp_path, step, backend, tiny_dir, keep=2)
    assert [step for step, _ in ckpt.checkpoints(tmp_path)] == [3, 4]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003", "step_000004"]
    save(tmp_path, 5, backend, tiny_dir, keep=0)  # keeps at least the one just written
    assert [step for step, _ in ckpt.checkpoints(tmp_path)] == [5]


def test_latest_ignores_unfinished_directories(tmp_path: Path, tiny_dir: Path) -> None:
    assert ckpt.latest_checkpoint(tmp_path) is None
    save(tmp_path, 2, NoWeights(), tiny_dir)
    save(tmp_path, 10, NoWeights(), tiny_dir)
    root = tmp_path / "checkpoints"
    (root / ".tmp-step_000020").mkdir()  # a run killed while writing step 20
    (root / ".tmp-step_000020" / ckpt.STATE_FILE).write_text("{}")
    (root / "step_000030").mkdir()  # no trainer_state.json: never finished
    (root / "step_notanumber").mkdir()
    (root / "step_notanumber" / ckpt.STATE_FILE).write_text("{}")
    assert ckpt.latest_checkpoint(tmp_path) == (10, root / "step_000010")
    assert [step for step, _ in ckpt.checkpoints(tmp_path)] == [2, 10]


def test_saving_a_step_again_replaces_it_and_clears_a_leftover_temporary(tmp_path: Path, tiny_dir: Path) -> None:
    first = save(tmp_path, 3, NoWeights(), tiny_dir)
    (first / "stale").write_text("from the first save")
    leftover = first.with_name(".tmp-step_000003")
    leftover.mkdir()
    (leftover / "half-written").write_text("")
    again = save(tmp_path, 3, NoWeights(), tiny_dir)
    assert again == first and not (again / "stale").exists()
    assert not leftover.exists()


def test_rng_state_round_trips(tmp_path: Path, tiny_dir: Path) -> None:
    generator = torch.Generator().manual_seed(5)
    path = save(tmp_path, 1, NoWeights(), tiny_dir, extra=generator.get_state())

    def draws() -> tuple[float, float, list[float], list[float]]:
        return (
            random.random(),
            float(np.random.rand()),
            torch.rand(3).tolist(),
            torch.rand(2, generator=generator).tolist(),
        )

    after_save = draws()
    random.random(), np.random.rand(2), torch.rand(5)  # the run goes on, then is resumed
    _, rng = ckpt.load_state(path)
    generator.set_state(ckpt.restore_rng(rng))
    assert draws() == after_save


def test_an_unreadable_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / ckpt.STATE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="cannot be read"):
        ckpt.load_state(tmp_path)
    with pytest.raises(ConfigError, match="cannot be read"):
        ckpt.load_state(tmp_path / "missing")
