"""Fault injection for the fault soak (fault_soak.py) and the suite's fault tests: a TCP relay that
drops every connection through it on cue, a seeded fault schedule, and finding the processes of a
running `alight train` to kill or stop.

The relay stands where a flaky network stands: agents reach the LLM proxy through it (the run's
`proxy.advertise_url` is the relay's URL), and `drop()` aborts every connection it carries, both
ways, as a reset network does; new connections go through again at once.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from alight.sandbox.namespace_init import pipe  # the local sandbox's relay copies bytes the same way

#: What the soak can do to a run, one fault at a time.
KINDS = ("runner_kill", "runner_stop", "engine_kill", "store_restart", "proxy_drop", "trainer_kill")


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the run started
    kind: str


def schedule(seed: int, kinds: Sequence[str], *, every_s: float, duration_s: float) -> list[Fault]:
    """One fault every `every_s` seconds (jittered by up to a quarter of it) until `duration_s`,
    its kind drawn from `kinds` with `seed`: the same seed, the same faults."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    faults, at = [], every_s
    while at < duration_s:
        faults.append(Fault(round(at + rng.uniform(-every_s / 4, every_s / 4), 2), rng.choice(list(kinds))))
        at += every_s
    return faults


class Relay:
    """Forwards TCP connections from `port` (0: a free one) on loopback to `target_port`, from a
    thread of its own; `drop()` aborts every connection it carries now."""

    def __init__(self, target_port: int, *, port: int = 0, host: str = "127.0.0.1") -> None:
        self.host, self.target_port = host, target_port
        with socket.socket() as probe:
            probe.bind((host, port))
            self.port = probe.getsockname()[1]
        self.dropped = 0  # connections aborted by drop()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.Server | None = None
        self._stopping: asyncio.Event
        self._thread = threading.Thread(target=self._run, name="fault-relay", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Relay:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def main() -> None:
            self._stopping = asyncio.Event()
            self._server = await asyncio.start_server(self._handle, self.host, self.port, reuse_address=True)
            self._ready.set()
            await self._stopping.wait()
            self._server.close()
            self._abort_all()
            handlers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            await asyncio.gather(*handlers, return_exceptions=True)

        self._loop.run_until_complete(main())
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        pair = (writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
        finally:
            self._pairs.discard(pair)
            for side in pair:
                side.transport.abort()

    def drop(self) -> int:
        """Abort every connection through the relay now (both ways); how many there were."""

        async def abort() -> int:
            return self._abort_all()

        count = asyncio.run_coroutine_threadsafe(abort(), self._loop).result(10)
        self.dropped += count
        return count

    def _abort_all(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            for side in pair:
                side.transport.abort()
        return len(pairs)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stopping.set)
            self._thread.join(10)
