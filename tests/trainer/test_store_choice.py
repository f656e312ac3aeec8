"""The run's store as `store.kind` / `store.path` / `store.url` choose it: the stack serves a sqlite
(default: the run directory's store.db) or memory store to its runners, or uses a store server
given by URL; the trainer's own store is of the same store. The engine is a scripted
OpenAI-compatible endpoint (litellm engine), so no model loads."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from alight.errors import ConfigError
from alight.store.base import Store
from alight.store.client import StoreClient
from alight.store.memory import MemoryStore
from alight.store.server import StoreServer
from alight.store.sqlite import SqliteStore
from alight.trainer.stack import LocalStack
from alight.types import LLMResource
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.fixtures.sample_agents import calculator_script


def _config(tmp_path: Path, upstream: str, *overrides: str) -> Any:
    from alight.config import load_config, to_object
    from tests.cli.test_dev_and_trace import write_config

    engine = ["engine.kind=litellm", "engine.model=openai/scripted", f"engine.base_url={upstream}"]
    return to_object(load_config(write_config(tmp_path), [*engine, "runner.n_runners=0", *overrides]))


async def _published_endpoint(store: Store) -> str:
    async with store:
        resources = await store.get_latest_resources()
    assert resources is not None
    llm = resources.resources["llm"]
    assert isinstance(llm, LLMResource)
    return llm.endpoint


@pytest.mark.slow
def test_the_stack_serves_the_chosen_store(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with ScriptedOpenAIServer(calculator_script) as upstream:
        with LocalStack(_config(tmp_path, upstream.url), run) as stack:  # the default: today's store.db
            store = stack.trainer_store()
            assert isinstance(store, SqliteStore) and store.path == run / "store.db"
            assert asyncio.run(_published_endpoint(store)) == stack.proxy_server.url

        chosen = tmp_path / "chosen" / "runs.db"
        with LocalStack(_config(tmp_path, upstream.url, f"store.path={chosen}"), tmp_path / "run2") as stack:
            store = stack.trainer_store()
            assert isinstance(store, SqliteStore) and store.path == chosen
            assert asyncio.run(_published_endpoint(store)) == stack.proxy_server.url
        assert not (tmp_path / "run2" / "store.db").exists()

        with LocalStack(_config(tmp_path, upstream.url, "store.kind=memory"), tmp_path / "run3") as stack:
            store = stack.trainer_store()  # the memory store lives in the server: the trainer is its client
            assert isinstance(store, StoreClient) and store.url == stack.store_url
            assert asyncio.run(_published_endpoint(store)) == stack.proxy_server.url
        assert not (tmp_path / "run3" / "store.db").exists()

        with StoreServer(MemoryStore(), watchdog_interval_s=None) as server:
            cfg = _config(tmp_path, upstream.url, "store.kind=http", f"store.url={server.url}")
            with LocalStack(cfg, tmp_path / "run4") as stack:
                assert stack.store_url == server.url
                store = stack.trainer_store()
                assert isinstance(store, StoreClient) and store.url == server.url
                assert asyncio.run(_published_endpoint(store)) == stack.proxy_server.url
        assert not (tmp_path / "run4" / "store.db").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["store.kind=redis"], r"^store.kind='redis': expected one of sqlite, memory, http$"),
        (["store.kind=http"], r"^store.kind=http needs store.url"),
        (["store.kind=memory", "store.url=http://127.0.0.1:1"], r"^store.url is set but store.kind=memory"),
    ],
)
def test_a_bad_store_choice_fails_in_one_line_before_anything_starts(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        LocalStack(_config(tmp_path, "http://127.0.0.1:1/v1", *overrides), tmp_path / "run").start()
    assert not (tmp_path / "run").exists()
