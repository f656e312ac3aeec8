"""`algorithm.apo` settings checked before anything starts (one-line ConfigErrors), and the search
settings they give."""

from __future__ import annotations

from alight.algorithms.apo.parsing import placeholders
from alight.algorithms.apo.search import SearchSettings
from alight.config.schema import ApoConfig
from alight.errors import ConfigError


def check_apo(apo: ApoConfig) -> None:
    """ConfigError, in one line, for a setting the search cannot run with."""
    ranges = {
        "rounds": apo.rounds >= 1,
        "beam_width": apo.beam_width >= 1,
        "candidates": apo.candidates >= 1,
        "train_batch_size": apo.train_batch_size >= 1,
        "val_size": apo.val_size >= 1,
        "n_traces": apo.n_traces >= 1,
        "trace_chars": apo.trace_chars >= 100,
        "max_prompt_chars": apo.max_prompt_chars >= 1,
    }
    bad = [name for name, ok in ranges.items() if not ok]
    if bad:
        raise ConfigError(f"algorithm.apo.{bad[0]} is out of range: {getattr(apo, bad[0])!r}")
    if not apo.resource or apo.resource == "llm":
        raise ConfigError(f"algorithm.apo.resource must name the prompt resource (not 'llm'), got {apo.resource!r}")
    if placeholders(apo.prompt) is None:
        raise ConfigError("algorithm.apo.prompt is not a valid f-string template (unbalanced { or }; write {{ for {)")
    if len(apo.prompt) > apo.max_prompt_chars:
        raise ConfigError(f"algorithm.apo.prompt is longer than algorithm.apo.max_prompt_chars={apo.max_prompt_chars}")
    from alight.engines.factory import ENGINES

    if apo.optimizer.kind not in ENGINES:
        raise ConfigError(
            f"algorithm.apo.optimizer.kind must be one of {', '.join(ENGINES)}, got {apo.optimizer.kind!r}"
        )
    if apo.optimizer.model == "policy" and not ENGINES.get(apo.optimizer.kind).capabilities.in_process:
        raise ConfigError(
            "algorithm.apo.optimizer.model 'policy' (the policy's own model) needs optimizer.kind embedded"
        )


def search_settings(apo: ApoConfig) -> SearchSettings:
    """The search's settings from a checked `algorithm.apo`."""
    return SearchSettings(
        rounds=apo.rounds,
        beam_width=apo.beam_width,
        candidates=apo.candidates,
        n_traces=apo.n_traces,
        max_prompt_chars=apo.max_prompt_chars,
    )
