"""Spans -> transitions: agent selection, ordering, re-tokenisation, truncation, trajectory merging.

`SpanAdapter(...).adapt(spans, rollout_id=..., reward=...)` turns one attempt's spans (`Span`
objects or dicts in Span's JSON shape) into an `AdaptedRollout`; `AdapterStats` counts what was
kept, skipped, cut and merged. Credit assignment and advantages live in `alight.algorithms`.
"""

from alight.adapters.adapter import MODES, AdaptedRollout, SpanAdapter, ToolReward, episode_reward
from alight.adapters.calls import LLMCall, truncate_call
from alight.adapters.retokenize import Retokenizer, TokenizeFn, retokenize
from alight.adapters.spans import SpanData, SpanLike, ordered_spans, span_data
from alight.adapters.stats import AdapterStats
from alight.adapters.trajectory import merge_trajectories

__all__ = [
    "MODES",
    "AdaptedRollout",
    "AdapterStats",
    "LLMCall",
    "Retokenizer",
    "SpanAdapter",
    "SpanData",
    "SpanLike",
    "TokenizeFn",
    "ToolReward",
    "episode_reward",
    "merge_trajectories",
    "ordered_spans",
    "retokenize",
    "span_data",
    "truncate_call",
]
