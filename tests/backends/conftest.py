"""A local Ray cluster shared by the tests that start verl's real workers on CPU (the conformance
suite's `verl` row and tests/backends/verl/test_cpu_workers.py): started once for this folder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: Logical CPUs of the shared cluster: a verl worker takes a bundle of 1, and up to 2 backends of
#: 2 workers live at once (save/load), whatever the machine's cores.
RAY_CPUS = 4


@pytest.fixture(scope="package")
def verl_ray() -> Iterator[object]:
    """Ray for verl's CPU workers (skips without verl); RAY_AUTH_MODE=disabled keeps Ray from
    writing an auth token under the home folder. A backend finds it running and leaves it up."""
    for module in ("verl", "ray", "tensordict"):
        pytest.importorskip(module)
    import ray

    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if not ray.is_initialized():
        ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
