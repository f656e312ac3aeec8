"""Torch threads of a run: `trainer.torch_threads` / `trainer.torch_interop_threads` read and applied
(in a fresh interpreter: OpenMP reads its wait policy once, at torch's first import), and runner
workers' agents kept to one sleeping thread."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from alight.errors import ConfigError
from alight.runner import worker
from alight.trainer.threads import ThreadPolicy, usable_cpus

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("threads", "interop", "device", "expected"),
    [
        ("auto", "auto", "cpu", ThreadPolicy(max(1, usable_cpus() // 2), 1, passive_wait=True)),
        ("auto", "auto", "cuda:0", ThreadPolicy(1, 1, passive_wait=True)),  # the GPU does the math
        ("3", "2", "cpu", ThreadPolicy(3, 2, passive_wait=True)),
        (1, "auto", "cpu", ThreadPolicy(1, 1, passive_wait=True)),  # a YAML number
        ("torch", "torch", "cpu", ThreadPolicy(None, None, passive_wait=False)),  # PyTorch's defaults, as before
        ("auto", "torch", "cpu", ThreadPolicy(max(1, usable_cpus() // 2), None, passive_wait=True)),
        ("torch", "1", "cpu", ThreadPolicy(None, 1, passive_wait=False)),
        (" AUTO ", "auto", "cpu", ThreadPolicy(max(1, usable_cpus() // 2), 1, passive_wait=True)),
    ],
)
def test_config_values_give_the_policy(threads: object, interop: object, device: str, expected: ThreadPolicy) -> None:
    assert ThreadPolicy.from_config(threads, interop, device) == expected


@pytest.mark.parametrize(
    ("threads", "device", "mode", "update"),
    [
        ("auto", "cpu", "sync", usable_cpus()),  # nothing else runs during a sync update: every core
        ("auto", "cpu", "async", None),  # the rollouts go on beside it: the rollouts' count
        ("auto", "cuda", "sync", None),
        ("2", "cpu", "sync", None),  # a number is the user's, for the whole run
        ("torch", "cpu", "sync", None),
    ],
)
def test_a_sync_update_on_cpu_takes_every_core(
    threads: str, device: str, mode: str, update: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert ThreadPolicy.from_config(threads, "auto", device, mode=mode).update_intra_op == update
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the environment chose: the update keeps the run's count
    assert ThreadPolicy.from_config(threads, "auto", device, mode=mode).update_intra_op is None


def test_updating_sets_the_threads_of_the_calling_thread_and_restores_them() -> None:
    import threading

    import torch

    policy = ThreadPolicy(1, 1, passive_wait=True, update_intra_op=2)
    seen: list[int] = []

    def update() -> None:
        torch.set_num_threads(1)
        with policy.updating():
            seen.append(torch.get_num_threads())
        seen.append(torch.get_num_threads())

    worker_thread = threading.Thread(target=update)
    worker_thread.start()
    worker_thread.join()
    assert seen == [2, 1]
    before = torch.get_num_threads()
    with ThreadPolicy(1, 1, passive_wait=True).updating():  # no update count: nothing changes
        assert torch.get_num_threads() == before


@pytest.mark.parametrize(("threads", "interop", "named"), [("0", "auto", "torch_threads"), ("auto", "many", "interop")])
def test_other_values_are_a_config_error_naming_the_field(threads: str, interop: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ThreadPolicy.from_config(threads, interop)


APPLY = """
import json, os, sys
from alight.trainer.threads import ThreadPolicy
ThreadPolicy(int(sys.argv[1]), 1, passive_wait=sys.argv[2] == "passive").apply()
import torch
print(json.dumps([torch.get_num_threads(), torch.get_num_interop_threads(), os.environ.get("OMP_WAIT_POLICY")]))
"""


@pytest.mark.parametrize(
    ("wait", "environment", "expected_policy"),
    [("passive", None, "PASSIVE"), ("passive", "ACTIVE", "ACTIVE")],
)
def test_applying_sets_the_thread_counts_and_the_wait_policy_before_torch_loads(
    wait: str, environment: str | None, expected_policy: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if environment is not None:
        env["OMP_WAIT_POLICY"] = environment  # the user's choice stays
    done = subprocess.run(
        [sys.executable, "-c", APPLY, "1", wait], capture_output=True, text=True, env=env, cwd=REPO, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [1, 1, expected_policy]


def test_a_worker_keeps_its_agent_to_one_sleeping_thread_unless_the_environment_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    environment = {"OMP_NUM_THREADS": "3"}
    monkeypatch.setattr(worker.os, "environ", environment)
    worker._one_thread_for_agents()
    assert environment == {
        "OMP_NUM_THREADS": "3",
        "MKL_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
    }
