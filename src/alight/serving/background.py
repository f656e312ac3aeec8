"""An ASGI app served by uvicorn from a background thread, and the Ctrl-C/SIGTERM handling of the
commands that serve one until interrupted. The store server and the LLM proxy both run this way;
uvicorn and httpx load only when a server starts, so `import alight` stays light."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Self, TypeVar

from alight.errors import AlightError, ConfigError
from alight.restarts import RestartPolicy, Restarts
from alight.serving.advertise import advertised_url, check_advertise_url, local_host, url_of

if TYPE_CHECKING:
    import uvicorn

logger = logging.getLogger(__name__)

T = TypeVar("T")


class BackgroundServer:
    """Serves an ASGI app with uvicorn (uvloop, httptools) from a daemon thread with its own event loop.

    Port 0 picks a free port; `url` gives the real one once started: the URL clients on other
    machines use (`advertise_url` when given, else the bound address, for a wildcard bind this
    machine's routable one; see `alight.serving.advertise`), and `local_url` the one this machine
    uses (loopback for a wildcard bind). A subclass names itself
    (`what`), picks the error class it raises, and may override `before_serving` (run on the
    server's loop before it serves: a failure there is `start()`'s error) and `after_serving`
    (run there once it has stopped, whatever happened).

    Supervised: when uvicorn stops serving without `stop()` asking it (it raised, or exited), it is
    started again on the same socket and event loop, so the app's state (the proxy's engine and
    its weights, the store) lives on and clients retry into it; with the backoff and budget of
    `restart_policy` (`alight.restarts`), each restart logged and counted (`restarts`). Past the
    budget the server stays down, and `failure` says why."""

    what = "server"
    error: type[AlightError] = ConfigError
    graceful_shutdown_s = 5.0
    restart_policy = RestartPolicy(backoff_s=0.5, max_backoff_s=10.0, budget=5, window_s=600.0)

    def __init__(self, app: Any, *, host: str, port: int, advertise_url: str | None = None) -> None:
        self.host = host
        self.port = port
        self.advertise_url = check_advertise_url(advertise_url) if advertise_url else None
        self._url: str | None = None  # the advertised URL, fixed once the port is known
        self._app = app
        self._server: uvicorn.Server | None = None
        self._config: uvicorn.Config | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Set when the server thread is done. Waited on instead of Thread.join: a Ctrl-C landing
        # inside join() can leave CPython believing a running thread has ended.
        self._stopped = threading.Event()
        self._failure: BaseException | None = None
        self._stopping = False  # stop() asked: uvicorn ending is not a death
        self._restarts = Restarts(self.restart_policy)

    @property
    def restarts(self) -> int:
        """How often uvicorn was started again after it stopped unasked."""
        return self._restarts.count

    @property
    def failure(self) -> BaseException | None:
        """Why the server stopped unasked for good (None while it serves, or after `stop()`)."""
        return self._failure

    @property
    def url(self) -> str:
        """The URL clients on other machines use (see the class docstring)."""
        if self._url is not None:
            return self._url
        return advertised_url(self.host, self.port, self.advertise_url, what=self.what)

    @property
    def local_url(self) -> str:
        """The URL this machine uses: the bound address, loopback for a wildcard bind."""
        return url_of(local_host(self.host), self.port)

    async def before_serving(self) -> None:
        """Runs on the server's loop before it serves."""

    async def after_serving(self) -> None:
        """Runs on the server's loop once it has stopped (also when `before_serving` failed)."""

    def start(self, timeout_s: float = 30.0) -> Self:
        """Start serving; return once the app answers `/health`."""
        import uvicorn

        if self._thread is not None:
            raise self.error(f"the {self.what} is already started")
        sock = _listen(self.host, self.port, self.what)
        self.port = sock.getsockname()[1]
        self._url = None
        self._url = self.url
        self._stopped.clear()
        self._failure = None
        self._stopping = False
        self._config = uvicorn.Config(
            self._app,
            loop="uvloop",
            http="httptools",
            access_log=False,
            proxy_headers=False,  # trust no forwarding proxy's headers
            log_level="warning",
            log_config=None,  # leave the application's logging setup alone
            timeout_keep_alive=30,  # longer than the store client's idle expiry (4 s): the client closes first
            timeout_graceful_shutdown=int(self.graceful_shutdown_s),
            lifespan="off" if _lifespan_of(self._app) is not None else "auto",  # entered by `_run`
        )
        self._server = uvicorn.Server(self._config)
        name = f"alight-{self.what.replace(' ', '-')}-{self.port}"
        self._thread = threading.Thread(target=self._run, args=(self._server, sock), name=name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self._stopped.is_set():
                self._server = self._thread = None
                if isinstance(self._failure, AlightError):
                    raise self._failure
                raise self.error(f"the {self.what} on {self.url} stopped while starting: {self._failure!r}")
            if time.monotonic() > deadline:
                self.stop()
                raise self.error(f"the {self.what} on {self.url} did not answer within {timeout_s:.0f} s")
            time.sleep(0.01)
        return self

    def _answers(self) -> bool:
        import httpx

        if self._server is None or not self._server.started:
            return False
        try:
            with httpx.Client(trust_env=False, timeout=2.0) as http:
                return http.get(self.local_url + "/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _run(self, server: uvicorn.Server, sock: socket.socket) -> None:
        async def main() -> None:
            try:
                try:
                    await self.before_serving()
                except BaseException as err:
                    self._failure = err
                    return
                self._loop = asyncio.get_running_loop()
                async with _lifespan(self._app):  # once, around every restart of uvicorn
                    await self._serve(server, sock)
            finally:
                await self.after_serving()

        try:
            with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
                runner.run(main())
        except BaseException as err:  # uvicorn exits with SystemExit when startup fails
            self._failure = err
            logger.exception("the %s on %s stopped", self.what, self.url)
        finally:
            sock.close()
            self._loop = None
            self._stopped.set()

    async def _serve(self, server: uvicorn.Server, sock: socket.socket) -> None:
        """Serve until `stop()`; uvicorn stopping unasked is started again (see the class docstring)."""
        import uvicorn

        while True:
            try:
                await server.serve(sockets=[sock])
                why = "stopped serving"
            except Exception as err:
                why = f"failed ({type(err).__name__}: {err})"
            if self._stopping:
                return
            delay = self._restarts.next_delay()
            if delay is None:
                policy = self.restart_policy
                message = f"the {self.what} on {self.url} {why}, after {policy.budget} restarts within "
                self._failure = self.error(message + f"{policy.window_s:.0f} s: not again")
                logger.error("%s", self._failure)
                return
            logger.warning("the %s on %s %s; serving again in %.1f s (restart %d)", self.what, self.url, why,
                           delay, self._restarts.count)  # fmt: skip
            await asyncio.sleep(delay)
            sock.close()  # uvicorn closed it already when it stopped in order
            try:
                sock = _listen(self.host, self.port, self.what)
            except ConfigError as err:
                self._failure = err
                return
            assert self._config is not None
            server = self._server = uvicorn.Server(self._config)
            if self._stopping:
                sock.close()
                return

    def run(self, work: Coroutine[Any, Any, T], timeout_s: float | None = 60.0) -> T:
        """Run a coroutine on the server's loop from another thread and return its result."""
        if self._loop is None:
            work.close()
            raise self.error(f"the {self.what} is not running")
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut down gracefully (the requests in flight finish), then end the thread."""
        if self._server is None or self._thread is None:
            return
        self._stopping = True
        self._server.should_exit = True
        if not self._stopped.wait(timeout_s):
            self._server.force_exit = True
            self._stopped.wait(timeout_s)
        self._thread.join(1.0)
        self._server = None
        self._thread = None

    def serve_until_interrupted(self, on_ready: Callable[[str], None] | None = None) -> None:
        """Serve until Ctrl-C or SIGTERM, then stop gracefully (requests in flight get
        `graceful_shutdown_s`; a second signal changes nothing). `on_ready` gets the URL once it answers.

        The signals only set a flag, never raise KeyboardInterrupt: raised at whatever the main
        thread runs, it can land in code that swallows it (a weakref callback inside an import, a
        `__del__`), and the server then never stops, or escape the handler and kill the process."""
        signals: list[int] = []
        interrupted = signals.append  # runs in the signal handler: no locks, no I/O

        with stop_signals(interrupted):
            try:
                self.start()
                logger.debug("alight %s serving on %s", self.what, self.url)
                if on_ready is not None:
                    on_ready(self.url)
                while not signals and not self._stopped.wait(0.1):
                    pass
                if signals:
                    logger.info("alight %s on %s: stopping", self.what, self.url)
            finally:
                self.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _lifespan_of(app: Any) -> Callable[[Any], contextlib.AbstractAsyncContextManager[Any]] | None:
    """The lifespan of a Starlette/FastAPI app (None: another ASGI app, whose lifespan uvicorn runs)."""
    return getattr(getattr(app, "router", None), "lifespan_context", None)


def _lifespan(app: Any) -> contextlib.AbstractAsyncContextManager[Any]:
    """The app's lifespan entered by the server itself, so that a restart of uvicorn keeps what it
    holds (the proxy's engine and its weights, the store's watchdog)."""
    lifespan = _lifespan_of(app)
    return lifespan(app) if lifespan is not None else contextlib.nullcontext()


def _listen(host: str, port: int, what: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise ConfigError(f"the {what} cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Inside: SIGTERM raises KeyboardInterrupt, like Ctrl-C (main thread only; elsewhere a no-op).
    Once: a second SIGTERM (a supervisor insisting) must not cut the graceful shutdown short.

    Ctrl-C raises KeyboardInterrupt too even when the process started with SIGINT ignored, which
    it inherits from a parent that ignored it when forking (a script's background job, or a
    parent inside C `system()`, which ignores SIGINT while its command runs): a process that
    serves until interrupted has to be interruptible."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    previous_int = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGTERM, _interrupt)
    if previous_int == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int == signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous_int)


@contextlib.contextmanager
def stop_signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """Inside: SIGINT and SIGTERM call `on_signal(signum)` instead of raising KeyboardInterrupt (main
    thread only; elsewhere a no-op). `on_signal` runs in a signal handler: it must only set flags
    (no locks, no I/O). Ctrl-C works even when the process inherited SIGINT ignored (see
    `sigterm_interrupts`)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum in previous:
        signal.signal(signum, lambda number, frame: on_signal(number))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt
