"""A store server (SQLite) in a process of its own, for benchmarks whose clients are other processes."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import socket
import time
from collections.abc import Iterator


def _serve(db: str, port: int) -> None:
    from alight.store.server import serve
    from alight.store.sqlite import SqliteStore

    serve(SqliteStore(db), host="127.0.0.1", port=port)


@contextlib.contextmanager
def store_server_process(db: str, timeout_s: float = 60.0) -> Iterator[str]:
    """Serve the SQLite store at `db` from a spawned process; yield its URL once it answers, and
    end the process (SIGTERM: a graceful stop) on exit."""
    import httpx

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    server = mp.get_context("spawn").Process(target=_serve, args=(db, port))
    server.start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or not server.is_alive():
                raise RuntimeError(f"store server at {url} did not come up")
            time.sleep(0.1)
        yield url
    finally:
        server.terminate()
        server.join(timeout=30)
