"""alight as a user installs it: the wheel built from this checkout, checked as an upload would be,
installed into a new venv and run from an empty folder, away from the checkout.

`python -m build --no-isolation` builds the sdist, then the wheel from the unpacked sdist (so the sdist
is proven to carry what a rebuild reads), with the hatchling of this environment: offline, no build
venv. The new venv gets the wheel alone (`pip install --no-deps --no-index`); its dependencies come
from this environment's site-packages, named by a `.pth` file of the new venv: a path line, so the
`.pth` files there (this checkout's editable install) are not run and the checkout stays off the path.
A full install of the wheel's dependencies (`-c constraints/cpu.txt`, ~110 packages) took 67 s and
1.8 GB of disk on the 2-core machine (2026-11-28; 91 s with a new venv's own pip 23.2), time and disk
CI cannot spare; README's test command already resolves the same requirements for `-e ".[dev]"`,
and the test checks that every requirement the wheel names is met by the versions the venv imports.
`ALIGHT_WHEEL_INSTALL=full` installs them for real instead (from PyPI and the local torch wheel).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import alight
from tests.test_install import CONSTRAINTS

REPO = Path(__file__).resolve().parents[1]
#: The folders the wheel ships beside the package, at alight/_shipped/<name> (alight.shipped finds them).
SHIPPED = ("configs", "recipes", "examples")
#: One GRPO step of the calc experiment that still runs every stage: a short warm start on the
#: recipe's demonstrations, a group of 2 rollouts, validation on 2 tasks, a checkpoint.
ONE_STEP = [
    "trainer.steps=1", "trainer.batch_size=1", "trainer.group_size=2", "data.train_size=4", "data.val_size=2",
    "warm_start.steps=2", "warm_start.size=16", "warm_start.batch_size=4", "warm_start.warmup_steps=0",
    "runner.n_runners=1", "engine.sampling.max_tokens=16", "logging.plot=false",
]  # fmt: skip

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


def without_checkout(**extra: str) -> dict[str, str]:
    """This process's environment without what could put the checkout or another venv on the path: no
    PYTHONPATH (nor any PYTHON* setting), no VIRTUAL_ENV, no user site."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "VIRTUAL_ENV"}
    return {**env, "PYTHONNOUSERSITE": "1", **extra}


@dataclass(frozen=True)
class Installed:
    """A new venv holding the wheel."""

    venv: Path
    site_packages: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self) -> dict[str, str]:
        path = os.pathsep.join([str(self.venv / "bin"), os.environ.get("PATH", "")])
        return without_checkout(PATH=path, VIRTUAL_ENV=str(self.venv), NO_COLOR="1", COLUMNS="200")

    def run(self, *args: str, cwd: Path, timeout: float = 110) -> subprocess.CompletedProcess[str]:
        """`alight ARGS`, the venv's console script, in `cwd`."""
        command = [str(self.venv / "bin" / "alight"), *args]
        return subprocess.run(command, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout)


def metadata(dist: Dist) -> tuple[dict[str, list[str]], str]:
    """The wheel's METADATA: each field's values (Classifier, Requires-Dist, ... repeat), and its body."""
    with zipfile.ZipFile(dist.wheel) as wheel:
        message = Parser().parsestr(wheel.read(f"alight-{alight.__version__}.dist-info/METADATA").decode())
    fields: dict[str, list[str]] = {}
    for key, value in message.items():
        fields.setdefault(key, []).append(value)
    return fields, str(message.get_payload())


