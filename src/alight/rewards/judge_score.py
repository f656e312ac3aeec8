"""What an LLM judge is asked and how its answer becomes a score (reward.kind=judge).

The judge gets two messages: a system message fixing the answer format (`{"score": s}`, s from 0
to `max_score`) and the rubric with `{task}` and `{answer}` replaced (plain text replacement, so a
rubric may show JSON braces). `parse_score` reads what judges actually answer: a JSON object with
"score", "Score: 7/10" (a fraction is scaled to `max_score`), or a bare number; anything else, or a
score that is not finite or lies outside [0, max_score], raises `JudgeAnswerError` with a one-line
reason.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from alight.config.schema import JudgeConfig
from alight.errors import ConfigError, one_line

#: The rubric used when `reward.judge.rubric` is empty.
DEFAULT_RUBRIC = (
    "Judge how well the answer solves the task. Give 0 for a wrong, empty or off-topic answer, the "
    "maximum score for a fully correct and complete one, and partial credit in between.\n\n"
    "Task:\n{task}\n\nAnswer:\n{answer}"
)
#: The system message of every judgement; {max_score} is filled in.
FORMAT_INSTRUCTION = (
    'You are a strict, fair judge. Reply with a JSON object {{"score": s}}, s a number from 0 to {max_score}.'
)
#: How many characters of a judge's unreadable answer an attempt's error quotes.
QUOTED_ANSWER_CHARS = 120

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_LABELLED = re.compile(rf"score\W{{0,3}}?\s*({_NUMBER})(?:\s*(?:/|out of)\s*({_NUMBER}))?", re.IGNORECASE)
_FRACTION = re.compile(rf"^({_NUMBER})\s*(?:/|out of)\s*({_NUMBER})$", re.IGNORECASE)
_BARE = re.compile(rf"^({_NUMBER})\.?$")
_THINKING = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


class JudgeAnswerError(ValueError):
    """The judge's answer holds no usable score; the message says why, in one line."""


def check_judge(judge: JudgeConfig) -> None:
    """ConfigError, in one line, for a judge configuration that cannot score anything."""
    if judge.rubric and "{answer}" not in judge.rubric:
        raise ConfigError("reward.judge.rubric must contain the placeholder {answer} (and usually {task})")
    score = judge.max_score
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score) or score <= 0:
        raise ConfigError(f"reward.judge.max_score must be a positive number, got {score!r}")
    if judge.temperature < 0:
        raise ConfigError(f"reward.judge.temperature must be at least 0, got {judge.temperature!r}")
    if judge.max_tokens < 1:
        raise ConfigError(f"reward.judge.max_tokens must be at least 1, got {judge.max_tokens!r}")
    if not judge.model:
        raise ConfigError("reward.judge.model must be 'policy' or a LiteLLM model string")


def task_text(task: Any, task_field: str | None = None) -> str:
    """The task as the judge reads it: `task[task_field]` when named, a string as it is, else JSON."""
    if task_field is not None:
        if not isinstance(task, dict) or task_field not in task:
            raise JudgeAnswerError(f"judge: the task has no field {task_field!r} (reward.judge.task_field)")
        task = task[task_field]
    return task if isinstance(task, str) else json.dumps(task, default=str, ensure_ascii=False)


def judge_messages(judge: JudgeConfig, task: str, answer: str) -> list[dict[str, str]]:
    """The chat messages of one judgement."""
    rubric = judge.rubric or DEFAULT_RUBRIC
    prompt = rubric.replace("{task}", task).replace("{answer}", answer)
    return [
        {"role": "system", "content": FORMAT_INSTRUCTION.format(max_score=f"{judge.max_score:g}")},
        {"role": "user", "content": prompt},
    ]


def parse_score(text: str | None, max_score: float) -> float:
    """The score in [0, max_score] that the judge's answer `text` states; JudgeAnswerError otherwise."""
    body = _THINKING.sub("", text or "").strip()
    score = _stated_score(body, max_score)
    if score is None:
        quoted = one_line(body, QUOTED_ANSWER_CHARS) if body else "an empty answer"
        raise JudgeAnswerError(f"judge: no score in its answer ({quoted!r})")
    if not math.isfinite(score):
        raise JudgeAnswerError(f"judge: its score {score!r} is not a finite number")
    if not 0 <= score <= max_score:
        raise JudgeAnswerError(f"judge: its score {score:g} is outside [0, {max_score:g}]")
    return score


def _stated_score(body: str, max_score: float) -> float | None:
    for candidate in reversed(_JSON_OBJECT.findall(body)):  # the last JSON object with a score wins
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict) and "score" in value:
            return _number(value["score"])
    labelled = _LABELLED.findall(body)
    if labelled:
        value_text, out_of = labelled[-1]
        return _scaled(float(value_text), out_of, max_score)
    lines = [line.strip().strip("*`").strip() for line in body.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    fraction = _FRACTION.match(last)
    if fraction:
        return _scaled(float(fraction.group(1)), fraction.group(2), max_score)
    bare = _BARE.match(last)
    return float(bare.group(1)) if bare else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            return None
    return None


def _scaled(value: float, out_of: str, max_score: float) -> float:
    """`value` out of `out_of` (when stated, and positive) on the [0, max_score] scale."""
    if not out_of:
        return value
    denominator = float(out_of)
    if denominator <= 0:
        return math.nan
    return value if denominator == max_score else value / denominator * max_score
