"""The request batcher of the embedded engine: one worker thread runs every request, in a batch
that requests join and leave one token at a time, and each answer (or its streamed text) is handed
back on the caller's loop.

Concurrent requests arrive one by one (each prompt is rendered and encoded first): an idle worker
starts a batch with the requests that keep coming, `batch_wait_ms` apart at most, for at most
`max_batch_wait_ms`; while it runs, requests that arrive join it between two tokens (up to
`max_batch_size` rows), and each row leaves as soon as it ends. One batch serves one adapter: a
request for another waits until the batch ends. `held` stops joining (and new batches), so a
weight update waits only for the rows already running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from alight.engines.sampling import Sequence, SequenceOutput

#: A job's answer: the sequence's output and the weights version that produced it.
Answer = tuple[SequenceOutput, int]


@dataclass
class Job:
    sequence: Sequence
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Answer]
    texts: asyncio.Queue[str | None] | None = None  # streaming: settled text after each token, None at the end
    adapter: str | None = None  # per-agent LoRA: the adapter that answers (None: the base model)


#: What the worker hands a batch: its first jobs, and `join(room)`: up to `room` jobs that may join
#: it now (same adapter; none while the worker is held).
Join = Callable[[int], list[Job]]


class BatchWorker:
    """Runs `run(jobs, join)` on one daemon thread for each batch started from `submit`; `run`
    resolves every job it is given or takes from `join` (with `deliver`)."""

    def __init__(
        self,
        run: Callable[[list[Job], Join], None],
        *,
        max_batch_size: int,
        batch_wait_ms: float,
        max_batch_wait_ms: float,
        lock: threading.Lock,
        name: str,
    ) -> None:
        self._run = run
        self.max_batch_size, self.batch_wait_ms, self.max_batch_wait_ms = (
            max_batch_size,
            batch_wait_ms,
            max_batch_wait_ms,
        )
        self._lock = lock  # guards starting the thread (shared with the engine's loading)
        self._name = name
        self._queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._waiting: list[Job] = []  # taken from the queue, not yet in a batch (worker thread only)
        self._stopping = False
        self._open = threading.Event()  # cleared while held: no joining, no new batch
        self._open.set()
        self._holders = 0
        self._holders_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def ensure_started(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()

    async def close(self) -> None:
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(thread.join)
            self._thread = None

    def submit(self, sequence: Sequence, *, stream: bool, adapter: str | None = None) -> Job:
        """Queue `sequence` from the running loop; with `stream`, its settled text arrives in `job.texts`."""
        self.ensure_started()
        loop = asyncio.get_running_loop()
        job = Job(sequence, loop, loop.create_future(), adapter=adapter)
        if stream:
            texts: asyncio.Queue[str | None] = asyncio.Queue()
            job.texts = texts
            sequence.on_text = _threadsafe_put(loop, texts)
        self._queue.put(job)
        return job

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While inside: no job joins the running batch and no batch starts (any thread)."""
        with self._holders_lock:
            self._holders += 1
            self._open.clear()
        try:
            yield
        finally:
            with self._holders_lock:
                self._holders -= 1
                if self._holders == 0:
                    self._open.set()

    def _serve(self) -> None:
        """The worker thread: start a batch from the waiting jobs and run it, until `close`."""
        while True:
            if not self._waiting:
                if self._stopping:
                    return
                first = self._queue.get()
                if first is None:
                    return
                self._waiting.append(first)
            self._gather()
            self._open.wait()
            adapter = self._waiting[0].adapter
            jobs = self._take(adapter, self.max_batch_size)
            self._run(jobs, functools.partial(self._join, adapter))

    def _gather(self) -> None:
        """Wait for more jobs while they keep coming (`batch_wait_ms` apart, `max_batch_wait_ms` in all)."""
        cap = time.monotonic() + self.max_batch_wait_ms / 1000
        while not self._stopping and len(self._waiting) < self.max_batch_size:
            wait = min(self.batch_wait_ms / 1000, cap - time.monotonic())
            try:
                self._accept(self._queue.get(timeout=max(wait, 0.0)))
            except queue.Empty:
                return

    def _join(self, adapter: str | None, room: int) -> list[Job]:
        """Jobs of `adapter` that may join the running batch now: up to `room`, none while held."""
        if room <= 0 or not self._open.is_set():
            return []
        with contextlib.suppress(queue.Empty):
            while True:
                self._accept(self._queue.get_nowait())
        return self._take(adapter, room)

    def _accept(self, job: Job | None) -> None:
        """A job from the queue waits for a batch; None (from `close`) stops the worker once idle."""
        if job is None:
            self._stopping = True
        else:
            self._waiting.append(job)

    def _take(self, adapter: str | None, room: int) -> list[Job]:
        """Remove and return the first `room` waiting jobs of `adapter`, in arrival order."""
        taken: list[Job] = []
        left: list[Job] = []
        for job in self._waiting:
            (taken if job.adapter == adapter and len(taken) < room else left).append(job)
        self._waiting = left
        return taken


def _threadsafe_put(loop: asyncio.AbstractEventLoop, texts: asyncio.Queue[str | None]) -> Callable[[str], None]:
    def put(text: str) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is gone
            loop.call_soon_threadsafe(texts.put_nowait, text)

    return put


async def answer(job: Job) -> Answer:
    """A job's result; a caller cancelled while waiting (its client gone) stops the job's sequence."""
    try:
        return await job.future
    except asyncio.CancelledError:
        job.sequence.cancelled = True
        raise


def deliver(job: Job, result: Answer | None, error: BaseException | None) -> None:
    """Resolve a job's future (and end its text stream) on the caller's loop."""

    def resolve() -> None:
        if not job.future.done():
            if error is not None:
                job.future.set_exception(error)
            else:
                assert result is not None
                job.future.set_result(result)
        if job.texts is not None:
            job.texts.put_nowait(None)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits for this answer
        job.loop.call_soon_threadsafe(resolve)
