"""Entrypoints: user code named in a config as `package.module:name` or `path/to/file.py:name`."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import zlib
from pathlib import Path
from typing import Any

from alight.errors import ConfigError, one_line


def resolve_entrypoint(entrypoint: str, *, what: str = "entrypoint") -> Any:
    """The object an entrypoint names. Problems raise a one-line ConfigError starting with `what`."""
    module_part, sep, attr = entrypoint.rpartition(":")
    if not sep or not module_part or not attr:
        raise ConfigError(f"{what} entrypoint {entrypoint!r} must look like 'module:function' or 'file.py:function'")
    module = _import_module(module_part, entrypoint, what)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} entrypoint {entrypoint!r}: {module_part} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def _import_module(module_part: str, entrypoint: str, what: str) -> Any:
    prefix = f"{what} entrypoint {entrypoint!r}"
    if module_part.endswith(".py") or "/" in module_part:
        path = Path(module_part).expanduser().resolve()
        if not path.is_file():
            raise ConfigError(f"{prefix}: no such file {module_part}")
        # A stable name per file, so every process (and pickle) sees the same module.
        name = f"alight_user_{path.stem}_{zlib.crc32(str(path).encode()):08x}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"{prefix}: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        # The file's folder is importable, as when the user runs the file directly.
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[name]
            raise ConfigError(f"{prefix}: importing {module_part} failed: {one_line(err)}") from None
        return module
    # As with `python -m`, modules of the working directory (a project's own packages) are importable.
    cwd = str(Path.cwd())
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        return importlib.import_module(module_part)
    except ModuleNotFoundError as err:
        if err.name and module_part.startswith(err.name):
            raise ConfigError(f"{prefix}: no module named {err.name!r}") from None
        raise ConfigError(f"{prefix}: importing {module_part} failed: {one_line(err)}") from None
    except Exception as err:
        raise ConfigError(f"{prefix}: importing {module_part} failed: {one_line(err)}") from None
