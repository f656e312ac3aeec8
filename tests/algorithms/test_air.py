"""AIR rules: which tool spans they reward, with what, and their config errors."""

from __future__ import annotations

from typing import Any

import pytest

from alight.algorithms import air_rewards, parse_air_rules
from alight.errors import ConfigError
from tests.adapters.factory import Trace

RULES = [
    {"match": {"kind": "tool", "name": "run_sql|execute"}, "on_error": -0.2, "sql_fails": -0.5, "sql_succeeds": 0.1},
    {"match": {"name": "bash", "agent": "coder"}, "on_success": 0.05, "exit_status_nonzero": -0.1},
]


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        ({"name": "run_sql", "error": True, "sql": "select x"}, -0.7),  # on_error + sql_fails
        ({"name": "execute", "sql": "select 1"}, 0.1),  # sql_succeeds
        ({"name": "run_sql"}, None),  # succeeded, no SQL recorded: 0 is no reward
        ({"name": "bash", "agent": "coder", "exit_status": 1}, 0.05 - 0.1),
        ({"name": "bash", "agent": "coder", "exit_status": 0}, 0.05),
        ({"name": "bash", "agent": "reviewer", "exit_status": 1}, None),  # agent does not match
        ({"name": "run_sql_v2", "error": True}, None),  # names match in full
    ],
)
def test_rules_reward_tool_spans(tool: dict[str, Any], expected: float | None) -> None:
    trace = Trace()
    span = trace.tool(**tool)
    got = air_rewards(trace.spans, parse_air_rules(RULES))
    assert got == ([] if expected is None else [(span.span_id, pytest.approx(expected))])


def test_the_first_matching_rule_decides_and_empty_rules_are_falsy() -> None:
    trace = Trace()
    trace.tool("run_sql", error=True)
    rules = parse_air_rules([{"match": {"name": "run_.*"}, "on_error": -1.0}, {"on_error": -9.0}])
    assert [value for _, value in air_rewards(trace.spans, rules)] == [-1.0]
    assert not parse_air_rules([])


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"on_eror": -1}], r"adapter.air\[0\] has unknown keys \['on_eror'\]"),
        ([{"match": {"kind": "llm"}}], "match.kind must be 'tool'"),
        ([{"match": {"tool": "x"}}], "match must be a mapping with keys among kind, name, agent"),
        ([{"on_error": "bad"}], "on_error must be a number"),
        ([{"match": {"name": "("}}], "is not a valid regex"),
        (["on_error"], "must be a mapping"),
    ],
)
def test_malformed_rules_are_config_errors(rules: list[Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_air_rules(rules)
