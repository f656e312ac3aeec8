"""APO: automatic prompt optimisation over the same traces RL uses (`algorithm.name: apo`).

The agent reads its prompt from a `PromptTemplate` resource; `PromptSearch` keeps a beam of the
best-scored prompts, `LLMOptimizer` writes critiques and edits with any chat model. The trainer
side (`alight.trainer.loops.apo`) runs the rollouts through the run's stack."""

from alight.algorithms.apo.optimizer import Chat, LLMOptimizer, Optimizer, Proposal, critique_messages, edit_messages
from alight.algorithms.apo.parsing import check_candidate, parse_candidates, placeholders
from alight.algorithms.apo.record import append_history, load_prompt, read_history, save_best
from alight.algorithms.apo.search import Candidate, PromptSearch, RoundReport, Scored, SearchSettings, select_beam
from alight.algorithms.apo.traces import read_traces, render_trace

__all__ = [
    "Candidate",
    "Chat",
    "LLMOptimizer",
    "Optimizer",
    "PromptSearch",
    "Proposal",
    "RoundReport",
    "Scored",
    "SearchSettings",
    "append_history",
    "check_candidate",
    "critique_messages",
    "edit_messages",
    "load_prompt",
    "parse_candidates",
    "placeholders",
    "read_history",
    "read_traces",
    "render_trace",
    "save_best",
    "select_beam",
]
