"""The three kinds of credential a server with a token knows, and who holds what (`Grant`).

- the **admin** token (the operator's `--token` / `ALIGHT_TOKEN`): everything;
- a **runner credential** (`alr.<name>.<nonce>.<mac>`), minted by the store server for a runner that
  registers with the admin token: claims, heartbeats, finishes and span writes into the attempts
  that runner holds (claimed under its name, or under `<name>/<worker>` by its worker processes);
- a **per-attempt agent key** (`ala.<secret>`), minted when a runner claims an attempt and handed
  to the agent as its LLM `api_key`: that attempt's proxy routes, and (where the store allows
  agents to write spans) that attempt's own span writes; refused once the attempt has ended.

Agent keys are random (`secrets`); only their SHA-256 is kept, and a presented key is found by its
hash. A runner credential carries a random nonce and an HMAC-SHA256 of its name and nonce keyed by
the token: nothing of it is stored, so it stays valid across restarts of a store with the same
token (rotate the token to revoke every one). The token and the MACs are compared with
`hmac.compare_digest`. Nothing here logs or returns a key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from alight.errors import InvalidRequestError

#: The prefix of runner credentials and of agent keys (the name between the dots is not secret).
RUNNER_PREFIX = "alr."
AGENT_PREFIX = "ala."
#: The environment variable `alight runner` reads a runner credential from.
RUNNER_CREDENTIAL_ENV = "ALIGHT_RUNNER_CREDENTIAL"
#: Agent keys remembered at most (the oldest go first; an attempt's key ends with it anyway).
MAX_AGENT_KEYS = 1 << 20
_SECRET_BYTES = 32

Kind = Literal["admin", "runner", "agent"]


@dataclass(frozen=True)
class Grant:
    """What a presented credential may do: `kind`, and for a runner its `name`, for an agent key
    its attempt (and whether it may write that attempt's spans)."""

    kind: Kind
    name: str | None = None
    rollout_id: str | None = None
    attempt_id: str | None = None
    spans: bool = False

    def holds(self, owner: str | None) -> bool:
        """True when a runner grant covers an attempt claimed by `owner` (its name or a worker under it)."""
        return self.kind == "runner" and owner is not None and (owner == self.name or owner.startswith(f"{self.name}/"))


ADMIN = Grant("admin")


def digest(secret: str) -> str:
    """The SHA-256 of a credential, as it is kept (hex)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def runner_name_of(credential: str) -> str | None:
    """The runner name a runner credential carries (None for anything else)."""
    if not credential.startswith(RUNNER_PREFIX):
        return None
    name, nonce, _ = _runner_parts(credential)
    return name if name and nonce else None


def _runner_parts(credential: str) -> tuple[str, str, str]:
    """(name, nonce, mac) of `alr.<name>.<nonce>.<mac>` (the name may hold dots; empty parts: not one)."""
    head, _, mac = credential[len(RUNNER_PREFIX) :].rpartition(".")
    name, _, nonce = head.rpartition(".")
    return name, nonce, mac


def check_runner_name(name: str) -> str:
    """`name` if it can name a runner (InvalidRequestError otherwise): non-empty, no '/', printable."""
    if not name or "/" in name or not name.isprintable() or len(name) > 200:
        raise InvalidRequestError(f"runner name {name[:80]!r}: expected 1-200 printable characters without '/'")
    return name


class Credentials:
    """Mints and checks runner credentials and agent keys for a server whose admin token is
    `token`. Used on one event loop (the store server's); nothing kept is a secret in clear."""

    def __init__(self, token: str, *, max_agent_keys: int = MAX_AGENT_KEYS) -> None:
        self._token = token.encode("utf-8", "surrogatepass")
        self._max_agent_keys = max_agent_keys
        self._agents: OrderedDict[str, Grant] = OrderedDict()
        self._agent_key_of: dict[str, str] = {}  # attempt id -> the digest of its key

    def mint_runner(self, name: str) -> str:
        """A new runner credential for `name` (earlier ones for that name stay valid)."""
        nonce = secrets.token_urlsafe(_SECRET_BYTES // 2)
        return f"{RUNNER_PREFIX}{check_runner_name(name)}.{nonce}.{self._mac(name, nonce)}"

    def _mac(self, name: str, nonce: str) -> str:
        signed = hmac.new(self._token, f"alight-runner\0{name}\0{nonce}".encode("utf-8", "surrogatepass"), "sha256")
        return base64.urlsafe_b64encode(signed.digest()).rstrip(b"=").decode()

    def mint_agent(self, rollout_id: str, attempt_id: str, *, spans: bool = False) -> str:
        """A new key for the agent of `attempt_id`; it replaces that attempt's earlier key."""
        self.revoke(attempt_id)
        secret = AGENT_PREFIX + secrets.token_urlsafe(_SECRET_BYTES)
        key = digest(secret)
        self._agents[key] = Grant("agent", rollout_id=rollout_id, attempt_id=attempt_id, spans=spans)
        self._agent_key_of[attempt_id] = key
        while len(self._agents) > self._max_agent_keys:
            _, oldest = self._agents.popitem(last=False)
            self._agent_key_of.pop(oldest.attempt_id or "", None)
        return secret

    def revoke_rollout(self, rollout_id: str) -> None:
        """Forget the agent keys of every attempt of `rollout_id` (it ended: finished or cancelled)."""
        ended = [a for a, key in self._agent_key_of.items() if self._agents[key].rollout_id == rollout_id]
        for attempt_id in ended:
            self.revoke(attempt_id)

    def revoke(self, attempt_id: str) -> None:
        """Forget the agent key of `attempt_id` (it ended)."""
        key = self._agent_key_of.pop(attempt_id, None)
        if key is not None:
            self._agents.pop(key, None)

    def lookup(self, secret: str) -> Grant | None:
        """What `secret` may do, or None when it is no credential of this server."""
        given = secret.encode("utf-8", "surrogatepass")
        if hmac.compare_digest(given, self._token):
            return ADMIN
        if secret.startswith(AGENT_PREFIX):
            return self._agents.get(digest(secret))
        if secret.startswith(RUNNER_PREFIX):
            name, nonce, mac = _runner_parts(secret)
            if (
                name
                and nonce
                and hmac.compare_digest(mac.encode("utf-8", "surrogatepass"), self._mac(name, nonce).encode())
            ):
                return Grant("runner", name=name)
        return None

    @property
    def agent_keys(self) -> int:
        """How many agent keys are live (for tests and stats)."""
        return len(self._agents)
