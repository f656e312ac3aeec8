"""The URLs servers advertise to other machines: wildcard bind -> this machine's routable address,
an explicit advertise URL wins, a bad one is a one-line error; the run's stack publishes the
proxy's advertised URL as the `llm` endpoint and hands the store's to its runners.

Real servers throughout; the advertised host names below (*.example) need not resolve, since the
servers are reached at their local URL and only the published value is checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from alight.errors import ConfigError
from alight.serving import advertise
from alight.serving.advertise import advertised_url, check_advertise_url, is_wildcard, routable_address
from alight.store.client import StoreClient
from alight.store.memory import MemoryStore
from alight.store.server import StoreServer
from alight.types import LLMResource
from tests.fixtures.openai_server import ScriptedOpenAIServer
from tests.fixtures.sample_agents import calculator_script

TOKEN = "tok-advertise-51c9"


def test_wildcards() -> None:
    assert all(map(is_wildcard, ["", "0.0.0.0", "::", "[::]", "0:0::0"]))
    assert not any(map(is_wildcard, ["127.0.0.1", "10.0.0.1", "::1", "example.org", "localhost"]))


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://10.1.2.3:4747", "http://10.1.2.3:4747"),
        ("http://store.example:4747/", "http://store.example:4747"),
        ("https://Store.Example:443", "https://Store.Example:443"),
        ("http://[fd00::5]:8000", "http://[fd00::5]:8000"),
        ("  http://10.1.2.3:1  ", "http://10.1.2.3:1"),
    ],
)
def test_good_advertise_urls(given: str, expected: str) -> None:
    assert check_advertise_url(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        "10.1.2.3:4747",  # no scheme
        "ftp://10.1.2.3:4747",
        "http://10.1.2.3",  # no port
        "http://10.1.2.3:0",
        "http://10.1.2.3:99999",
        "http://10.1.2.3:port",
        "http://:4747",
        "http://10.1.2.3:4747/prefix",
        "http://10.1.2.3:4747?x=1",
        "http://user:pw@10.1.2.3:4747",
        "http://0.0.0.0:4747",
        "http://[::]:4747",
    ],
)
def test_bad_advertise_urls_are_one_line_errors_naming_the_key(given: str) -> None:
    with pytest.raises(ConfigError) as caught:
        check_advertise_url(given, "store.advertise_url")
    message = str(caught.value)
    assert "\n" not in message and message.startswith("bad store.advertise_url ") and repr(given) in message


def _addresses_of_this_machine() -> set[str]:
    """Independently of alight: every address of this machine's interfaces, from `ip`."""
    shown = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return {line.split()[3].split("/")[0] for line in shown.splitlines()}


def test_routable_address_is_a_non_loopback_address_of_this_machine() -> None:
    address = routable_address()
    if address is None:
        pytest.skip("this machine has no default route and its name resolves to loopback only")
    assert not ipaddress.ip_address(address).is_loopback
    try:
        assert address in _addresses_of_this_machine()
    except FileNotFoundError:  # no `ip`: a listening socket proves the address is ours
        with socket.socket() as sock:
            sock.bind((address, 0))


def test_advertised_url_of_each_kind_of_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(advertise, "routable_address", lambda ipv6=False: "10.9.8.7")
    assert advertised_url("0.0.0.0", 4747) == "http://10.9.8.7:4747"
    assert advertised_url("::", 4747) == "http://10.9.8.7:4747"
    assert advertised_url("10.1.2.3", 4747) == "http://10.1.2.3:4747"  # a routable bind is its own URL
    assert advertised_url("fd00::3", 80) == "http://[fd00::3]:80"
    assert advertised_url("0.0.0.0", 4747, "http://gateway.example:80") == "http://gateway.example:80"


def test_a_wildcard_bind_without_a_routable_address_warns_and_advertises_loopback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(advertise, "routable_address", lambda ipv6=False: None)
    with caplog.at_level(logging.WARNING, logger="alight.serving.advertise"):
        assert advertised_url("0.0.0.0", 4747, what="store server") == "http://127.0.0.1:4747"
    assert "no routable address" in caplog.text and "advertise_url" in caplog.text


