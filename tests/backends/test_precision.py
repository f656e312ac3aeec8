"""algorithm.precision: bf16 autocast against fp32 on the same batch (within the stated tolerances),
float32 master weights and output layer, `auto` by what the device has, one-line errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from alight.backends import precision
from alight.backends.checks import check_algorithm
from alight.backends.embedded import EmbeddedBackend
from alight.config.schema import AlgorithmConfig
from alight.errors import ConfigError
from tests.backends.test_embedded_backend import batch_of, transitions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: bf16 against fp32 on one batch of the tiny model (measured 2026-11-28: log-probs differ by at most
#: 0.0033, the loss by 7e-5 relative, the gradients' cosine 1.0000; SmolLM2: benchmarks/update_bench.py).
LOG_PROB_ATOL, LOSS_RTOL, GRAD_COSINE = 0.02, 1e-3, 0.999


def test_bf16_stays_near_fp32_on_one_batch(tiny_dir: Path) -> None:
    batch = batch_of(transitions([1.0, -1.0, 0.5, 0.2, -0.3, 0.8], seed=4))
    out = {}
    for name in ("fp32", "bf16"):
        b = EmbeddedBackend(tiny_dir, AlgorithmConfig(precision=name), seed=0)
        assert b.precision == name
        lp, _ = b.log_probs(batch)
        loss = -(lp * batch.advantages).sum() / batch.response_mask.sum()
        loss.backward()
        grad = torch.cat([p.grad.flatten() for p in b.model.parameters() if p.grad is not None])
        assert all(p.dtype == torch.float32 for p in b.model.parameters())  # master weights
        assert lp.dtype == torch.float32
        out[name] = (lp.detach(), float(loss), grad)
    (lp32, loss32, g32), (lp16, loss16, g16) = out["fp32"], out["bf16"]
    gap = float((lp16 - lp32).abs().max())
    assert 0 < gap < LOG_PROB_ATOL  # bf16 did run (not 0) and stays near
    assert loss16 == pytest.approx(loss32, rel=LOSS_RTOL)
    assert float(torch.nn.functional.cosine_similarity(g16.double(), g32.double(), dim=0)) > GRAD_COSINE


def test_bf16_runs_the_decoder_in_bf16_and_the_output_layer_in_fp32(tiny_dir: Path) -> None:
    b = EmbeddedBackend(tiny_dir, AlgorithmConfig(precision="bf16"), seed=0)
    seen: dict[str, torch.dtype] = {}
    proj = b.model.get_decoder().layers[0].mlp.up_proj
    head = b.model.get_output_embeddings()

    def record(name: str):  # type: ignore[no-untyped-def]
        def hook(_module: object, _inputs: object, output: torch.Tensor) -> None:
            seen.setdefault(name, output.dtype)

        return hook

    hooks = [proj.register_forward_hook(record("decoder")), head.register_forward_hook(record("head"))]
    b.update(batch_of(transitions([1.0, -1.0, 0.5], seed=1)))
    for hook in hooks:
        hook.remove()
    assert seen == {"decoder": torch.bfloat16, "head": torch.float32}


def test_auto_is_bf16_only_where_the_device_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "native_bf16", lambda device: device == "cpu")
    assert precision.resolve_precision("auto", "cpu") == "bf16"
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    assert precision.resolve_precision("auto", "cpu") == "fp32"
    assert precision.resolve_precision("fp32", "cpu") == "fp32"


def test_bf16_without_native_support_warns(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    with caplog.at_level(logging.WARNING, logger="alight.backends.precision"):
        assert precision.resolve_precision("bf16", "cpu") == "bf16"
    assert "emulated" in caplog.text
    caplog.clear()
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    with caplog.at_level(logging.WARNING, logger="alight.backends.precision"):
        precision.resolve_precision("bf16", "cpu")
    assert caplog.text == ""


def test_native_bf16_reads_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from alight.models import devices

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, probe, lambda: False, raising=False)
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset({"fp", "asimd"}))
    assert not devices.native_bf16("cpu")
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset({"fp", "asimd", "bf16"}))
    assert devices.native_bf16("cpu")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(devices, "_cpu_flags", lambda: frozenset())
    assert devices.native_bf16("cpu")
    assert not devices.native_bf16("mps")


def test_a_bad_precision_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^algorithm.precision must be one of fp32, bf16, auto, got 'fp16'$"):
        check_algorithm(AlgorithmConfig(precision="fp16"))
