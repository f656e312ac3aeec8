"""AIR, automatic intermediate rewards: system signals in tool spans turned into rewards by config rules.

The agent emits nothing: a tool that raised, a process that exited non-zero, a SQL statement that
failed become small rewards attached, like a mid-episode reward, to the LLM call that asked for the
tool (the latest kept call before the tool span). A rule, as YAML under `adapter.air`:

    - match: {kind: tool, name: "run_sql|execute", agent: "writer"}  # regexes, full match; optional
      on_error: -0.2            # the tool failed: span status error, or tool.error true
      on_success: 0.0           # the tool did not fail
      exit_status_nonzero: -0.1 # tool.exit_status is present and not 0
      sql_fails: -0.5           # tool.sql is present and the tool failed
      sql_succeeds: 0.1         # tool.sql is present and the tool did not fail

The first rule whose `match` fits a tool span decides; the values of all its conditions that hold
are added (a failing SQL tool with the rule above gets -0.2 + -0.5). A total of 0 is no reward.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from alight import semconv
from alight.adapters.spans import SpanLike, attributes_of, ordered_spans
from alight.errors import ConfigError

_VALUE_KEYS = ("on_error", "on_success", "exit_status_nonzero", "sql_fails", "sql_succeeds")
_MATCH_KEYS = ("kind", "name", "agent")


@dataclass(frozen=True, slots=True)
class AirRule:
    """One rule: which tool spans it matches and the reward of each condition."""

    name: re.Pattern[str] | None = None  # tool name, full match; None: every tool
    agent: re.Pattern[str] | None = None  # agent name, full match; None: every agent
    on_error: float = 0.0
    on_success: float = 0.0
    exit_status_nonzero: float = 0.0
    sql_fails: float = 0.0
    sql_succeeds: float = 0.0

    def reward(self, tool_name: str, status: str, attributes: Mapping[str, Any], agent: str | None) -> float | None:
        """This rule's reward for a tool span, or None when the rule does not match it."""
        if self.name is not None and self.name.fullmatch(tool_name) is None:
            return None
        if self.agent is not None and self.agent.fullmatch(agent or "") is None:
            return None
        failed = status == "error" or attributes.get(semconv.TOOL_ERROR) is True
        total = self.on_error if failed else self.on_success
        exit_status = attributes.get(semconv.TOOL_EXIT_STATUS)
        if isinstance(exit_status, int) and not isinstance(exit_status, bool) and exit_status != 0:
            total += self.exit_status_nonzero
        if attributes.get(semconv.TOOL_SQL):
            total += self.sql_fails if failed else self.sql_succeeds
        return total


class AirRules:
    """A list of rules as the adapter's `tool_reward`: the first matching rule's non-zero reward, or None."""

    def __init__(self, rules: Sequence[AirRule]) -> None:
        self.rules = tuple(rules)

    def __call__(self, tool_name: str, status: str, attributes: Mapping[str, Any], agent: str | None) -> float | None:
        name = attributes.get(semconv.TOOL_NAME) or tool_name
        for rule in self.rules:
            value = rule.reward(str(name), status, attributes, agent)
            if value is not None:
                return value or None
        return None

    def __bool__(self) -> bool:
        return bool(self.rules)


def parse_air_rules(rules: Iterable[Mapping[str, Any]]) -> AirRules:
    """Rules from config data (a list of dicts, see the module doc). ConfigError for a malformed rule."""
    parsed = []
    for i, rule in enumerate(rules):
        where = f"adapter.air[{i}]"
        if not isinstance(rule, Mapping):
            raise ConfigError(f"{where} must be a mapping, got {type(rule).__name__}")
        unknown = sorted(set(rule) - {"match", *_VALUE_KEYS})
        if unknown:
            raise ConfigError(f"{where} has unknown keys {unknown}; known: match, {', '.join(_VALUE_KEYS)}")
        match = rule.get("match") or {}
        if not isinstance(match, Mapping) or set(match) - set(_MATCH_KEYS):
            raise ConfigError(f"{where}.match must be a mapping with keys among {', '.join(_MATCH_KEYS)}")
        if match.get("kind", "tool") != "tool":
            raise ConfigError(f"{where}.match.kind must be 'tool' (AIR reads tool spans), got {match.get('kind')!r}")
        values = {}
        for key in _VALUE_KEYS:
            value = rule.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ConfigError(f"{where}.{key} must be a number, got {value!r}")
            values[key] = float(value)
        parsed.append(
            AirRule(
                name=_regex(match.get("name"), f"{where}.match.name"),
                agent=_regex(match.get("agent"), f"{where}.match.agent"),
                **values,
            )
        )
    return AirRules(parsed)


def air_rewards(spans: Iterable[SpanLike], rules: AirRules) -> list[tuple[str | None, float]]:
    """(span id, reward) of every tool span of one attempt that the rules reward, in attempt order."""
    out = []
    ordered, _ = ordered_spans(spans)
    for span in ordered:
        if span.get("kind") == "tool":
            attributes = attributes_of(span)
            agent = attributes.get(semconv.AGENT_NAME)
            status = str(span.get("status") or "unset")
            value = rules(span.get("name") or "", status, attributes, None if agent is None else str(agent))
            if value is not None:
                out.append((span.get("span_id"), value))
    return out


def _regex(pattern: Any, where: str) -> re.Pattern[str] | None:
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise ConfigError(f"{where} must be a regex string, got {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ConfigError(f"{where} {pattern!r} is not a valid regex: {err}") from None
