"""The store factory: one `Store` from the config's `store` section or from a store URL.

Kinds: `sqlite` (one durable file; the default, `store.db` in the run directory), `memory` (lost
when the process ends) and `http` (an `alight store` server, through the HTTP client). A URL names
the same choices: `sqlite:///path/to/store.db` (the path after `sqlite://`, absolute with three
slashes), `memory://`, and `http://HOST:PORT` (or https). A bad kind or URL is a one-line
ConfigError, raised before anything is opened.

The kinds are registered by name in `STORES` (`store.kind`), each as "module:Class" (imported when
chosen: the HTTP client's aiohttp only for http). A kind's class follows `StoreKind`: `is_file`,
`check_config` (its `store` section, checked) and `from_spec` (opened); a new kind is such a class
plus one `STORES.register` call (and, for a URL spelling, a scheme in `_parse_url`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol
from urllib.parse import urlsplit

from alight.errors import ConfigError
from alight.parts import Registry

if TYPE_CHECKING:
    from alight.config.schema import StoreConfig
    from alight.store.base import Store
    from alight.store.write_ids import WriteIdLimits

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
        return store_class(self.kind).is_file


@dataclass(frozen=True)
class OpenOptions:
    """How `open_store` opens a spec; each kind reads what concerns it."""

    default_path: Path | None = None  # sqlite: the file when the spec names none (a run's store.db)
    create: bool = True  # sqlite: False opens only an existing file
    token: str | None = None  # http: the bearer token (default: ALIGHT_TOKEN)
    max_retries: int | None = None  # http: None is the client's default
    write_id_limits: WriteIdLimits | None = None  # memory, sqlite


class StoreKind(Protocol):
    """What each store kind's class states, beside the `Store` protocol its instances follow."""

    kind: ClassVar[str]
    is_file: ClassVar[bool]  # a file another process may open beside its server

    @classmethod
    def check_config(cls, cfg: StoreConfig) -> StoreSpec:
        """This kind's choice from a `store` section (its kind chose this class); one-line
        ConfigError for settings it cannot use."""
        ...

    @classmethod
    def from_spec(cls, spec: StoreSpec, options: OpenOptions) -> Store:
        """The store `spec` (of this kind, checked) names, opened."""
        ...


#: The store kinds (`store.kind`), the default first.
STORES: Registry[StoreKind] = Registry(
    "store.kind",
    {
        "sqlite": "alight.store.sqlite:SqliteStore",
        "memory": "alight.store.memory:MemoryStore",
        "http": "alight.store.client:StoreClient",
    },
)


def store_class(kind: str) -> type[StoreKind]:
    """The class of the store kind `kind`; ConfigError naming the kinds for an unknown one."""
    if kind not in STORES:
        raise ConfigError(f"store.kind={kind!r}: expected one of {', '.join(STORES)}")
    return STORES.get(kind)


def refuse_url(cfg: StoreConfig, kind: str) -> None:
    """ConfigError where a kind that is not a server is given `store.url`."""
    if cfg.url:
        raise ConfigError(f"store.url is set but store.kind={kind}: drop store.url, or set store.kind=http")


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
        return parse_url(spec)
    return store_class(store_kind(spec)).check_config(spec)


def server_spec(cfg: StoreConfig, kind: str) -> StoreSpec:
    """The spec of a store server's `store.url` (kind http); ConfigError when it names none."""
    if not cfg.url:
        raise ConfigError(f"store.kind={kind} needs store.url (an `alight store` server, http://HOST:PORT)")
    parsed = parse_url(cfg.url, key="store.url")
    if parsed.kind != kind:
        raise ConfigError(f"store.url={cfg.url!r}: store.kind={kind} needs http://HOST:PORT or https://HOST:PORT")
    return parsed


def parse_url(url: str, key: str = "store URL") -> StoreSpec:
    """The store choice a URL spells (sqlite:///PATH, memory://, http(s)://HOST:PORT); one-line
    ConfigError naming `key` otherwise."""
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
    options = OpenOptions(default_path, create, token, max_retries, write_id_limits)
    return store_class(checked.kind).from_spec(checked, options)
