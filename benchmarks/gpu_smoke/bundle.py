"""A folder of wheels carried to an offline machine in files of at most `limit` bytes.

`split_folder` cuts every file larger than the limit into `NAME.partNNN` pieces and writes
`manifest.json` (each file's name, size and sha256, and its parts with theirs); `join_folder`
puts the pieces back together beside them, checking every sha256. Standard library only: the GPU
machine runs it before anything is installed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
LIMIT = 60 * 1000 * 1000  # 60 MB: what the upload of one file may weigh
CHUNK = 1 << 20


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split_folder(folder: Path, limit: int = LIMIT) -> dict[str, Any]:
    """Cut each file of `folder` over `limit` bytes into parts (the whole file removed) and write
    the manifest; returns it. Every file left in the folder is then at most `limit` bytes."""
    entries = []
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != MANIFEST):
        if ".part" in path.suffix:
            continue
        entry: dict[str, Any] = {"name": path.name, "size": path.stat().st_size, "sha256": sha256(path), "parts": []}
        if entry["size"] > limit:
            with path.open("rb") as f:
                index = 0
                while block := f.read(limit):
                    part = folder / f"{path.name}.part{index:03d}"
                    part.write_bytes(block)
                    entry["parts"].append({"name": part.name, "size": len(block), "sha256": sha256(part)})
                    index += 1
            path.unlink()
        entries.append(entry)
    manifest = {"limit": limit, "files": entries}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def join_folder(folder: Path) -> list[Path]:
    """Reassemble the split files of `folder` from its manifest (parts removed afterwards) and
    check every file's sha256; returns the files. Raises ValueError naming a missing or bad one."""
    manifest = json.loads((folder / MANIFEST).read_text())
    files = []
    for entry in manifest["files"]:
        path = folder / entry["name"]
        if entry["parts"] and not (path.is_file() and sha256(path) == entry["sha256"]):
            with path.open("wb") as out:
                for part in entry["parts"]:
                    piece = folder / part["name"]
                    if not piece.is_file():
                        raise ValueError(f"{part['name']} is missing (part of {entry['name']})")
                    if sha256(piece) != part["sha256"]:
                        raise ValueError(f"{part['name']} is damaged (sha256 differs)")
                    out.write(piece.read_bytes())
            for part in entry["parts"]:
                (folder / part["name"]).unlink()
        if not path.is_file() or sha256(path) != entry["sha256"]:
            raise ValueError(f"{entry['name']} is missing or damaged (sha256 differs)")
        files.append(path)
    return files
