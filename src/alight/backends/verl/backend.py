"""`VerlBackend` (`trainer.backend: verl`): verl's workers on Ray update the policy (work in progress)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alight.config.schema import ExperimentConfig
from alight.errors import ConfigError

#: Top-level modules the backend imports; without any of them, choosing it is a one-line error.
NEEDS = ("verl", "ray", "tensordict")
INSTALL = 'pip install "alight[verl]"'


class VerlBackend:
    colocated = True

    @classmethod
    def check_config(cls, cfg: ExperimentConfig) -> None:
        missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(f"trainer.backend verl needs {', '.join(missing)}: {INSTALL}")

    @classmethod
    def from_config(cls, cfg: ExperimentConfig, model_dir: Path) -> Any:
        raise ConfigError("trainer.backend verl: not implemented yet")
