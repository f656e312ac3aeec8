"""`Trainer`: the Python API under `alight train` and `alight dev`.

    trainer = alight.Trainer(cfg)                      # an ExperimentConfig (see alight.config)
    result = trainer.fit(agent, train_rows, val_rows)  # or entrypoints / data specs, or the config's

`fit` prepares the run directory and the policy (the tiny model built with the run's seed, or the
configured model), runs the supervised warm start when configured, starts the local stack (store,
proxy + engine serving the warm-started checkpoint, runner pool) and runs the RL loop
(`alight.trainer.loops`). `resume=True` continues the newest checkpoint of the run directory.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError, TrainingError
from alight.trainer.result import FitResult
from alight.trainer.run_dir import latest_run_dir, new_run_dir

logger = logging.getLogger(__name__)

__all__ = ["FitResult", "Trainer", "TrainingError", "entrypoint_of"]
Rows = Sequence[dict[str, Any]]


def entrypoint_of(agent: Any) -> str:
    """The `module:name` (or `file.py:name`) entrypoint runner processes import for `agent`."""
    if isinstance(agent, str):
        return agent
    target = getattr(agent, "fn", None) or agent
    module_name = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    module = sys.modules.get(module_name or "")
    if module is None or name is None or "<locals>" in name:
        raise ConfigError(
            f"agent {agent!r} is not importable by name; define it at module level or pass 'module:function'"
        )
    if module_name == "__main__" or (module_name or "").startswith("alight_user_"):
        file = getattr(module, "__file__", None)
        if file is None:
            raise ConfigError("an agent defined interactively cannot run in runner processes; put it in a file")
        return f"{file}:{name}"
    return f"{module_name}:{name}"


class Trainer:
    """Trains the model behind an agent with the experiment's algorithm; see the module docstring.

    `watchers` receive the run's events (`alight.trainer.events.TrainerEvents`): the CLI passes the
    dashboard or the JSON-lines reporter. `run_dir` defaults to `{output_dir}/{name}-{timestamp}`;
    with `resume`, to the newest run of the experiment that holds a checkpoint.
    """

    def __init__(
        self,
        cfg: ExperimentConfig | None = None,
        *,
        run_dir: str | Path | None = None,
        resume: bool = False,
        watchers: Iterable[Any] = (),
    ) -> None:
        self.cfg = cfg or ExperimentConfig()
        self.resume = resume
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.watchers = list(watchers)

    # -- the API ----------------------------------------------------------------------------------
    def fit(
        self, agent: Any = None, train_data: Rows | str | None = None, val_data: Rows | str | None = None
    ) -> FitResult:
        """Warm start (if configured) then RL for `trainer.steps` steps (or `epochs` over the data).

        `agent`: a decorated function / LitAgent defined at module level, an entrypoint string or
        a `CommandAgent`; default: the config's `agent.entrypoint` or `agent.command`. `train_data` /
        `val_data`: lists of rows, or data specs; default: `data.train` / `data.val`. Input problems
        raise ConfigError before anything starts."""
        from alight.trainer.checks import validate
        from alight.trainer.loops import LOOPS, make_loop

        cfg = self._config_for(agent)
        kind = validate(cfg)
        assert kind is not None
        reads_rows = LOOPS.get(kind).reads_train_rows
        train_rows = self._rows(train_data, cfg.data.train, cfg.data.train_size, "train") if reads_rows else None
        if not reads_rows:  # fine-tuning from another run's store: no train rows
            train_rows = []
        elif train_rows is None and cfg.algorithm.name == "sft":
            raise ConfigError("algorithm.name=sft needs data.from_store=RUN_DIR (the run to learn from) or data.train")
        elif train_rows is None:
            raise ConfigError("the config names no training data (data.train)")
        val_rows = self._rows(val_data, cfg.data.val, cfg.data.val_size, "val")
        if val_rows is not None and cfg.trainer.val_size is not None:
            val_rows = val_rows[: cfg.trainer.val_size]
        run_dir = self._run_dir(cfg)
        loop = make_loop(kind, cfg, run_dir, train_rows, val_rows, resume=self.resume, watchers=self.watchers)
        return loop.run()

    def dev(self, agent: Any = None, data: Rows | str | None = None, n: int | None = None) -> list[Any]:
        """Run the agent on `n` tasks through the full stack without training (`alight dev`)."""
        from alight.trainer.tasks import run_tasks

        cfg = self._config_for(agent)
        if data is not None:
            if not isinstance(data, str):
                raise ConfigError("Trainer.dev takes data as a spec (file or generator); pass rows to fit")
            cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, val=data))
        return run_tasks(cfg, self.run_dir, n=n).results

    # -- pieces ---------------------------------------------------------------------------------
    def _config_for(self, agent: Any) -> ExperimentConfig:
        from alight.command_agent import CommandAgent

        if agent is None:
            if not self.cfg.agent.entrypoint and self.cfg.agent.command is None:
                raise ConfigError("no agent: pass one to fit() or set agent.entrypoint or agent.command")
            return self.cfg
        if isinstance(agent, CommandAgent):
            chosen = dataclasses.replace(self.cfg.agent, entrypoint=None, command=list(agent.command), name=agent.name)
        else:
            chosen = dataclasses.replace(self.cfg.agent, entrypoint=entrypoint_of(agent), command=None)
        return dataclasses.replace(self.cfg, agent=chosen)

    def _rows(
        self, given: Rows | str | None, spec: str | None, size: int | None, split: str
    ) -> list[dict[str, Any]] | None:
        from alight.data import load_rows

        if given is not None and not isinstance(given, str):
            rows = list(given)
            if not rows:
                raise ConfigError(f"{split} data holds no rows")
            return rows
        source = given if isinstance(given, str) else spec
        if source is None:
            return None
        return load_rows(
            source, size=size, seed=self.cfg.data.seed, generator_kwargs=self.cfg.data.generator_kwargs, split=split
        )

    def _run_dir(self, cfg: ExperimentConfig) -> Path:
        if self.run_dir is not None:
            if self.resume and not self.run_dir.is_dir():
                raise ConfigError(f"--resume: run directory {self.run_dir} does not exist")
            return self.run_dir
        return latest_run_dir(cfg) if self.resume else new_run_dir(cfg)
