"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM with a checkpoint to resume from.

The first signal asks the run to stop: an update in progress finishes (its step is logged and
checkpointed), a wait for rollouts or a validation is cancelled at once (the last completed step is
checkpointed), then the run ends with `stopped` set. The second signal exits at once, the way the
signal would have without alight (no checkpoint). Outside the asyncio part of a run (loading the
model, the warm start) the first signal raises KeyboardInterrupt, as Ctrl-C always did.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """The run's handler of SIGINT and SIGTERM while it is entered (main thread only)."""

    def __init__(self) -> None:
        self.requested: int | None = None  # the first signal received
        self.updating = False  # an update is running: let it finish before stopping
        self._on_request: Callable[[], object] | None = None
        self._previous: dict[int, Any] = {}
        self._pid = os.getpid()

    @property
    def name(self) -> str | None:
        return signal.Signals(self.requested).name if self.requested is not None else None

    def arm(self, on_request: Callable[[], object] | None) -> None:
        """What the first signal does (None: raise KeyboardInterrupt). Called from the handler."""
        self._on_request = on_request

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.getsignal(sig)
                signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if os.getpid() != self._pid or self.requested is not None:  # the second: what the signal does alone
            if os.getpid() == self._pid:
                logger.warning("%s again: exiting at once, without a checkpoint", name)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.requested = signum
        if self.updating:
            logger.warning("%s: stopping after the update in progress (again: exit at once)", name)
        else:
            logger.warning("%s: stopping (again: exit at once)", name)
        if self._on_request is None:
            raise KeyboardInterrupt
        self._on_request()
