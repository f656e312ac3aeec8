"""The offline GPU smoke check (benchmarks/gpu_smoke/) without a GPU: the split/reassemble round
trip of the wheel bundle, the GPU-side script's arguments and its one-line refusal on a machine
without CUDA, the dry run's output. The wheel list resolved for the GPU machine's Python 3.12 and
torch 2.11.0 (needs PyPI) is tests/test_gpu_extras.py's, beside the GPU extras' dry runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "benchmarks" / "gpu_smoke"
sys.path.insert(0, str(SMOKE))

import bundle  # noqa: E402


def test_split_then_join_gives_back_every_file_and_no_part_is_over_the_limit(tmp_path: Path) -> None:
    files = {"big.whl": os.urandom(2500), "exact.whl": os.urandom(1000), "small.whl": b"x" * 10}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    manifest = bundle.split_folder(tmp_path, limit=1000)
    assert all(p.stat().st_size <= 1000 for p in tmp_path.iterdir() if p.name != bundle.MANIFEST)
    assert not (tmp_path / "big.whl").exists() and len(manifest["files"][0]["parts"]) == 3
    joined = bundle.join_folder(tmp_path)
    assert {p.name: p.read_bytes() for p in joined} == files
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*files, bundle.MANIFEST])


def test_a_damaged_or_missing_part_is_named(tmp_path: Path) -> None:
    (tmp_path / "big.whl").write_bytes(os.urandom(2500))
    bundle.split_folder(tmp_path, limit=1000)
    part = tmp_path / "big.whl.part001"
    part.write_bytes(b"0" + part.read_bytes()[1:])
    with pytest.raises(ValueError, match=r"big\.whl\.part001 is damaged"):
        bundle.join_folder(tmp_path)
    part.unlink()
    with pytest.raises(ValueError, match=r"big\.whl\.part001 is missing"):
        bundle.join_folder(tmp_path)


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # CUDA_VISIBLE_DEVICES="" keeps a GPU this machine might have out of sight: the refusal is what is tested
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    script = str(SMOKE / "run.py")
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


def test_the_gpu_script_refuses_a_machine_without_cuda_in_one_line(tmp_path: Path) -> None:
    done = run_script("--out", "smoke.json", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "no CUDA GPU" in done.stderr
    assert not (tmp_path / "smoke.json").exists()


@pytest.mark.parametrize("args", [["--steps", "0"], ["--timeout-s", "-1"], ["--steps", "two"], ["--nope"]])
def test_the_gpu_script_refuses_bad_arguments(tmp_path: Path, args: list[str]) -> None:
    done = run_script(*args, cwd=tmp_path)
    assert done.returncode == 2 and "error:" in done.stderr


def test_the_gpu_script_documents_its_options(tmp_path: Path) -> None:
    done = run_script("--help", cwd=tmp_path)
    assert done.returncode == 0
    for option in ("--out", "--steps", "--model", "--config", "--skip-install", "--timeout-s"):
        assert option in done.stdout


def test_the_dry_run_prints_the_wheel_list_and_downloads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare.py --dry-run: the resolved list as JSON, no folder written (the resolve itself, which
    needs PyPI, is stood in for here; tests/test_gpu_extras.py runs the real one)."""
    import prepare

    wheels = [{"name": "verl", "version": "0.9.1", "url": "https://example.invalid/verl-0.9.1-py3-none-any.whl"}]
    monkeypatch.setattr(prepare, "resolve", lambda work, vllm: wheels)
    printed: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: printed.append(" ".join(map(str, a))))
    assert prepare.main([str(tmp_path / "out"), "--dry-run"]) == 0
    listing = json.loads(printed[0])
    assert listing["wheels"] == wheels and listing["python"] == "3.12" and listing["limit_bytes"] <= 60_000_000
    assert not (tmp_path / "out").exists()


def test_each_run_trains_and_serves_on_the_gpu_and_keeps_its_whole_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first H100 run (2026-11-26) found the embedded engine generating on the CPU beside verl's
    CUDA workers (engine.device defaults to cpu): both must be on the GPU, and the whole log kept."""
    import run

    seen: list[list[str]] = []

    def fake_run(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="x" * 5000, stderr="")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    args = run.parse(["--out", str(tmp_path / "smoke.json"), "--steps", "2"])
    for engine in ("embedded", "vllm"):
        result = run.train(tmp_path, args, engine, 60.0)
        assert not result["ok"] and result["steps"] == 0  # no metrics were written
        assert len((tmp_path / f"smoke-{engine}.log").read_text()) == 5000
    embedded, vllm = seen
    assert "trainer.device=cuda" in embedded and "engine.device=cuda" in embedded
    assert "engine.kind=vllm" in vllm and not any(arg.startswith("engine.device") for arg in vllm)


def test_carried_parts_fill_calls_under_the_limit_and_device_sh_waits_then_runs(tmp_path: Path) -> None:
    """carry.py's calls: each at most the limit, every part in exactly one; device.sh, run call by
    call, waits until the manifest is whole, then unpacks the site and the model and runs run.py
    (which refuses here: no CUDA, exit 2) from the checkout."""
    import io
    import lzma
    import tarfile

    import carry

    stage, out = tmp_path / "stage", tmp_path / "out"
    stage.mkdir()
    site = io.BytesIO()
    with tarfile.open(fileobj=site, mode="w:xz") as tar:
        data = os.urandom(300_000)  # incompressible: the archive needs several parts
        info = tarfile.TarInfo("marker.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    (stage / carry.SITE).write_bytes(site.getvalue())
    (stage / carry.MODEL).write_bytes(lzma.compress(b"GGUF" + os.urandom(200_000)))
    limit = 200_000 + 24_000  # parts of 100 kB: two fit a call beside the manifest and scripts
    manifest = bundle.split_folder(stage, limit=100_000)
    calls = carry.spread(stage, out, limit)
    names = [name for call in calls for name in call]
    parts = [part["name"] for entry in manifest["files"] for part in entry["parts"]]
    assert sorted(names) == sorted(parts) and len(parts) >= 6 and len(calls) >= 3
    for index in range(1, len(calls) + 1):
        folder = out / f"call{index}"
        assert sum(p.stat().st_size for p in folder.iterdir()) <= limit
        assert {"manifest.json", "device.sh", "bundle.py", "run.py"} <= {p.name for p in folder.iterdir()}

    env = {**os.environ, "ALIGHT_STAGE": str(tmp_path / "device"), "OUT": str(tmp_path / "results")}
    for index in range(1, len(calls) + 1):
        done = subprocess.run(
            ["bash", str(out / f"call{index}" / "device.sh")], cwd=ROOT, env=env, capture_output=True, text=True
        )
        if index < len(calls):
            assert done.returncode == 0 and "waiting for more" in done.stdout
            assert not (tmp_path / "device" / "site" / "marker.bin").exists()
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr  # run.py ran, and refused
    assert (tmp_path / "device" / "site" / "marker.bin").read_bytes() == data
    assert (tmp_path / "device" / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes().startswith(b"GGUF")
