"""alight: train the LLM inside any existing AI agent with reinforcement learning.

The package root stays light (no torch, transformers or litellm at import); the public API is
re-exported here and loaded on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

_EXPORTS = {
    "AlightError": "alight.errors",
    "Attempt": "alight.types",
    "AttemptStatus": "alight.types",
    "LLMResource": "alight.types",
    "PromptTemplate": "alight.types",
    "ResourceSet": "alight.types",
    "Rollout": "alight.types",
    "RolloutMode": "alight.types",
    "RolloutStatus": "alight.types",
    "Span": "alight.types",
    "SpanKind": "alight.types",
    "Task": "alight.types",
    "Transition": "alight.types",
    "Store": "alight.store",
    "MemoryStore": "alight.store",
    "SqliteStore": "alight.store",
    "StoreClient": "alight.store",
    "rollout": "alight.agent",
    "LitAgent": "alight.agent",
    "LLM": "alight.agent",
    "load_agent": "alight.agent",
    "emit_reward": "alight.tracing",
    "emit_tool": "alight.tracing",
    "emit_exception": "alight.tracing",
    "agent_scope": "alight.tracing",
    "make_tracer": "alight.tracing",
    "Trainer": "alight.trainer",
    "FitResult": "alight.trainer",
    "TrainingError": "alight.errors",
    "ExperimentConfig": "alight.config",
    "load_config": "alight.config",
}

__all__ = [
    "LLM",
    "AlightError",
    "Attempt",
    "AttemptStatus",
    "ExperimentConfig",
    "FitResult",
    "LLMResource",
    "LitAgent",
    "MemoryStore",
    "PromptTemplate",
    "ResourceSet",
    "Rollout",
    "RolloutMode",
    "RolloutStatus",
    "Span",
    "SpanKind",
    "SqliteStore",
    "Store",
    "StoreClient",
    "Task",
    "Trainer",
    "TrainingError",
    "Transition",
    "__version__",
    "agent_scope",
    "emit_exception",
    "emit_reward",
    "emit_tool",
    "load_agent",
    "load_config",
    "make_tracer",
    "rollout",
]

if TYPE_CHECKING:
    from alight.agent import LLM, LitAgent, load_agent, rollout
    from alight.config import ExperimentConfig, load_config
    from alight.errors import AlightError, TrainingError
    from alight.store import MemoryStore, SqliteStore, Store, StoreClient
    from alight.tracing import agent_scope, emit_exception, emit_reward, emit_tool, make_tracer
    from alight.trainer import FitResult, Trainer
    from alight.types import (
        Attempt,
        AttemptStatus,
        LLMResource,
        PromptTemplate,
        ResourceSet,
        Rollout,
        RolloutMode,
        RolloutStatus,
        Span,
        SpanKind,
        Task,
        Transition,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'alight' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
