"""Serving over HTTP: what the store server and the LLM proxy share.

`background.BackgroundServer` runs an ASGI app with uvicorn from a daemon thread (and
`sigterm_interrupts` makes a command that serves until interrupted stop cleanly on SIGTERM);
`app.ServerApp` builds the FastAPI app both servers start from: lifespan, request-body limit, and
every failure answered as JSON in the server's own error format. The servers themselves are
`alight.store.server` (the store's routes, `StoreServer`) and `alight.proxy` (`routes`, `server`).
"""

from __future__ import annotations

from alight.serving.background import BackgroundServer, sigterm_interrupts

__all__ = ["BackgroundServer", "sigterm_interrupts"]
