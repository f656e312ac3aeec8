"""What each training step consumed: `consumed.jsonl` in the run directory, one line per step,
`{"step": s, "attempts": [[rollout_id, attempt_id], ...]}`: the distinct attempts whose
transitions the step's update trained on, and `"set_aside": [rollout_id, ...]` where the step left
succeeded rollouts out on purpose (the async loop's groups past its staleness bound).

It is written with the step's metrics and cut back with them when a run resumes from a
checkpoint (the steps after it are redone), so the file lists what the model of the run's last
checkpoint-and-after has trained on: an attempt on two lines was trained twice, a succeeded
training rollout of a finished step on none was lost. The fault soak (`benchmarks/fault_soak.py`)
checks both against the store.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from alight.errors import TrainingError
from alight.trainer.checkpoint import disk_full

if TYPE_CHECKING:
    from alight.algorithms.batch import TransitionBatch
    from alight.store.base import Store

LEDGER_FILE = "consumed.jsonl"
#: The key of a step's metrics under which the loop hands over its consumed attempts (`consumed`);
#: `RunSession.record` takes it out before the metrics are logged or shown.
CONSUMED = "_consumed"
#: The key of the rollouts a step set aside without training on them (the async loop's stale groups).
SET_ASIDE = "_set_aside"


def consumed(batch: TransitionBatch | None) -> list[list[str]]:
    """The distinct (rollout id, attempt id) pairs of a batch's transitions, in their order."""
    if batch is None:
        return []
    pairs = zip(batch.meta["rollout_id"], batch.meta["attempt_id"], strict=True)
    return [[str(r), str(a)] for r, a in dict.fromkeys(pairs)]


def append_line(file: IO[bytes], line: bytes, folder: Path, what: str) -> None:
    """Write `line` to the end of `file` (opened unbuffered) whole and durably, or not at all: a
    disk that fills meanwhile is a one-line TrainingError naming `what`, the file cut back."""
    fd = file.fileno()
    size = os.fstat(fd).st_size
    try:
        written = 0
        while written < len(line):
            written += os.write(fd, line[written:])
        os.fsync(fd)
    except OSError as err:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        full = disk_full(err, folder)
        if full is None:
            raise
        raise TrainingError(f"{what} could not be written to {file.name}: {full}") from None


def read_ledger(run_dir: Path) -> list[dict[str, Any]]:
    """The ledger's lines (a torn last line left out)."""
    path = Path(run_dir) / LEDGER_FILE
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


class Ledger:
    """The run's ledger file, appended to one step at a time (see the module docstring)."""

    def __init__(self, run_dir: Path, *, resume: bool) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LEDGER_FILE
        self._file = self.path.open("ab" if resume else "wb", buffering=0)

    def append(self, step: int, attempts: Sequence[Sequence[str]], set_aside: Sequence[str] = ()) -> None:
        row: dict[str, Any] = {"step": step, "attempts": [list(pair) for pair in attempts]}
        if set_aside:
            row["set_aside"] = list(set_aside)
        line = json.dumps(row, separators=(",", ":"))
        append_line(self._file, (line + "\n").encode(), self.run_dir, f"the consumed attempts of step {step}")

    def truncate_after(self, step: int) -> None:
        """Keep the lines of steps <= `step` (a resumed run redoes the later ones)."""
        kept = [row for row in read_ledger(self.run_dir) if isinstance(row.get("step"), int) and row["step"] <= step]
        self._file.close()
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row, separators=(",", ":")) + "\n" for row in kept))
        os.replace(tmp, self.path)
        self._file = self.path.open("ab", buffering=0)

    def close(self) -> None:
        self._file.close()


@dataclass
class Audit:
    """What a run's ledger says against its store (see `audit`)."""

    steps: int  # ledger lines (steps whose update the run kept)
    consumed: int  # attempts trained on
    twice: list[str] = field(default_factory=list)  # rollouts trained on in two steps (or two attempts)
    lost: list[str] = field(default_factory=list)  # succeeded training rollouts of a kept step, never trained on
    set_aside: int = 0  # rollouts the ledger says were left out on purpose (stale)
    not_latest: list[str] = field(default_factory=list)  # trained on an attempt other than the rollout's last
    unconsumed: list[str] = field(default_factory=list)  # succeeded, of a later step (in flight at the end)

    @property
    def clean(self) -> bool:
        return not (self.twice or self.lost or self.not_latest)


async def audit(store: Store, run_dir: Path) -> Audit:
    """Check the run's ledger against its store: no rollout trained on twice, every succeeded
    training rollout of a step the ledger holds trained on (by the sync loops' tags: `step`
    metadata), each through its latest attempt."""
    from alight.types import RolloutMode, RolloutStatus

    rows = read_ledger(run_dir)
    pairs = [(str(r), str(a)) for row in rows for r, a in row.get("attempts", [])]
    by_rollout = Counter(r for r, _ in pairs)
    result = Audit(steps=len(rows), consumed=len(pairs))
    result.twice = sorted(r for r, n in by_rollout.items() if n > 1)
    last = max((row["step"] for row in rows), default=0)
    aside = {str(r) for row in rows for r in row.get("set_aside", [])}
    result.set_aside = len(aside)
    for rollout in await store.list_rollouts(mode=RolloutMode.TRAIN):
        if rollout.status != RolloutStatus.SUCCEEDED or rollout.rollout_id in by_rollout or rollout.rollout_id in aside:
            continue
        step = rollout.metadata.get("step")
        (result.lost if isinstance(step, int) and step <= last else result.unconsumed).append(rollout.rollout_id)
    for rollout_id, attempt_id in dict.fromkeys(pairs):
        attempts = await store.list_attempts(rollout_id)
        if not attempts or attempts[-1].attempt_id != attempt_id:
            result.not_latest.append(rollout_id)
    return result