def tracked(folder: str) -> set[str] | None:
    """The files git tracks under `folder` of this checkout (what a clean clone holds); None: not a git checkout."""
    if not shutil.which("git") or not (REPO / ".git").exists():
        return None
    listed = subprocess.run(["git", "ls-files", "-z", folder], cwd=REPO, capture_output=True, text=True, check=True)
    return {name for name in listed.stdout.split("\0") if name}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)]
    built = subprocess.run(command, cwd=out, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    [wheel] = out.glob("*.whl")
    [sdist] = out.glob("*.tar.gz")
    return Dist(wheel, sdist)


@pytest.fixture(scope="module")
def installed(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    venv = tmp_path_factory.mktemp("venv")
    empty = tmp_path_factory.mktemp("cwd")

    def run(*command: str | Path, timeout: float) -> str:
        done = subprocess.run(
            command, cwd=empty, env=without_checkout(), capture_output=True, text=True, timeout=timeout
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    run(sys.executable, "-m", "venv", "--without-pip", str(venv), timeout=120)
    python = venv / "bin" / "python"
    full = os.environ.get("ALIGHT_WHEEL_INSTALL") == "full"
    how = ["-c", str(CONSTRAINTS)] if full else ["--no-deps", "--no-index"]
    # this environment's pip (README's) installs into the new venv (`--python`)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-cache-dir", "--quiet"]
    run(*pip, *how, str(dist.wheel), timeout=540)
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(run(python, "-c", purelib, timeout=60).strip())
    if not full:  # the dependencies: this environment's site-packages, after the venv's own on the path
        (site_packages / "_alight_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return Installed(venv, site_packages)


def test_the_wheel_carries_the_package_and_the_shipped_experiments(dist: Dist) -> None:
    assert dist.wheel.name == f"alight-{alight.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(dist.wheel) as wheel:
        names = set(wheel.namelist())
    info = f"alight-{alight.__version__}.dist-info"
    assert {name.split("/")[0] for name in names} == {"alight", info}
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".pyo"))]
    assert {"alight/py.typed", "alight/cli/app.py", f"{info}/licenses/LICENSE", f"{info}/entry_points.txt"} <= names
    with zipfile.ZipFile(dist.wheel) as wheel:
        assert "alight = alight.cli.app:main" in wheel.read(f"{info}/entry_points.txt").decode()
    shipped = {n.removeprefix("alight/_shipped/") for n in names if n.startswith("alight/_shipped/")}
    assert {"configs/calc.yaml", "recipes/calc/agent.py", "recipes/calc/data.py"} <= shipped
    package = {
        n.removeprefix("alight/") for n in names if n.startswith("alight/") and not n.startswith("alight/_shipped/")
    }
    sources = tracked("src/alight")
    if sources is not None:  # exactly what a clean clone holds: nothing generated, nothing missing
        assert package == {s.removeprefix("src/alight/") for s in sources}
        assert shipped == set().union(*(tracked(folder) or set() for folder in SHIPPED))


def test_the_wheels_metadata(dist: Dist) -> None:
    fields, body = metadata(dist)
    assert fields["Metadata-Version"] == ["2.4"] and fields["Version"] == [alight.__version__]
    assert fields["License-Expression"] == ["MIT"] and fields["License-File"] == ["LICENSE"]
    assert fields["Description-Content-Type"] == ["text/markdown"]
    assert body == (REPO / "README.md").read_text()
    classifiers = set(fields["Classifier"])
    assert {
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Typing :: Typed",
        "Operating System :: POSIX :: Linux",
    } <= classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]  # License-Expression replaces them (PEP 639)
    assert "Project-URL" not in fields  # no public home yet: no made-up address
    assert fields["Requires-Python"] == [">=3.11"]


def test_the_sdist_carries_what_a_rebuild_reads(dist: Dist) -> None:
    top = f"alight-{alight.__version__}"
    with tarfile.open(dist.sdist) as sdist:
        names = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
    assert {
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "PKG-INFO",
        "src/alight/__init__.py",
        "src/alight/py.typed",
        "configs/calc.yaml",
        "recipes/calc/agent.py",
    } <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/", ".venv", "constraints/"))]


