"""The loops a run can be: one `Loop` protocol, one file per loop, and `make_loop` to choose.

| loop | chosen by | file |
| --- | --- | --- |
| RL (GRPO, PPO, SFT on the agent's best rollouts) | `algorithm.name` grpo, ppo, sft | `rl.py` |
| asynchronous RL (runners never wait for the update) | the same with `trainer.mode: async` | `async_rl.py` |
| APO (prompt search, no weight changes) | `algorithm.name: apo` | `apo.py` |
| fine-tuning from a stored run | `algorithm.name: sft` with `data.from_store` | `sft_store.py` |

Each loop composes the shared parts (`alight.trainer.session.RunSession`: run directory, metrics,
signals, the result; `alight.trainer.policy.Policy`: starting weights, backend, warm start,
checkpoints; `alight.trainer.stack.LocalStack`; `alight.trainer.validation`) rather than overriding
another loop's hooks (`common.py`: the parts and the step driver they share; `feeder.py`: the async
loop's bounded queue of groups). A new loop is a new file here plus a line in `LOOPS`; its class
states what the run asks of it (`LoopKind`: whether it trains weights, reads train rows, its own checks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from alight.config.schema import ExperimentConfig
from alight.parts import Registry
from alight.trainer.result import FitResult

Rows = list[dict[str, Any]]


class LoopKind:
    """What the run asks of a loop's class (its defaults: an RL loop)."""

    trains_weights: ClassVar[bool] = True  # updates the policy (a backend, a trainable engine)
    reads_train_rows: ClassVar[bool] = True  # runs on `data.train` (fine-tuning from a store reads its rows there)

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        """ConfigError, in one line, for this loop's own settings (the shared ones are `validate`'s)."""
        return None


#: The loops by kind (`loop_kind` picks one from the config), imported when chosen.
LOOPS: Registry[LoopKind] = Registry(
    "loop",
    {
        "rl": "alight.trainer.loops.rl:RLLoop",
        "async_rl": "alight.trainer.loops.async_rl:AsyncRLLoop",
        "apo": "alight.trainer.loops.apo:ApoLoop",
        "sft_store": "alight.trainer.loops.sft_store:SFTStoreLoop",
    },
)


@dataclass(frozen=True)
class LoopInput:
    """What every loop is built from: the (validated, `alight.trainer.checks`) config, the run
    directory, the data rows, whether to resume the newest checkpoint, and the event watchers."""

    cfg: ExperimentConfig
    run_dir: Path
    train_rows: Rows
    val_rows: Rows | None
    resume: bool = False
    watchers: Sequence[Any] = field(default_factory=tuple)  # each has some of TrainerEvents' methods, not all


class Loop(Protocol):
    """One run of one algorithm in a run directory, built as `cls(LoopInput(...))`: `run()` does
    all of it and returns the result."""

    def run(self) -> FitResult: ...


def loop_kind(cfg: ExperimentConfig) -> str:
    """Which loop runs `cfg` (a kind in `LOOPS`): decided once per run, by `validate`."""
    if cfg.data.from_store is not None:
        return "sft_store"
    if cfg.algorithm.name == "apo":
        return "apo"
    return "async_rl" if cfg.trainer.mode == "async" else "rl"


def make_loop(
    kind: str,
    cfg: ExperimentConfig,
    run_dir: Path,
    train_rows: Rows,
    val_rows: Rows | None,
    *,
    resume: bool = False,
    watchers: Sequence[Any] = (),
) -> Loop:
    """The loop of `kind` (see `LOOPS`; `validate` chose it) running `cfg`."""
    cls: Any = LOOPS.get(kind)
    loop: Loop = cls(LoopInput(cfg, run_dir, train_rows, val_rows, resume, watchers))
    return loop
