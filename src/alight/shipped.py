"""The experiments alight ships: its configs by name, the recipes (agents, data) they run, and a copy
of one to start from.

An installed wheel carries them at `alight/_shipped/{configs,recipes,examples}`; a checkout has them at
its root. `alight train calc` reads `configs/calc.yaml` from there, `alight recipes` lists them and
`alight init calc` copies one with the recipe folders it names into the user's folder."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from alight.errors import ConfigError

#: The shipped folders a config may name (`../recipes/calc/agent.py`) and `alight init` copies.
FOLDERS = ("recipes", "examples")
#: What a copy leaves out: caches and a recipe's generated files.
_IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")


def shipped_root() -> Path | None:
    """The folder holding `configs/`, `recipes/` and `examples/`: the wheel's `alight/_shipped`, or
    the checkout's root; None where neither is there."""
    package = Path(__file__).resolve().parent
    for root in (package / "_shipped", package.parents[1]):
        if (root / "configs").is_dir() and (root / "recipes").is_dir():
            return root
    return None


def shipped_configs() -> dict[str, Path]:
    """Each shipped experiment's name (its config file's stem) and config file, by name."""
    root = shipped_root()
    if root is None:
        return {}
    return {path.stem: path for path in sorted((root / "configs").glob("*.yaml"))}


def summary(config: Path, width: int = 110) -> str:
    """A config's one-line description: the first sentence of its opening comment (up to the first
    command example), cut to `width` characters."""
    words: list[str] = []
    for line in config.read_text().splitlines():
        text = line.lstrip("#").strip()
        if not line.startswith("#") or line.startswith("#  ") or not text:
            break
        words.append(text)
    sentence = " ".join(words)
    sentence = sentence.split(". ", 1)[0].rstrip(".:")
    return sentence if len(sentence) <= width else sentence[: width - 3].rstrip() + "..."


def find_config(spec: str | Path) -> Path:
    """The config file `spec` names: a file path as it is, else a shipped experiment's name
    (`calc`). Neither: a one-line ConfigError naming the nearest names."""
    path = Path(spec).expanduser()
    if path.is_file() or path.suffix in (".yaml", ".yml") or len(path.parts) > 1:
        return path  # a path: load_config says what is wrong with it
    configs = shipped_configs()
    if str(spec) in configs:
        return configs[str(spec)]
    import difflib

    near = difflib.get_close_matches(str(spec), list(configs), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(near)}?" if near else ""
    raise ConfigError(
        f"no config file {spec!s} here and no shipped experiment named {str(spec)!r}{hint} "
        "(`alight recipes` lists them)"
    )


@dataclass(frozen=True)
class Copied:
    """What `init_recipe` wrote: the config and the folders copied beside it."""

    config: Path
    folders: list[Path]


def referenced_folders(config: Path, root: Path) -> list[str]:
    """The shipped folders (`recipes/calc`, `examples/node_agent`) a config names, with those its
    recipes name in turn (calc_autogen loads calc's agent), in the order found."""
    pattern = re.compile(r"\b(" + "|".join(FOLDERS) + r")/([A-Za-z0-9_.-]+)")
    found: list[str] = []
    texts = [config.read_text()]
    while texts:
        for kind, name in pattern.findall(texts.pop()):
            folder = f"{kind}/{name}"
            if folder in found or not (root / folder).is_dir():
                continue
            found.append(folder)
            texts.extend(p.read_text(errors="replace") for p in sorted((root / folder).rglob("*.py")))
    return found


def init_recipe(name: str, folder: Path, *, force: bool = False) -> Copied:
    """Copy the shipped experiment `name` into `folder`: `folder/<name>.yaml` and the recipe and
    example folders it names, its paths rewritten from `../recipes/...` to `recipes/...` (a
    config's relative paths are read against its own folder). An existing file is not
    overwritten unless `force`."""
    source = find_config(name)  # an unknown name: the error that names the closest
    root = shipped_root()
    if root is None or shipped_configs().get(name) != source:
        raise ConfigError(f"{name!r} is a file, not a shipped experiment's name (`alight recipes` lists them)")
    target = folder / source.name
    folders = referenced_folders(source, root)
    clashes = [p for p in [target, *(folder / f for f in folders)] if p.exists()]
    if clashes and not force:
        raise ConfigError(f"{clashes[0]} exists: pick an empty folder, or --force to overwrite")
    folder.mkdir(parents=True, exist_ok=True)
    text = source.read_text()
    for kind in FOLDERS:
        text = text.replace(f"../{kind}/", f"{kind}/")
    target.write_text(text)
    for shipped in folders:
        shutil.copytree(root / shipped, folder / shipped, ignore=_IGNORED, dirs_exist_ok=True)
    return Copied(target, [folder / f for f in folders])
