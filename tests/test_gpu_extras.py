"""The GPU extras install: pip's own resolver, in a dry run, on alight[verl] as a GPU machine gets it.
The dry runs take a minute of PyPI; they run when what they resolve from changed since the committed
stamp (constraints/gpu-resolved.json, which constraints/refresh.py rewrites), else the checks read
what the stamp recorded.

`pip install --dry-run --report` resolves for a Linux x86-64 machine with the Python named,
whatever this machine is, reading each wheel's metadata with HTTP range requests (pip's fast-deps:
the index here serves no separate metadata files, and pip without it downloads every wheel, 4 GB
of CUDA libraries), and the test checks what it chose: the versions the extra pins (verl, vLLM,
torch) and a transformers inside verl's, vLLM's and alight's ranges. An unresolvable pin
(vllm==0.32.0 beside verl==0.9.1) fails it, naming the conflict. The slow tests need PyPI; the
fast ones check the CPU path's verl (installed with --no-deps by README's test command).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.test_install import CONSTRAINTS, read_pins

ROOT = Path(__file__).resolve().parents[1]
# Every glibc a manylinux wheel of the set may name (llguidance needs 2.31; most say 2.17 or 2.28).
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 36)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]
# hydra-core's parser runtime comes as an sdist only, which --only-binary refuses: build its wheel.
SDIST_ONLY = ("antlr4-python3-runtime",)
# README's test command installs this pip; pip 23.2's dry run downloads whole wheels even with fast-deps.
PIP = "26.3"
VERL_IMPORTS = (
    "from verl import DataProto; import verl.trainer.ppo.core_algos, verl.trainer.ppo.ray_trainer,"
    " verl.single_controller.ray, verl.workers.config"
)


def extra(name: str) -> list[Requirement]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    return [Requirement(line) for line in extras[name]]


def pinned(requirements: list[Requirement]) -> dict[str, str]:
    """Name -> version of each `name==version` requirement."""
    pins = {}
    for req in requirements:
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            pins[canonicalize_name(req.name)] = specs[0].version
    return pins


def pip_env() -> dict[str, str]:
    """This machine's pip settings left out (local wheel folders, a torch cap): PyPI only, as a GPU host sees it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_FIND_LINKS", "PIP_CONSTRAINT", "PIP_INDEX_URL")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def pip(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=pip_env(), timeout=timeout_s
    )


def dry_run(tmp: Path, python: str, *requirements: str) -> dict[str, dict[str, Any]]:
    """What pip would install for `requirements` on Linux x86-64 with that Python: name -> metadata."""
    if Version(importlib.metadata.version("pip")) < Version(PIP):
        pytest.skip(f"needs pip>={PIP} (README's test command installs it): older ones download every wheel")
    wheels = tmp / "wheels"
    pins = read_pins(CONSTRAINTS.read_text())
    for name in SDIST_ONLY:
        built = pip("wheel", "--no-deps", "--quiet", "-w", str(wheels), f"{name}=={pins[name]}")
        assert built.returncode == 0, built.stderr[-3000:]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    report = tmp / "report.json"
    # --target: pip before 24 takes --platform only with it; nothing is written in a dry run
    resolved = pip(
        "install", "--dry-run", "--use-feature=fast-deps", "--ignore-installed", "--report", str(report),
        "--target", str(tmp / "target"), "--python-version", python, *platforms,
        "--only-binary=:all:", "--find-links", str(wheels), *requirements,
    )  # fmt: skip
    why = resolved.stdout[-2500:] + resolved.stderr[-1500:]  # pip says which requirements conflict
    assert resolved.returncode == 0, f"{' '.join(requirements)} does not resolve:\n{why}"
    installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in installs}


def requirement_of(metadata: dict[str, Any], name: str) -> Requirement:
    """`metadata`'s unconditional requirement on `name`."""
    for line in metadata.get("requires_dist", []):
        req = Requirement(line)
        if canonicalize_name(req.name) == name and req.marker is None:
            return req
    raise AssertionError(f"{metadata['name']} does not require {name}")


GPU_SETS = [
    ("verl", "3.11"),  # the default GPU set: torch 2.13.0 (CUDA 13 wheels), vLLM 0.31.0
    ("verl-torch211", "3.12"),  # a CUDA 13 machine that keeps torch 2.11.0: verl's own tested set
]


def smoke_wheels(tmp: Path) -> list[dict[str, Any]]:
    """The offline GPU smoke check's wheel list (benchmarks/gpu_smoke/prepare.py's resolve, no download)."""
    if Version(importlib.metadata.version("pip")) < Version(PIP):
        pytest.skip(f"needs pip>={PIP} (README's test command installs it): older ones download every wheel")
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu_smoke"))
    import prepare

    return prepare.resolve(tmp, vllm=False)  # type: ignore[no-any-return]


#: What the dry runs resolved last, and from what: written by `ALIGHT_GPU_RESOLVE=write` (constraints/refresh.py
#: runs this module so), read while its inputs are unchanged. PyPI moves between refreshes; the pins do not.
STAMP = ROOT / "constraints" / "gpu-resolved.json"
#: The files a resolution reads besides pyproject's requirements: the CPU pins (the sdist builds) and the
#: smoke check's wheel list.
STAMP_FILES = ("constraints/cpu.txt", "benchmarks/gpu_smoke/prepare.py")
#: The packages whose requirements the checks read; of the others the stamp keeps the version.
READ_REQUIREMENTS = ("verl", "vllm", "alight")


