"""Credit assignment modes on hand-computed tables."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from alight.algorithms import discounted_credit, identity_credit, last_credit, make_credit
from alight.errors import ConfigError
from alight.types import Transition

# (episode reward R, intermediate rewards i_t, gamma, identity, discounted, last)
TABLE = [
    (1.0, [0.0, 0.0, 0.0], 0.5, [1.0, 1.0, 1.0], [0.25, 0.5, 1.0], [0.0, 0.0, 1.0]),
    # G = 1 - 0.1 = 0.9; return-to-go: G2 = 0 + 1, G1 = -0.2 + 0.5 * 1 = 0.3, G0 = 0.1 + 0.5 * 0.3 = 0.25
    (1.0, [0.1, -0.2, 0.0], 0.5, [0.9, 0.9, 0.9], [0.25, 0.3, 1.0], [0.0, 0.0, 0.9]),
    (2.0, [0.5], 0.9, [2.5], [2.5], [2.5]),
    (-1.0, [0.0, 0.0], 1.0, [-1.0, -1.0], [-1.0, -1.0], [0.0, -1.0]),
    (0.0, [0.0, 0.3], 0.9, [0.3, 0.3], [0.27, 0.3], [0.0, 0.3]),
    (3.0, [], 0.9, [], [], []),
]


@pytest.mark.parametrize(("episode", "intermediate", "gamma", "identity", "discounted", "last"), TABLE)
def test_credit_modes(
    episode: float,
    intermediate: list[float],
    gamma: float,
    identity: list[float],
    discounted: list[float],
    last: list[float],
) -> None:
    assert identity_credit(episode, intermediate) == pytest.approx(identity)
    assert discounted_credit(episode, intermediate, gamma) == pytest.approx(discounted)
    assert last_credit(episode, intermediate) == pytest.approx(last)
    assert make_credit("identity")(episode, intermediate) == pytest.approx(identity)
    assert make_credit("discounted", gamma=gamma)(episode, intermediate) == pytest.approx(discounted)
    assert make_credit("last")(episode, intermediate) == pytest.approx(last)


def test_how_each_mode_computes_advantages() -> None:
    assert (make_credit("identity").per_transition, make_credit("identity").final_only) == (False, False)
    assert (make_credit("last").per_transition, make_credit("last").final_only) == (False, True)
    assert make_credit("discounted").per_transition


USER_MODULE = """
def by_length(transitions, episode_reward):
    total = sum(t["response_length"] for t in transitions)
    return [episode_reward * t["response_length"] / total + t["intermediate_reward"] for t in transitions]

def too_short(transitions, episode_reward):
    return [episode_reward]

def not_numbers(transitions, episode_reward):
    return ["x" for _ in transitions]

def crashes(transitions, episode_reward):
    raise RuntimeError("boom")
"""


@pytest.fixture
def user_module(tmp_path: Path) -> str:
    (tmp_path / "my_credit.py").write_text(USER_MODULE)
    sys.path.insert(0, str(tmp_path))
    yield "my_credit"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("my_credit", None)


def _transitions(lengths: list[int]) -> list[Transition]:
    return [
        Transition(prompt_ids=[1], response_ids=[2] * n, reward=0.0, rollout_id="r", step_index=i)
        for i, n in enumerate(lengths)
    ]


def test_a_user_function_gets_plain_transitions(user_module: str) -> None:
    credit = make_credit(f"{user_module}:by_length")
    assert credit.per_transition and not credit.final_only
    assert credit(2.0, [0.0, 0.5], _transitions([1, 3])) == pytest.approx([0.5, 2.0])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("too_short", "must return 2 rewards, got 1 values"),
        ("not_numbers", "not a finite number"),
        ("crashes", "failed: RuntimeError: boom"),
    ],
)
def test_a_misbehaving_user_function_is_a_one_line_config_error(user_module: str, name: str, message: str) -> None:
    credit = make_credit(f"{user_module}:{name}")
    with pytest.raises(ConfigError, match=message):
        credit(1.0, [0.0, 0.0], _transitions([1, 1]))


@pytest.mark.parametrize(
    ("spec", "gamma", "message"),
    [
        ("sideways", 0.9, "credit must be one of identity, discounted, last"),
        ("no_such_module_xyz:fn", 0.9, "no module named"),
        ("identity", 1.5, "gamma must be in"),
    ],
)
def test_bad_credit_settings(spec: str, gamma: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_credit(spec, gamma=gamma)