def test_twine_and_check_wheel_contents_pass(dist: Dist) -> None:
    command = [sys.executable, "-m", "twine", "check", "--strict", str(dist.wheel), str(dist.sdist)]
    twine = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert twine.returncode == 0, twine.stdout + twine.stderr
    # its settings (the top-level name, W004 for the swe_tasks recipe's data) are in pyproject.toml
    command = [sys.executable, "-m", "check_wheel_contents", "--config", "pyproject.toml", str(dist.wheel)]
    contents = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert contents.returncode == 0, contents.stdout + contents.stderr


def test_the_installed_wheel_is_what_runs(installed: Installed, dist: Dist, tmp_path: Path) -> None:
    version = installed.run("--version", cwd=tmp_path)
    assert version.returncode == 0, version.stderr
    assert version.stdout == f"alight {alight.__version__}\n"
    fields, _ = metadata(dist)
    requirements = [Requirement(line) for line in fields["Requires-Dist"]]
    requirements = [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": ""})]  # not extras'
    probe = (
        "import importlib.metadata as md, json, sys, alight, alight.cli.app\n"
        "def version(name):\n"
        "    try:\n"
        "        return md.version(name)\n"
        "    except md.PackageNotFoundError:\n"
        "        return None\n"
        "print(json.dumps({'file': alight.__file__, 'version': alight.__version__, 'path': sys.path,"
        " 'metadata': md.version('alight'), 'requirements': {n: version(n) for n in sys.argv[1:]}}))"
    )
    command = [str(installed.python), "-c", probe, *(r.name for r in requirements)]
    seen = subprocess.run(command, cwd=tmp_path, env=installed.env(), capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, seen.stderr
    found = json.loads(seen.stdout)
    assert Path(found["file"]).is_relative_to(installed.site_packages / "alight"), found["file"]
    assert not Path(found["file"]).is_relative_to(REPO)
    assert str(REPO / "src") not in found["path"] and str(REPO) not in found["path"]
    assert found["version"] == found["metadata"] == alight.__version__
    assert (installed.site_packages / "alight" / "_shipped" / "configs" / "calc.yaml").is_file()
    # every requirement the wheel names is met by what the venv imports
    have = found["requirements"]
    wrong = [
        f"{r.name} {have[r.name] or 'missing'} (wants {r.specifier})"
        for r in requirements
        if have[r.name] is None or not r.specifier.contains(Version(have[r.name]), prereleases=True)
    ]
    assert not wrong, wrong


def test_the_installed_wheel_lists_and_runs_a_shipped_experiment_by_name(installed: Installed, tmp_path: Path) -> None:
    listed = installed.run("recipes", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    report = json.loads(listed.stdout)
    assert Path(report["root"]) == installed.site_packages / "alight" / "_shipped"
    assert {"calc", "quickstart"} <= {row["name"] for row in report["experiments"]}
    dev = installed.run("dev", "calc", "--n", "2", "--json", cwd=tmp_path)
    assert dev.returncode == 0, dev.stderr[-3000:]
    rollouts = json.loads(dev.stdout)["rollouts"]
    assert [r["status"] for r in rollouts] == ["succeeded", "succeeded"], rollouts


def test_the_installed_wheel_copies_a_shipped_experiment_and_trains_the_copy(
    installed: Installed, tmp_path: Path
) -> None:
    copied = installed.run("init", "calc", cwd=tmp_path)
    assert copied.returncode == 0, copied.stderr[-3000:]
    for name in ("calc/calc.yaml", "calc/recipes/calc/agent.py", "calc/recipes/calc/data.py"):
        assert (tmp_path / name).is_file(), name
    assert not list(tmp_path.rglob("__pycache__"))
    runs = tmp_path / "runs"
    trained = installed.run(
        "train", "calc/calc.yaml", "--no-dashboard", f"trainer.output_dir={runs}", *ONE_STEP, cwd=tmp_path
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    [run_dir] = runs.iterdir()
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    [step] = [s for s in steps if "train/reward_mean" in s]
    assert step["step"] == 1 and step["rollouts/succeeded"] == 2
    assert (run_dir / "checkpoints" / "step_000001").is_dir()