def test_a_server_on_a_wildcard_advertises_this_machines_routable_address() -> None:
    address = routable_address()
    with StoreServer(MemoryStore(), host="0.0.0.0", token=TOKEN, watchdog_interval_s=None) as server:
        assert server.local_url == f"http://127.0.0.1:{server.port}"
        if address is None:
            assert server.url == server.local_url
            return
        assert server.url == f"http://{address}:{server.port}"
        answer = httpx.get(f"{server.url}/store/counts", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200  # the advertised URL reaches the server


def test_a_server_on_the_ipv6_wildcard_answers_on_its_local_and_its_advertised_url() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    with StoreServer(MemoryStore(), host="::", token=TOKEN, watchdog_interval_s=None) as server:
        assert server.local_url == f"http://[::1]:{server.port}"
        assert "[::]" not in server.url
        for url in (server.local_url, server.url):
            assert httpx.get(f"{url}/health").status_code == 200


def test_an_explicit_advertise_url_wins_and_a_bad_one_is_refused_before_binding() -> None:
    with StoreServer(MemoryStore(), advertise_url="http://store.example:9999/", watchdog_interval_s=None) as server:
        assert server.url == "http://store.example:9999"
        assert server.local_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{server.local_url}/health").status_code == 200
    with pytest.raises(ConfigError, match="expected http://HOST:PORT"):
        StoreServer(MemoryStore(), advertise_url="store.example:9999")


# -- the run's stack ------------------------------------------------------------------------------


def _config(tmp_path: Path, upstream: str, *overrides: str) -> Any:
    from alight.config import load_config, to_object
    from tests.cli.test_dev_and_trace import write_config

    engine = ["engine.kind=litellm", "engine.model=openai/scripted", f"engine.base_url={upstream}"]
    return to_object(load_config(write_config(tmp_path), [*engine, *overrides]))


async def _published_llm(store_url: str) -> LLMResource:
    async with StoreClient(store_url) as store:
        resources = await store.get_latest_resources()
    assert resources is not None
    llm = resources.resources["llm"]
    assert isinstance(llm, LLMResource)
    return llm


@pytest.mark.slow
def test_the_stack_publishes_the_proxys_advertised_url_and_hands_runners_the_stores(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """n_runners=0: no local runner (they would run elsewhere); the stack logs the command for them."""
    from alight.trainer.stack import LocalStack

    with ScriptedOpenAIServer(calculator_script) as upstream:
        cfg = _config(
            tmp_path,
            upstream.url,
            "proxy.advertise_url=http://proxy.example:8123",
            "store.advertise_url=http://store.example:4747",
            "runner.n_runners=0",
        )
        with caplog.at_level(logging.INFO, logger="alight.trainer.stack"), LocalStack(cfg, tmp_path / "run") as stack:
            assert stack.pool is None
            assert stack.store_advertise_url == "http://store.example:4747"
            assert stack.store_url is not None and stack.store_url.startswith("http://127.0.0.1:")
            llm = asyncio.run(_published_llm(stack.store_url))
            assert llm.endpoint == "http://proxy.example:8123"
            assert stack.resources()["llm"].endpoint == "http://proxy.example:8123"  # also after weight updates
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("alight runner --store http://store.example:4747 --agent tests.fixtures" in m for m in warned), warned


def test_the_stack_refuses_a_bad_advertise_url_before_starting_anything(tmp_path: Path) -> None:
    from alight.trainer.stack import LocalStack

    cfg = _config(tmp_path, "http://127.0.0.1:1/v1", "proxy.advertise_url=http://0.0.0.0:8123")
    with pytest.raises(ConfigError, match=r"^bad proxy.advertise_url 'http://0.0.0.0:8123': 0.0.0.0 means"):
        LocalStack(cfg, tmp_path / "run").start()
    assert not (tmp_path / "run").exists()  # no store was made


@pytest.mark.slow
def test_alight_dev_with_a_bad_advertise_url_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    from tests.cli.test_dev_and_trace import alight, write_config

    done = alight("dev", str(write_config(tmp_path)), "store.advertise_url=10.0.0.1:4747", timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad store.advertise_url '10.0.0.1:4747'" in lines[0], done.stderr


def test_alight_store_on_a_wildcard_prints_the_url_other_machines_use() -> None:
    from tests.test_cli import ALIGHT, free_port

    address, port = routable_address(), free_port()
    env = {**os.environ, "ALIGHT_TOKEN": TOKEN}
    command = [*ALIGHT, "store", "--host", "0.0.0.0", "--port", str(port)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the ready line (or the error that ended it)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert line.startswith(f"alight store serving on http://{address or '127.0.0.1'}:{port}, "), line
