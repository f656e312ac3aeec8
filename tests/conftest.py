"""Fixtures for every test: the anyio backend, and the real tiny model, built once per session; and
how the suite runs in parallel (pytest-xdist): `WORKERS` processes unless `-n` says otherwise."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Default worker processes (pytest-xdist). On the 2-core CI machine 3 beat 2 and 4: the tests wait on
#: subprocesses, servers and Ray much of the time. `-n N` overrides it, `-n 0` or `-p no:xdist` runs serially.
WORKERS = 3
#: Test files whose tests run one after another on one worker (`xdist_group`), and why.
GROUPS = {
    # One local Ray cluster per group: each starts a dozen processes. The runner pools' tests...
    "ray": (
        "tests/runner/test_pool_protocol.py",
        "tests/runner/test_ray_pool.py",
        "tests/trainer/test_ray_parity.py",
    ),
    # ... and verl's CPU workers' (one cluster for the whole group: tests/backends/conftest.py `verl_ray`).
    "verl": (
        "tests/trainer/test_verl_cpu_run.py",
        "tests/backends/verl/",
    ),
    # One real vLLM server per session (tests/engines/conftest.py `real_vllm`): its tests on one worker.
    "vllm": (
        "tests/engines/test_engine_conformance.py",
        "tests/engines/test_vllm_real.py",
        "tests/trainer/test_vllm_training.py",
    ),
    # The GPU sets' pip dry runs share one module-scoped fixture: on one worker they run once.
    "pip": ("tests/test_gpu_extras.py",),
    # SmolLM2's conversion (~45 s) is the session fixture `smol_dir`: its users on one worker, so it runs once.
    "smollm2": ("tests/models/test_sources.py", "tests/recipes/test_smol_recipes.py"),
    # The wheel is built and installed into a new venv once (module fixtures of this file): on one worker.
    "wheel": ("tests/test_wheel.py",),
}
#: Fixtures that start Ray: a test using one outside a group is refused (put it in one).
RAY_FIXTURES = ("ray_cluster", "verl_ray")
#: Tests in a group by their ids, outside the files of GROUPS: file -> (what the id holds, the group).
ROWS = {"tests/backends/test_conformance.py": ("[verl", "verl")}
#: Groups handed out first, longest first: each is one chain on one worker.
LONG_GROUPS = ("verl", "vllm", "ray")

os.environ["HF_HUB_OFFLINE"] = "1"
# Three workers share two cores here: a training's update keeps one torch thread (trainer.threads),
# as before sync updates took every core; tests of that behaviour unset it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The offline tiny Qwen2 model (`alight.models.resolve.tiny_model_dir`) in a temp dir."""
    pytest.importorskip("transformers")
    from alight.models.resolve import tiny_model_dir

    return tiny_model_dir(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="session")
def smol_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged SmolLM2-135M-Instruct converted into a temp cache (tests/fixtures/smol.py)."""
    from alight.models.sources import prepare_model
    from tests.fixtures.smol import SMOL

    return prepare_model(SMOL, cache_dir=tmp_path_factory.mktemp("models"))


def vllm_python() -> str | None:
    """The interpreter of the vLLM venv: $ALIGHT_VLLM_PYTHON, else the checkout's .venv-vllm."""
    named = os.environ.get("ALIGHT_VLLM_PYTHON")
    if named:
        return named
    local = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else None


@pytest.fixture(scope="session")
def real_vllm_python() -> str:
    """The vLLM venv's interpreter; without one the test skips, or fails where ALIGHT_REQUIRE_VLLM=1
    (README's test command sets it: CI must not pass by skipping the real server)."""
    python = vllm_python()
    if python is None:
        message = "no vLLM venv (.venv-vllm or ALIGHT_VLLM_PYTHON): README's test command installs vLLM's CPU build"
        if os.environ.get("ALIGHT_REQUIRE_VLLM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Train on one torch thread: on a shared 2-core machine a second one only waits (~100x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """Run on `WORKERS` xdist workers with `--dist loadgroup` when the command line names neither `-n`
    nor `--dist` (before xdist's own hook reads them); nothing without xdist, with --pdb or inside a worker."""
    if not config.pluginmanager.hasplugin("xdist") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if config.option.usepdb:  # --pdb needs the tests in this process
        return
    if config.option.numprocesses is None and config.option.dist == "no" and not config.option.tx:
        config.option.numprocesses = WORKERS
        config.option.dist = "loadgroup"


def group_of(nodeid: str) -> str | None:
    """The group of `GROUPS` (or of `ROWS`) a test id belongs to; None: none."""
    path, _, name = nodeid.partition("::")
    for group, prefixes in GROUPS.items():
        if path.startswith(prefixes):
            return group
    if path in ROWS and ROWS[path][0] in name:
        return ROWS[path][1]
    return None


@pytest.hookimpl(optionalhook=True)  # xdist's hook: unknown under -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`--dist loadgroup` (the default here) by `group_of`, each other test on its own. xdist's own
    loadgroup reads the group from a suffix its workers add to the test ids, which pytest 9.2's ids
    no longer take (`item._nodeid` is gone): with pytest-xdist 3.8 no group held together."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests of `GROUPS` (and `ROWS`) with their xdist group, as the scheduler groups them
    (`group_of`), and refuse a test that starts Ray outside a group; on xdist's workers, also hand
    out the longest work first (`LONG_GROUPS`, then the `slow` tests), so that no long test starts
    last while the other workers sit idle."""
    for item in items:
        group = group_of(item.nodeid)
        if group is None and any(name in RAY_FIXTURES for name in getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid} starts Ray: put it in a group (tests/conftest.py GROUPS)")
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: xdist checks they collect the same
        items.sort(key=_start_order)  # stable: within a rank, the collection order stays


def _start_order(item: pytest.Item) -> int:
    """The rank in `LONG_GROUPS` of the item's group; after them, a `slow` test; then the rest."""
    groups = [mark.args[0] for mark in item.iter_markers("xdist_group") if mark.args]
    for rank, group in enumerate(LONG_GROUPS):
        if group in groups:
            return rank
    return len(LONG_GROUPS) + (0 if item.get_closest_marker("slow") else 1)
