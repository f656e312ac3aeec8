"""Credit assignment (LightningRL): how an episode's reward is spread over its transitions.

Pure functions over plain numbers. Each takes the episode reward `R` and the intermediate rewards
`i_t` attached to the T transitions of one rollout (mid-episode reward spans and AIR; see
`alight.adapters.SpanAdapter`) and returns one reward per transition:

- `identity` (the Agent Lightning paper's choice): every transition gets the episode's return
  `G = R + sum(i_t)`. Advantages are computed per rollout from G and shared by its transitions.
- `discounted`: transition t gets its discounted return-to-go `G_t = sum_{k>=t} gamma^(k-t) r_k`
  with `r_k = i_k`, plus R on the last step; with no intermediate rewards `G_t = gamma^(T-1-t) R`.
  Advantages are computed per transition (see `alight.algorithms.advantages`).
- `last`: the final transition gets the whole return `G`, the others 0. Advantages are computed per
  rollout from G like `identity`, but only the final transition gets it: the others get advantage
  0, so they add no policy-gradient signal (they still count in stats and in KL terms).
- `"module:function"`: a user function `fn(transitions, episode_reward) -> list[float]`, where
  `transitions` are plain dicts (agent_name, step_index, intermediate_reward, prompt_length,
  response_length, span_id, rollout_id, metadata). Advantages are computed per transition.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from alight.entrypoints import resolve_entrypoint
from alight.errors import ConfigError, one_line
from alight.types import Transition

#: Built-in credit modes; anything else must be a "module:function" entrypoint.
CREDIT_MODES = ("identity", "discounted", "last")

#: A user credit function: (transitions as plain dicts, episode reward) -> one reward per transition.
UserCredit = Callable[[list[dict[str, Any]], float], Sequence[float]]


def identity_credit(episode_reward: float, intermediate: Sequence[float]) -> list[float]:
    """Every transition gets the episode's return `R + sum(intermediate)`."""
    total = episode_reward + math.fsum(intermediate)
    return [total] * len(intermediate)


def discounted_credit(episode_reward: float, intermediate: Sequence[float], gamma: float) -> list[float]:
    """The discounted return-to-go of each transition; R counts as a reward of the last one."""
    out = [0.0] * len(intermediate)
    running = episode_reward
    for t in range(len(intermediate) - 1, -1, -1):
        running = intermediate[t] + (running if t == len(intermediate) - 1 else gamma * running)
        out[t] = running
    return out


def last_credit(episode_reward: float, intermediate: Sequence[float]) -> list[float]:
    """The final transition gets the return `R + sum(intermediate)`, the earlier ones 0."""
    out = [0.0] * len(intermediate)
    if out:
        out[-1] = episode_reward + math.fsum(intermediate)
    return out


@dataclass(frozen=True, slots=True)
class Credit:
    """A credit mode and how advantages are computed under it."""

    name: str
    per_transition: bool  # advantages per transition (discounted, user function) or per rollout (identity, last)
    final_only: bool  # `last`: only the final transition of a rollout gets a (non-zero) advantage
    gamma: float = 1.0
    user_fn: UserCredit | None = None

    def __call__(
        self, episode_reward: float, intermediate: Sequence[float], transitions: Sequence[Transition] = ()
    ) -> list[float]:
        """One reward per transition of a rollout (`transitions` is only read by user functions)."""
        if self.name == "identity":
            return identity_credit(episode_reward, intermediate)
        if self.name == "discounted":
            return discounted_credit(episode_reward, intermediate, self.gamma)
        if self.name == "last":
            return last_credit(episode_reward, intermediate)
        assert self.user_fn is not None
        return _call_user(self.name, self.user_fn, episode_reward, intermediate, transitions)


def make_credit(spec: str, *, gamma: float = 1.0) -> Credit:
    """The credit mode a config names: a built-in name or a "module:function" entrypoint.

    Raises:
        ConfigError: an unknown name, an entrypoint that does not resolve to a callable, or a
            `gamma` outside [0, 1].
    """
    if not 0.0 <= gamma <= 1.0:
        raise ConfigError(f"credit gamma must be in [0, 1], got {gamma}")
    if spec in ("identity", "last"):
        return Credit(spec, per_transition=False, final_only=spec == "last", gamma=gamma)
    if spec == "discounted":
        return Credit(spec, per_transition=True, final_only=False, gamma=gamma)
    if ":" not in spec:
        raise ConfigError(f"credit must be one of {', '.join(CREDIT_MODES)} or 'module:function', got {spec!r}")
    fn = resolve_entrypoint(spec, what="credit")
    if not callable(fn):
        raise ConfigError(f"credit entrypoint {spec!r} is not callable")
    return Credit(spec, per_transition=True, final_only=False, gamma=gamma, user_fn=fn)


def transition_dicts(transitions: Sequence[Transition], intermediate: Sequence[float]) -> list[dict[str, Any]]:
    """Transitions as the plain dicts a user credit function receives."""
    return [
        {
            "agent_name": t.agent_name,
            "step_index": t.step_index,
            "intermediate_reward": reward,
            "prompt_length": len(t.prompt_ids),
            "response_length": len(t.response_ids),
            "span_id": t.span_id,
            "rollout_id": t.rollout_id,
            "metadata": t.metadata,
        }
        for t, reward in zip(transitions, intermediate, strict=True)
    ]


def _call_user(
    name: str,
    fn: UserCredit,
    episode_reward: float,
    intermediate: Sequence[float],
    transitions: Sequence[Transition],
) -> list[float]:
    try:
        result = fn(transition_dicts(transitions, intermediate), episode_reward)
    except Exception as err:
        raise ConfigError(f"credit function {name!r} failed: {one_line(err)}") from None
    if not isinstance(result, Sequence) or isinstance(result, str | bytes) or len(result) != len(intermediate):
        got = f"{len(result)} values" if isinstance(result, Sequence) else type(result).__name__
        raise ConfigError(f"credit function {name!r} must return {len(intermediate)} rewards, got {got}")
    out = []
    for value in result:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"credit function {name!r} returned {value!r}, not a finite number")
        out.append(float(value))
    return out
