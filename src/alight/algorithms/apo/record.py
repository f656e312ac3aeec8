"""What an APO run leaves in its run directory, and reading a prompt back for `alight dev --prompt`
and `alight serve --system-prompt`: `apo/best_prompt.txt` (the prompt alone), `apo/best_prompt.json`
(prompt, score, round, id) and `apo/history.jsonl` (one line per candidate met)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from alight.algorithms.apo.search import Candidate
from alight.errors import ConfigError

APO_DIR = "apo"
BEST_TEXT = "best_prompt.txt"
BEST_JSON = "best_prompt.json"
HISTORY = "history.jsonl"


def _write(path: Path, text: str) -> None:
    """Replace `path` at once (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def save_best(run_dir: Path, best: Candidate) -> Path:
    """Write the best prompt (text and JSON) under `run_dir/apo/`; returns the text file."""
    folder = Path(run_dir) / APO_DIR
    _write(folder / BEST_JSON, json.dumps(best.record(), indent=2) + "\n")
    _write(folder / BEST_TEXT, best.prompt)
    return folder / BEST_TEXT


def append_history(run_dir: Path, candidates: list[Candidate]) -> None:
    """Append one JSON line per candidate to `run_dir/apo/history.jsonl`."""
    path = Path(run_dir) / APO_DIR / HISTORY
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for candidate in candidates:
            out.write(json.dumps(candidate.record()) + "\n")


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history lines of an APO run directory."""
    path = Path(run_dir) / APO_DIR / HISTORY
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_prompt(source: str | Path) -> str:
    """A prompt from an APO run directory (its best prompt), a `best_prompt.json`, or any text
    file (its whole content); ConfigError in one line when there is none."""
    path = Path(source).expanduser()
    if path.is_dir():
        if (path / APO_DIR / BEST_TEXT).is_file():
            path = path / APO_DIR / BEST_TEXT
        elif (path / BEST_TEXT).is_file():
            path = path / BEST_TEXT
        else:
            raise ConfigError(f"{source} holds no APO result ({APO_DIR}/{BEST_TEXT}); give a run directory or a file")
    if not path.is_file():
        raise ConfigError(f"no prompt at {source}: give an APO run directory or a text file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read the prompt {source}: {err}") from None
    if path.suffix == ".json":
        try:
            text = json.loads(text)["prompt"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{source} is not a best_prompt.json (no 'prompt' key)") from None
    return str(text)
