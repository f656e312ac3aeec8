"""Ctrl-C and SIGTERM stop a server that serves until interrupted, wherever the signal lands in the
main thread: the handler sets a flag instead of raising KeyboardInterrupt, which code such as a
finalizer or an import's weakref callback would swallow (the server then never stopped)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_landing_in_a_finalizer_still_stops_the_server(tmp_path: Path, signum: int) -> None:
    closed = tmp_path / "closed"
    script = textwrap.dedent(f"""
        import signal
        from alight.store import MemoryStore
        from alight.store.server import serve

        class Store(MemoryStore):
            async def close(self):
                open({str(closed)!r}, "w").close()

        class Finalized:
            def __del__(self):  # the signal's handler runs inside this finalizer, which swallows errors
                signal.raise_signal({int(signum)})

        def ready(url):
            Finalized()  # dropped at once: its __del__ runs here, in the main thread

        serve(Store(), port={_free_port()}, watchdog_interval_s=None, on_ready=ready)
    """)
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert process.returncode == 0, process.stderr[-2000:]
    assert "Exception ignored" not in process.stderr
    assert closed.exists()


def test_a_second_ctrl_c_still_stops_cleanly(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import signal
        from alight.store import MemoryStore
        from alight.store.server import serve

        def ready(url):
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)

        serve(MemoryStore(), port={_free_port()}, watchdog_interval_s=None, on_ready=ready)
    """)
    process = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert process.returncode == 0, process.stderr[-2000:]
    assert "Traceback" not in process.stderr
