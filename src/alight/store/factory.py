"""The store factory: one `Store` from the config's `store` section or from a store URL.

Kinds: `sqlite` (one durable file; the default, `store.db` in the run directory), `memory` (lost
when the process ends) and `http` (an `alight store` server, through the HTTP client). A URL names
the same choices: `sqlite:///path/to/store.db` (the path after `sqlite://`, absolute with three
slashes), `memory://`, and `http://HOST:PORT` (or https). A bad kind or URL is a one-line
ConfigError, raised before anything is opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from alight.errors import ConfigError

if TYPE_CHECKING:
    from alight.config.schema import StoreConfig
    from alight.store.base import Store
    from alight.store.write_ids import WriteIdLimits

KINDS = ("sqlite", "memory", "http")
URL_FORMS = "sqlite:///PATH, memory:// or http://HOST:PORT"


@dataclass(frozen=True)
class StoreSpec:
    """A checked store choice: its kind and, for sqlite, the file (None: the caller's default),
    for http, the server's URL."""

    kind: str
    path: Path | None = None
    url: str | None = None

    @property
    def is_file(self) -> bool:
        """A SQLite file: another process may open it beside its server (the trainer's columnar reads)."""
        return self.kind == "sqlite"


def store_kind(cfg: StoreConfig) -> str:
    """The kind the config chooses: `store.kind`, or with none set, http when `store.url` names a
    server and sqlite otherwise (what a run did before `store.kind` existed)."""
    if cfg.kind is None:
        return "http" if cfg.url else "sqlite"
    return cfg.kind


def check_store(spec: StoreConfig | str) -> StoreSpec:
    """The store choice of a `store` config section or a URL; ConfigError in one line when it is
    not one of the kinds, or its URL or path is missing or malformed."""
    if isinstance(spec, str):
        return _parse_url(spec)
    kind = store_kind(spec)
    if kind not in KINDS:
        raise ConfigError(f"store.kind={kind!r}: expected one of {', '.join(KINDS)}")
    if kind == "http":
        if not spec.url:
            raise ConfigError("store.kind=http needs store.url (an `alight store` server, http://HOST:PORT)")
        parsed = _parse_url(spec.url, key="store.url")
        if parsed.kind != "http":
            raise ConfigError(f"store.url={spec.url!r}: store.kind=http needs http://HOST:PORT or https://HOST:PORT")
        return parsed
    if spec.url:
        raise ConfigError(f"store.url is set but store.kind={kind}: drop store.url, or set store.kind=http")
    if kind == "memory":
        if spec.path:
            raise ConfigError("store.path is set but store.kind=memory: a memory store has no file")
        return StoreSpec("memory")
    return StoreSpec("sqlite", path=Path(spec.path).expanduser() if spec.path else None)


def _parse_url(url: str, key: str = "store URL") -> StoreSpec:
    bad = f"{key} {url!r}: expected {URL_FORMS}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a malformed port raises here, not at the first request
    except ValueError:
        raise ConfigError(bad) from None
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigError(bad)
        return StoreSpec("http", url=url)
    if parts.query or parts.fragment:
        raise ConfigError(bad)
    if scheme == "memory" and not parts.netloc and parts.path in ("", "/"):
        return StoreSpec("memory")
    if scheme == "sqlite" and not parts.netloc and parts.path not in ("", "/"):
        return StoreSpec("sqlite", path=Path(parts.path))
    raise ConfigError(bad)


def open_store(
    spec: StoreConfig | str | StoreSpec,
    *,
    default_path: Path | None = None,
    create: bool = True,
    token: str | None = None,
    max_retries: int | None = None,
    write_id_limits: WriteIdLimits | None = None,
) -> Store:
    """The store `spec` chooses, opened. `default_path`: the SQLite file when the spec names none
    (a run's `store.db`). `create=False` opens only an existing SQLite file (ConfigError when there
    is none), as readers of a finished run do. `token` (default: ALIGHT_TOKEN) and `max_retries`
    (default: the client's) are for http; `write_id_limits` for memory and sqlite."""
    checked = spec if isinstance(spec, StoreSpec) else check_store(spec)
    if checked.kind == "memory":
        from alight.store.memory import MemoryStore

        return MemoryStore(write_id_limits=write_id_limits)
    if checked.kind == "http":
        from alight.store.client import StoreClient

        assert checked.url is not None
        if max_retries is None:
            return StoreClient(checked.url, token=token)
        return StoreClient(checked.url, token=token, max_retries=max_retries)
    path = checked.path or default_path
    if path is None:
        raise ConfigError("store.kind=sqlite needs store.path (no run directory to keep store.db in)")
    if not create and not path.is_file():
        raise ConfigError(f"{path}: no store file there")
    from alight.store.sqlite import SqliteStore

    return SqliteStore(path, write_id_limits=write_id_limits)
