"""The agent API: `@alight.rollout` for function agents, `LitAgent` for class agents.

An agent is the user's own code. It receives what it declares among `task` (the task's input),
`llm` (the policy model, bound to this rollout), `resources` (every named resource), `rollout` and
`attempt`, matched by parameter name; it may be sync or async. It returns a float reward, or None
when it emitted rewards itself (`alight.emit_reward`).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError
from alight.types import Attempt, LLMResource, ResourceSet, Rollout

#: Parameters an agent may declare; anything else it requires is a configuration error.
AGENT_PARAMETERS = ("task", "llm", "resources", "rollout", "attempt")


class AgentFailure(Exception):
    """An agent failure whose message tells the whole story (a command agent's exit code and stderr
    tail): the runner stores the message on the attempt, without a Python traceback."""


class LLM(BaseModel):
    """The policy model as an agent sees it: an OpenAI-compatible endpoint bound to one attempt.

    Pass `base_url`, `api_key` and `model` to any OpenAI client (`anthropic_base_url` to an
    Anthropic client); every call made through it is recorded for this rollout."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str
    base_url: str
    api_key: str = "alight"
    sampling_parameters: dict[str, Any] = Field(default_factory=dict)

    @property
    def anthropic_base_url(self) -> str:
        """The base URL for Anthropic clients (`anthropic.Anthropic(base_url=...)`, `ANTHROPIC_BASE_URL`):
        `base_url` without its `/v1`, which they add themselves (`/v1/messages`)."""
        return self.base_url.removesuffix("/").removesuffix("/v1")


def attempt_base_url(endpoint: str, rollout_id: str, attempt_id: str) -> str:
    """The base URL of the proxy route that records calls for one attempt."""
    return f"{endpoint.rstrip('/')}/rollout/{rollout_id}/attempt/{attempt_id}/v1"


def bind_resources(
    resource_set: ResourceSet | None,
    rollout_id: str,
    attempt_id: str,
    *,
    api_key: str | None = None,
    agent_key: str | None = None,
) -> dict[str, Any]:
    """Resources as the agent gets them: each `LLMResource` becomes an `LLM` bound to the attempt,
    its `api_key` the attempt's `agent_key` (minted by a store server with a token, which the proxy
    checks), else the resource's, else `api_key`."""
    if resource_set is None:
        return {}
    bound: dict[str, Any] = {}
    for name, resource in resource_set.resources.items():
        if isinstance(resource, LLMResource):
            bound[name] = LLM(
                model=resource.model,
                base_url=attempt_base_url(resource.endpoint, rollout_id, attempt_id),
                api_key=agent_key or resource.api_key or api_key or "alight",
                sampling_parameters=dict(resource.sampling_parameters),
            )
        else:
            bound[name] = resource
    return bound


def _first_llm(resources: Mapping[str, Any]) -> LLM | None:
    main = resources.get("llm")
    if isinstance(main, LLM):
        return main
    return next((value for value in resources.values() if isinstance(value, LLM)), None)


class LitAgent:
    """Base class of class agents: override `rollout` (sync or async) with the parameters you need."""

    #: Name recorded on the agent's spans; defaults to the class name.
    name: str = ""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.name or type(self).__name__
        self._wanted = _declared_parameters(self.rollout, self.name)

    def rollout(self, *args: Any, **kwargs: Any) -> Any:
        """Run the agent on one task; return a float reward or None."""
        raise NotImplementedError(f"agent {self.name} does not implement rollout()")

    async def run(
        self,
        task: Any,
        resources: Mapping[str, Any],
        rollout: Rollout,
        attempt: Attempt | None = None,
    ) -> float | None:
        """Call `rollout` with the parameters it declares. Sync agents run in a worker thread (the
        caller's context variables go with them), so the event loop keeps heartbeating."""
        offered: dict[str, Any] = {
            "task": task,
            "llm": _first_llm(resources),
            "resources": dict(resources),
            "rollout": rollout,
            "attempt": attempt,
        }
        kwargs = {key: offered[key] for key in self._wanted}
        if inspect.iscoroutinefunction(self.rollout):
            result = await self.rollout(**kwargs)
        else:
            result = await asyncio.to_thread(self.rollout, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return _as_reward(result, self.name)


class FunctionAgent(LitAgent):
    """A plain function turned into an agent by `@alight.rollout`."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.rollout = fn  # type: ignore[method-assign]
        super().__init__(name or getattr(fn, "__name__", "agent"))
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calling the decorated function still runs the user's function unchanged."""
        return self.fn(*args, **kwargs)


class NamedEntrypoint(LitAgent):
    """The agent at `entrypoint` (`module:name` or `path/to/file.py:name`) under the name `name`
    (a config's `agent.name`). Only the two strings travel to pool workers and Ray actors; each
    imports the agent on its first rollout."""

    def __init__(self, entrypoint: str, name: str) -> None:
        if not name.strip():
            raise ConfigError(f"agent.name {name!r}: an agent's name must not be empty")
        self.entrypoint = entrypoint
        self.name = name
        self._agent: LitAgent | None = None

    def __repr__(self) -> str:
        return f"NamedEntrypoint({self.entrypoint!r}, name={self.name!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"entrypoint": self.entrypoint, "name": self.name, "_agent": None}

    async def run(
        self, task: Any, resources: Mapping[str, Any], rollout: Rollout, attempt: Attempt | None = None
    ) -> float | None:
        if self._agent is None:
            self._agent = load_agent(self.entrypoint)
        return await self._agent.run(task, resources, rollout, attempt)


def rollout(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Decorator: `@alight.rollout` or `@alight.rollout(name="writer")` makes a function an agent."""
    if fn is None:
        return lambda f: FunctionAgent(f, name)
    return FunctionAgent(fn, name)


def _declared_parameters(fn: Callable[..., Any], agent_name: str) -> tuple[str, ...]:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"agent {agent_name}: cannot read its signature ({err})") from None
    wanted: list[str] = []
    for param in signature.parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if param.name in AGENT_PARAMETERS:
            wanted.append(param.name)
        elif param.default is inspect.Parameter.empty:
            raise ConfigError(
                f"agent {agent_name}: parameter {param.name!r} is not one alight can pass "
                f"(choose among {', '.join(AGENT_PARAMETERS)})"
            )
    return tuple(wanted)


def _as_reward(result: Any, agent_name: str) -> float | None:
    if result is None:
        return None
    if isinstance(result, bool) or not isinstance(result, int | float):
        raise TypeError(f"agent {agent_name} returned {type(result).__name__}; it must return a float reward or None")
    if not math.isfinite(result):  # the store refuses it, and it would poison every advantage of the group
        raise ValueError(f"agent {agent_name} returned {result!r}; a reward must be a finite number")
    return float(result)


def load_agent(entrypoint: str) -> LitAgent:
    """Load an agent from `package.module:name` or `path/to/file.py:name`.

    `name` may be a `LitAgent` (e.g. a decorated function), a `LitAgent` subclass (instantiated
    with no arguments) or a plain function (wrapped). Problems raise a one-line ConfigError."""
    obj = resolve_entrypoint(entrypoint, what="agent")
    if isinstance(obj, LitAgent):
        return obj
    if isinstance(obj, type) and issubclass(obj, LitAgent):
        try:
            return obj()
        except TypeError as err:
            raise ConfigError(f"agent entrypoint {entrypoint!r}: cannot create {obj.__name__}() ({err})") from None
    if callable(obj):
        return FunctionAgent(obj)
    raise ConfigError(f"agent entrypoint {entrypoint!r} is a {type(obj).__name__}, not a function or LitAgent")
