"""Another run's store as supervised data: opened read only and its transitions selected
(`alight.algorithms.sft`), for fine-tuning from a store (`alight.trainer.loops.sft_store`) and
for their export as chat rows (`alight.commands.export`, `alight trace RUN --export-sft`).

A SQLite store (a run directory's `store.db`, or the file) is never opened for writing: a
consistent copy is taken through a read-only connection (SQLite's online backup, which also
reads a live run's write-ahead log) into a temporary directory, and the copy is read. A store
server URL is read through the HTTP client with the token from ALIGHT_TOKEN, asking only reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from alight.algorithms.sft import SelectionCounts, eligible_rollouts, select_transitions
from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.errors import ConfigError, StoreError
from alight.store.base import Store
from alight.trainer.run_dir import STORE_FILE
from alight.types import Transition

if TYPE_CHECKING:
    from alight.adapters import Retokenizer

logger = logging.getLogger(__name__)


@dataclass
class Selection:
    """The transitions chosen from a store, the counts, and (for the export) the LLM spans they came from."""

    transitions: list[Transition]
    counts: SelectionCounts
    spans: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # span id -> LLM span dict


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def store_file(target: str) -> Path:
    """The SQLite file of a run directory or a store file; ConfigError when there is none."""
    path = Path(target).expanduser()
    if path.is_dir():
        if not (path / STORE_FILE).is_file():
            raise ConfigError(f"{target}: not a run directory (it holds no {STORE_FILE})")
        return path / STORE_FILE
    if not path.is_file():
        raise ConfigError(f"{target}: no run directory, store file or store URL there")
    return path


def check_source(target: str | None) -> None:
    """Fail early, in one line, when `target` names no store (a URL is checked when read)."""
    if not target:
        raise ConfigError("data.from_store is empty: give a run directory, a store .db file or a store URL")
    if not is_url(target):
        store_file(target)


def _snapshot(source: Path, copy: Path) -> None:
    """Copy the SQLite database `source` to `copy`, reading it through a read-only connection.

    A store closed cleanly has no write-ahead log: it is read as immutable, which creates no
    `-wal`/`-shm` file beside it. A live (or killed) run's store has one, and its shared-memory
    index: a read-only connection reads both and writes neither."""
    path = source.resolve()
    live = Path(f"{path}-wal").exists()
    uri = f"file:{quote(str(path))}?mode=ro" + ("" if live else "&immutable=1")
    try:
        src = sqlite3.connect(uri, uri=True)
        try:
            dst = sqlite3.connect(copy)
            try:
                src.backup(dst)
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.Error as err:
        raise ConfigError(f"{source}: cannot read it as a store ({err})") from None


@contextlib.asynccontextmanager
async def source_store(target: str) -> AsyncIterator[Store]:
    """The store at `target` (run directory, .db file or store URL), for reading only."""
    from alight.store.factory import StoreSpec, open_store

    if is_url(target):
        from alight.serving.auth import resolve_token

        client = open_store(target, token=resolve_token(), max_retries=1)
        try:
            yield client
        finally:
            await client.close()
        return
    path = store_file(target)
    with tempfile.TemporaryDirectory(prefix="alight-source-") as tmp:
        copy = Path(tmp) / STORE_FILE
        await asyncio.to_thread(_snapshot, path, copy)
        try:
            store = open_store(StoreSpec("sqlite", path=copy), create=False)
        except StoreError as err:
            raise ConfigError(f"{target}: not an alight store ({str(err).splitlines()[0]})") from None
        try:
            yield store
        finally:
            await store.close()


async def select_from_store(
    store: Store, adapter: AdapterConfig, algorithm: AlgorithmConfig, *, tokenizer: Retokenizer | None = None
) -> Selection:
    """The transitions of the store's succeeded rollouts in `algorithm.sft.splits`, cut by the
    adapter (agent_match, mode, truncation; `tokenizer` rebuilds ids a call was recorded without)
    and chosen by `algorithm.sft` (checked already) with the bar `algorithm.sft_min_reward`."""
    from alight.algorithms.lightning import LightningRL

    sft = algorithm.sft
    rl = LightningRL.from_config(adapter, algorithm, tokenizer=tokenizer)
    rollouts = await store.list_rollouts()
    eligible = eligible_rollouts(rollouts, sft.splits)
    spans = await store.span_dicts([r.rollout_id for r in eligible]) if eligible else {}
    transitions, _ = rl.adapt_rollouts(eligible, spans)
    chosen, counts = select_transitions(
        eligible, transitions, select=sft.select, min_reward=algorithm.sft_min_reward, dedupe=sft.dedupe
    )
    counts.rollouts, counts.eligible = len(rollouts), len(eligible)
    llm = {s["span_id"]: s for rows in spans.values() for s in rows if s.get("kind") == "llm"}
    wanted = {last_span_id(t) for t in chosen}
    return Selection(chosen, counts, {k: v for k, v in llm.items() if k in wanted})


def read_selection(
    target: str, adapter: AdapterConfig, algorithm: AlgorithmConfig, *, tokenizer: Retokenizer | None = None
) -> Selection:
    """`select_from_store` on the store at `target`, opened read only."""

    async def main() -> Selection:
        async with source_store(target) as store:
            return await select_from_store(store, adapter, algorithm, tokenizer=tokenizer)

    return asyncio.run(main())


def last_span_id(t: Transition) -> str | None:
    """The LLM span whose request holds the whole conversation of `t` (trajectory mode: the last merged call)."""
    ids = t.metadata.get("span_ids") if t.metadata else None
    return ids[-1] if ids else t.span_id
