"""The fault soak: a training run that keeps going while its parts are killed, frozen, restarted
and cut off, checked against fault-free runs of the same seed.

Each case runs `alight train` `--clean` times without faults, then once with a seeded schedule of
faults (benchmarks/faults.py), one every `--every` seconds from the first RL step on:

  runner_kill     SIGKILL a runner worker (its attempt fails; the supervisor starts another worker)
  runner_stop     SIGSTOP a runner worker (past its attempt's deadline the supervisor kills it)
  engine_kill     SIGKILL the vLLM server (vllm cases: the engine restarts it on the current weights)
  store_restart   SIGKILL the store server, start it again a second later on the same file
  proxy_drop      abort every connection between the agents and the proxy (a relay carries them)
  trainer_kill    SIGKILL `alight train` and everything it started, then `alight train --resume`

The store runs as a server of its own (`alight store --db`, `store.url`), so it can be killed and
outlives the trainer; agents reach the proxy through the relay (`proxy.advertise_url`).

Rows per case (STYLE.md's format):

  faults/<kind>             faults of that kind injected
  survived                  faults after which the run went on to log another step (or ended well)
  lost_s/<kind>             median seconds the step a fault hit took beyond the same step of the
                            fault-free runs (their median); trainer_kill: from the kill to the
                            resumed run's next step, beyond that step's fault-free time. Faults
                            that hit one step share its overrun (faults faster than steps)
  restarts/<part>           restarts counted by the run (faults/* metrics summed over its processes)
  transitions_lost          succeeded training rollouts of a kept step never trained on (ledger audit)
  trained_twice             rollouts trained on in two steps (ledger audit)
  not_latest_attempt        rollouts trained on through an attempt other than their last
  rollouts_failed           training rollouts that ended failed or timed out
  val_reward_final          the faulted run's last greedy validation
  val_reward_clean_min/max  the fault-free runs' spread of it
  within_spread             1 when the faulted run's lies within it
  wall_s, wall_s_clean      the faulted run's wall, and the fault-free runs' median

Usage: python benchmarks/fault_soak.py [--json] [--cases calc_sync,calc_async] [--seed 0]
       [--every 6] [--clean 3] [--kinds runner_kill,...] [--keep DIR]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench_report import Row, arguments, emit
from faults import KINDS, Fault, Relay, schedule

REPO = Path(__file__).resolve().parents[1]
ALIGHT = [sys.executable, "-m", "alight"]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
CALC = [
    "trainer.steps=30",
    "trainer.val_every=10",
    "trainer.save_every=3",
    "trainer.keep_checkpoints=2",
    "data.val_size=32",
    "runner.timeout_s=20",  # an attempt past this is killed: a frozen runner costs 20 s, not the config's 120
]


@dataclass(frozen=True)
class Case:
    config: str
    overrides: tuple[str, ...]
    kinds: tuple[str, ...]
    every_s: float | None = None  # seconds between faults (None: --every)


NO_ENGINE = tuple(k for k in KINDS if k != "engine_kill")
CASES = {
    "calc_sync": Case("configs/calc.yaml", tuple(CALC), NO_ENGINE),
    "calc_async": Case("configs/calc.yaml", (*CALC, "trainer.mode=async"), NO_ENGINE),
    "calc_smol": Case(
        "configs/calc_smol.yaml",  # SmolLM2-135M: 6 steps, validation at each
        ("trainer.save_every=1", "runner.timeout_s=60"),
        NO_ENGINE,
    ),
    "calc_vllm": Case(
        "configs/calc.yaml",
        (
            *CALC[3:-2],
            "trainer.steps=6",
            "trainer.val_every=3",
            "trainer.save_every=1",
            "data.val_size=16",
            "runner.timeout_s=60",
            "engine.kind=vllm",
            f"+engine.options.python={VLLM_PYTHON}",
            "+engine.options.kv_cache_gib=1",
            "+engine.options.dtype=float32",
        ),
        ("engine_kill", "proxy_drop", "runner_kill"),
        every_s=30.0,  # a vLLM restart takes ~25 s on the CPU build: within its budget (5 in 600 s)
    ),
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class StoreProcess:
    """`alight store --db FILE --port P` as a process of its own, to kill and start again."""

    def __init__(self, db: Path, port: int) -> None:
        self.db, self.port = db, port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = [*ALIGHT, "store", "--db", str(self.db), "--port", str(self.port)]
        self.process = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.1)
        raise SystemExit("the store server did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)


@dataclass
class Segment:
    """One `alight train` process of the run (the first, or one resumed after a trainer kill)."""

    process: subprocess.Popen[str]
    lines: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (arrival time, JSON line)
    stderr: list[str] = field(default_factory=list)


class Run:
    """One training run with its own store server and relay; faults injected from outside."""

    def __init__(self, case: Case, run_dir: Path, seed: int) -> None:
        self.case, self.run_dir, self.seed = case, run_dir, seed
        self.store = StoreProcess(run_dir.parent / f"{run_dir.name}-store.db", free_port())
        self.proxy_port = free_port()
        self.relay = Relay(self.proxy_port)
        self.segments: list[Segment] = []
        self.started = 0.0

    def command(self, resume: bool) -> list[str]:
        overrides = [
            *self.case.overrides,
            f"trainer.seed={self.seed}",
            f"store.url={self.store.url}",
            f"proxy.port={self.proxy_port}",
            f"proxy.advertise_url={self.relay.url}",
        ]
        cmd = [*ALIGHT, "train", self.case.config, *overrides, "--no-dashboard", "--run-dir", str(self.run_dir)]
        return [*cmd, "--resume"] if resume else cmd

    def launch(self, resume: bool = False) -> Segment:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = subprocess.Popen(
            self.command(resume), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        segment = Segment(process)
        threading.Thread(target=_read_lines, args=(process.stdout, segment.lines), daemon=True).start()
        threading.Thread(target=_read_text, args=(process.stderr, segment.stderr), daemon=True).start()
        self.segments.append(segment)
        return segment

    def start(self) -> None:
        self.run_dir.parent.mkdir(parents=True, exist_ok=True)
        self.store.start()
        self.relay.start()
        self.started = time.monotonic()
        self.launch()

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    def steps(self) -> list[tuple[float, int]]:
        """(arrival time, step) of every step line so far, over all segments."""
        return [(t, row["step"]) for s in self.segments for t, row in s.lines if "step" in row and "event" not in row]

    def wait_for_rl(self, timeout_s: float = 1800.0) -> float:
        """Wait for the step-0 line (the warm start done); its time."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.steps():
                return self.steps()[0][0]
            if self.current.process.poll() is not None:
                raise SystemExit(f"the run ended before its first step: {''.join(self.current.stderr)[-2000:]}")
            time.sleep(0.2)
        raise SystemExit("no first step in time")

    def running(self) -> bool:
        return self.current.process.poll() is None

    def workers(self) -> list[psutil.Process]:
        try:
            children = psutil.Process(self.current.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        return [p for p in children if _cmdline(p).count("spawn_main") and p.status() != psutil.STATUS_STOPPED]

    def inject(self, kind: str, rng_pick: int) -> bool:
        """Inject one fault; False when there was nothing to inject it into."""
        if kind in ("runner_kill", "runner_stop"):
            workers = self.workers()
            if not workers:
                return False
            victim = workers[rng_pick % len(workers)]
            victim.send_signal(signal.SIGKILL if kind == "runner_kill" else signal.SIGSTOP)
        elif kind == "engine_kill":
            servers = [p for p in _descendants(self.current.process.pid) if "vllm.entrypoints" in _cmdline(p)]
            if not servers:
                return False
            servers[0].kill()
        elif kind == "store_restart":
            self.store.kill()
            time.sleep(1.0)
            self.store.start()
        elif kind == "proxy_drop":
            self.relay.drop()
        elif kind == "trainer_kill":
            _kill_tree(self.current.process.pid)
            self.current.process.wait()
            self.launch(resume=True)
        return True

    def finish(self, timeout_s: float = 3600.0) -> int:
        code = self.current.process.wait(timeout_s)
        time.sleep(0.5)  # the reader threads take the last lines
        return code

    def close(self) -> None:
        for segment in self.segments:
            if segment.process.poll() is None:
                _kill_tree(segment.process.pid)
        self.relay.stop()
        self.store.stop()


def _read_lines(stream: Any, into: list[tuple[float, dict[str, Any]]]) -> None:
    for line in stream:
        try:
            into.append((time.monotonic(), json.loads(line)))
        except ValueError:
            continue


def _read_text(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def _cmdline(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid`, its process group and every descendant (the vLLM server has a session of its own)."""
    for process in _descendants(pid):
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def step_times(run: Run) -> dict[int, float]:
    """Seconds each step took (its line's arrival after the previous step's), the last try of each."""
    durations: dict[int, float] = {}
    previous: float | None = None
    for arrived, step in run.steps():
        if previous is not None and step > 0:
            durations[step] = arrived - previous
        previous = arrived
    return durations


def final_metrics(run: Run) -> tuple[float | None, dict[str, float]]:
    """The run's last validation reward (its metrics file) and its restarts: the faults/* counters of
    each process's last step, summed over the processes."""
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    val = [r["val/reward_mean"] for r in rows if r.get("val/reward_mean") is not None]
    restarts: dict[str, float] = {}
    for segment in run.segments:
        last = [row for _, row in segment.lines if "step" in row and "event" not in row]
        for key, value in (last[-1] if last else {}).items():
            if key.startswith("faults/"):
                name = "restarts/" + key.removeprefix("faults/")
                restarts[name] = restarts.get(name, 0) + value
    return (val[-1] if val else None), restarts


def audit_run(run: Run) -> tuple[Any, int]:
    """The ledger audit against the run's store, and its failed training rollouts."""
    from alight.store.sqlite import SqliteStore
    from alight.trainer.ledger import audit
    from alight.types import RolloutMode, RolloutStatus

    async def go() -> tuple[Any, int]:
        store = SqliteStore(run.store.db)
        try:
            train = await store.list_rollouts(mode=RolloutMode.TRAIN)
            failed = sum(r.status in (RolloutStatus.FAILED, RolloutStatus.TIMEOUT) for r in train)
            return await audit(store, run.run_dir), failed
        finally:
            await store.close()

    return asyncio.run(go())


def clean_run(case: Case, folder: Path, seed: int) -> Run:
    run = Run(case, folder / "run", seed)
    try:
        run.start()
        code = run.finish()
        if code != 0:
            raise SystemExit(f"a fault-free run failed ({code}): {''.join(run.current.stderr)[-2000:]}")
    finally:
        run.close()
    return run


def faulted_run(case: Case, folder: Path, seed: int, faults: list[Fault]) -> tuple[Run, list[dict[str, Any]]]:
    run = Run(case, folder / "run", seed)
    injected: list[dict[str, Any]] = []
    try:
        run.start()
        rl_started = run.wait_for_rl()
        for i, fault in enumerate(faults):
            while run.running() and time.monotonic() < rl_started + fault.at_s:
                time.sleep(0.1)
            if not run.running():
                break
            at = time.monotonic()
            if run.inject(fault.kind, rng_pick=i * 7 + seed):
                injected.append({"kind": fault.kind, "at": at, "segment": len(run.segments) - 1})
                print(f"  fault {fault.kind} at {at - rl_started:.1f} s", file=sys.stderr, flush=True)
        code = run.finish()
        if code != 0:
            raise SystemExit(f"the faulted run failed ({code}): {''.join(run.current.stderr)[-3000:]}")
    finally:
        run.close()
    return run, injected


def fault_rows(name: str, run: Run, injected: list[dict[str, Any]], clean: dict[int, float]) -> list[Row]:
    """Faults by kind, survived, and the seconds each kind cost beyond the fault-free steps."""
    steps = run.steps()
    rows: list[Row] = []
    lost: dict[str, list[float]] = {}
    survived = 0
    for fault in injected:
        after = [(t, s) for t, s in steps if t > fault["at"]]
        before = [t for t, _ in steps if t <= fault["at"]]
        if after or run.current.process.returncode == 0:
            survived += 1
        if after and before:
            took = after[0][0] - before[-1]
            lost.setdefault(fault["kind"], []).append(round(took - clean.get(after[0][1], took), 2))
    counts: dict[str, int] = {}
    for fault in injected:
        counts[fault["kind"]] = counts.get(fault["kind"], 0) + 1
    rows += [{"case": name, "metric": f"faults/{kind}", "value": n} for kind, n in sorted(counts.items())]
    rows.append({"case": name, "metric": "faults", "value": len(injected)})
    rows.append({"case": name, "metric": "survived", "value": survived})
    for kind, values in sorted(lost.items()):
        rows.append({"case": name, "metric": f"lost_s/{kind}", "value": round(statistics.median(values), 1)})
    return rows


def run_case(name: str, case: Case, seed: int, every_s: float, n_clean: int, kinds: tuple[str, ...],
             keep: Path | None) -> list[Row]:  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix=f"alight-soak-{name}-"))
    try:
        clean_runs = []
        for i in range(n_clean):
            print(f"{name}: fault-free run {i + 1}/{n_clean}", file=sys.stderr, flush=True)
            clean_runs.append(clean_run(case, work / f"clean{i}", seed))
        clean_steps: dict[int, list[float]] = {}
        for run in clean_runs:
            for step, took in step_times(run).items():
                clean_steps.setdefault(step, []).append(took)
        clean_median = {step: statistics.median(values) for step, values in clean_steps.items()}
        clean_walls = [run.steps()[-1][0] - run.started for run in clean_runs]
        clean_vals = [final_metrics(run)[0] for run in clean_runs]
        duration = sum(clean_median.values())
        faults = schedule(seed, kinds, every_s=every_s, duration_s=max(duration - every_s / 2, every_s))
        print(f"{name}: faulted run, {len(faults)} faults: {[f.kind for f in faults]}", file=sys.stderr, flush=True)
        run, injected = faulted_run(case, work / "faulted", seed, faults)
        found, failed = audit_run(run)
        val, restarts = final_metrics(run)
        rows = fault_rows(name, run, injected, clean_median)
        rows += [{"case": name, "metric": key, "value": value} for key, value in sorted(restarts.items())]
        finite = [v for v in clean_vals if v is not None]
        low, high = (min(finite), max(finite)) if finite else (None, None)
        within = int(val is not None and low is not None and high is not None and low <= val <= high)
        rows += [
            {"case": name, "metric": "transitions_lost", "value": len(found.lost)},
            {"case": name, "metric": "trained_twice", "value": len(found.twice)},
            {"case": name, "metric": "not_latest_attempt", "value": len(found.not_latest)},
            {"case": name, "metric": "attempts_trained", "value": found.consumed},
            {"case": name, "metric": "rollouts_failed", "value": failed},
            {"case": name, "metric": "val_reward_final", "value": val},
            {"case": name, "metric": "val_reward_clean_min", "value": low},
            {"case": name, "metric": "val_reward_clean_max", "value": high},
            {"case": name, "metric": "within_spread", "value": within},
            {"case": name, "metric": "wall_s", "value": round(run.steps()[-1][0] - run.started, 1)},
            {"case": name, "metric": "wall_s_clean", "value": round(statistics.median(clean_walls), 1)},
        ]
        if keep is not None:
            target = keep / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(work / "faulted" / "run", target / "run", ignore=shutil.ignore_patterns("checkpoints"))
            (target / "faults.json").write_text(
                json.dumps([{**f, "at": round(f["at"] - run.started, 2)} for f in injected])
            )
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = arguments(__doc__, cases="calc_sync,calc_async", repeat=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=float, default=6.0, help="seconds between faults")
    parser.add_argument("--clean", type=int, default=3, help="fault-free runs to compare with")
    parser.add_argument("--kinds", default="", help="fault kinds (default: the case's)")
    parser.add_argument("--keep", type=Path, default=None, help="copy the faulted runs (without checkpoints) here")
    args = parser.parse_args()
    rows: list[Row] = []
    for name in args.cases.split(","):
        case = CASES[name]
        kinds = tuple(args.kinds.split(",")) if args.kinds else case.kinds
        rows += run_case(name, case, args.seed, case.every_s or args.every, args.clean, kinds, args.keep)
    emit("fault_soak", rows, as_json=args.json, title="a training run under injected faults")


if __name__ == "__main__":
    main()
