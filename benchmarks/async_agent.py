"""The calc agent (recipes/calc/agent.py) whose calculator answers like a remote API: each tool
call takes `ALIGHT_BENCH_TOOL_LATENCY_S` seconds (default 0.5). Used by async_bench.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import alight

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recipes.calc.agent import SYSTEM_PROMPT, converse

LATENCY_S = float(os.environ.get("ALIGHT_BENCH_TOOL_LATENCY_S", "0.5"))


@alight.rollout
def solve(task: dict[str, Any], llm: alight.LLM) -> float:
    """calc's `solve` with a slow tool."""
    return converse(task, llm, SYSTEM_PROMPT, tool_latency_s=LATENCY_S)