def stamp_inputs() -> str:
    """A hash of what the dry runs resolve from: pyproject's requirements, `STAMP_FILES`, the GPU sets,
    the platforms and README's pip (a new version number or tool setting in pyproject changes nothing)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    parts = [json.dumps([project["dependencies"], project["optional-dependencies"]], sort_keys=True)]
    parts += [(ROOT / name).read_text() for name in STAMP_FILES]
    parts.append(repr((GPU_SETS, PLATFORMS, SDIST_ONLY, PIP)))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _resolved(value: Any) -> Future[Any]:
    done: Future[Any] = Future()
    done.set_result(value)
    return done


def _slim(resolution: Any) -> Any:
    if isinstance(resolution, dict):  # a GPU set: name -> metadata
        kept = {name: ("name", "version", "requires_dist") for name in READ_REQUIREMENTS}
        return {
            name: {key: meta[key] for key in kept.get(name, ("version",)) if key in meta}
            for name, meta in sorted(resolution.items())
        }
    # the smoke check's wheel list: a wheel built here is named by its file, not by its temp folder
    return [{**w, "url": "file:" + Path(w["url"]).name} if w["url"].startswith("file:") else w for w in resolution]


@pytest.fixture(scope="module")
def gpu_resolutions(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Future[Any]]:
    """Both GPU sets' dry runs and the smoke check's, started together (each waits on PyPI most of its
    minute); or, while `stamp_inputs()` is what the stamp was written from, what they resolved then.
    `ALIGHT_GPU_RESOLVE=1` resolves anyway; `=write` resolves and writes the stamp."""
    mode = os.environ.get("ALIGHT_GPU_RESOLVE", "")
    if not mode and STAMP.is_file():
        stamp = json.loads(STAMP.read_text())
        if stamp["inputs"] == stamp_inputs():
            return {tuple(key.split("@")): _resolved(value) for key, value in stamp["resolved"].items()}  # type: ignore[misc]
    pool = ThreadPoolExecutor(max_workers=len(GPU_SETS) + 1)
    futures: dict[tuple[str, str], Future[Any]] = {
        (name, python): pool.submit(dry_run, tmp_path_factory.mktemp(name), python, f"{ROOT}[{name}]")
        for name, python in GPU_SETS
    }
    futures[("smoke", "3.12")] = pool.submit(smoke_wheels, tmp_path_factory.mktemp("smoke"))
    pool.shutdown(wait=mode == "write")
    if mode == "write":
        resolved = {f"{name}@{python}": _slim(future.result()) for (name, python), future in futures.items()}
        STAMP.write_text(json.dumps({"inputs": stamp_inputs(), "resolved": resolved}, indent=1, sort_keys=True) + "\n")
    return futures


@pytest.mark.slow
@pytest.mark.timeout(900)  # pip resolves from PyPI beside the suite's other workers
def test_the_smoke_checks_wheels_resolve_for_python_312_beside_torch_211(
    gpu_resolutions: dict[tuple[str, str], Future[Any]],
) -> None:
    """What benchmarks/gpu_smoke/prepare.py would download for the GPU machine: binary wheels only,
    verl's set at the pins, and not torch or NVIDIA's libraries (that machine has them)."""
    wheels = gpu_resolutions[("smoke", "3.12")].result()
    versions = {w["name"]: w["version"] for w in wheels}
    assert versions["verl"] == "0.9.1" and versions["ray"] == "2.60.0" and versions["tensordict"] == "0.10.0"
    assert versions["transformers"] == "5.9.0"
    assert not any(name.startswith(("torch", "nvidia-", "triton")) for name in versions)
    assert all(w["url"].endswith(".whl") for w in wheels)  # nothing to build on the offline machine


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("extra_name", "python"), GPU_SETS)
def test_the_gpu_extra_resolves_for_linux_x86_64(
    extra_name: str, python: str, gpu_resolutions: dict[tuple[str, str], Future[dict[str, Any]]]
) -> None:
    got = gpu_resolutions[(extra_name, python)].result()  # a skip or failure in the dry run is raised here
    promised = pinned(extra(extra_name))
    assert {"verl", "vllm"} <= promised.keys()
    versions = {name: metadata["version"] for name, metadata in got.items()}
    assert {name: versions.get(name) for name in promised} == promised
    torch = requirement_of(got["vllm"], "torch")  # vLLM pins the torch its kernels are built for
    assert versions["torch"].split("+")[0] in torch.specifier
    transformers = versions["transformers"]
    for owner in ("verl", "vllm", "alight"):
        assert transformers in requirement_of(got[owner], "transformers").specifier, owner


def test_the_cpu_path_pins_the_verl_of_the_gpu_extra() -> None:
    pins = read_pins(CONSTRAINTS.read_text())
    gpu = pinned(extra("verl"))
    assert pins["verl"] == gpu["verl"]
    # the dev extra's ranges for verl's needs hold the GPU set's versions too
    dev = {canonicalize_name(req.name): req for req in extra("dev")}
    for name in ("tensordict", "ray"):
        assert gpu[name] in dev[name].specifier, name


def test_verl_imports_on_cpu() -> None:
    try:
        version = importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        pytest.fail("verl is not installed: README's test command installs it with --no-deps after the dev extra")
    assert version == read_pins(CONSTRAINTS.read_text())["verl"]
    imported = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", VERL_IMPORTS], capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0, imported.stderr[-3000:]
