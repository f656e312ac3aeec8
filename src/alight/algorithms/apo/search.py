"""The beam search over prompts: score the initial prompt; each round, every beam member runs a
train batch, the optimiser critiques its lowest-reward traces and writes candidates, the valid
candidates are scored on the validation tasks, and the `beam_width` best prompts stay (a tie keeps
the older prompt, so a candidate must score strictly higher to displace one).

The rollouts are not run here: the caller injects `evaluate` (prompts -> scores and per-rollout
rewards, through whatever runs agents) and `traces` (rollout ids -> text), so this module knows
nothing of the trainer, the store layout or the engines."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from alight.algorithms.apo.optimizer import Optimizer
from alight.algorithms.apo.parsing import check_candidate

logger = logging.getLogger(__name__)


@dataclass
class Scored:
    """One prompt's rollouts on a set of tasks: the mean reward (a failed rollout counts 0) and
    each rollout's reward (None for a failed one), by rollout id."""

    score: float
    rewards: dict[str, float | None] = field(default_factory=dict)


#: Runs each prompt on the split's tasks ("train": a fresh batch per call; "val": the fixed
#: validation tasks) in round `round`; one `Scored` per prompt, in order.
Evaluate = Callable[[Sequence[str], int, str], Awaitable[list[Scored]]]
#: The rendered traces of the rollouts given (rollout id -> reward), in order.
Traces = Callable[[Mapping[str, float | None]], Awaitable[list[str]]]


@dataclass
class Candidate:
    """A prompt the search met, as the history records it. `id` counts up in creation order
    (lower: older); `score` is its validation score (None: never scored, see `error`)."""

    id: int
    round: int
    prompt: str
    parent: int | None
    score: float | None = None
    critique: str | None = None  # the critique of the parent its edit answered
    error: str | None = None  # why it was not scored (refused, or the optimiser failed)

    def record(self) -> dict[str, Any]:
        return asdict(self)


def select_beam(pool: Sequence[Candidate], width: int) -> list[Candidate]:
    """The `width` best scored candidates, best first; ties keep the older (lower id) one."""
    scored = [c for c in pool if c.score is not None]
    return sorted(scored, key=lambda c: (-(c.score or 0.0), c.id))[:width]


@dataclass
class RoundReport:
    """What one round did, for the trainer's metrics and events."""

    round: int
    beam: list[Candidate]
    candidates: list[Candidate]  # made this round, scored or refused
    train_score: float | None = None  # mean train-batch reward of the beam members this round

    @property
    def best(self) -> Candidate:
        return self.beam[0]


@dataclass
class SearchSettings:
    rounds: int = 3
    beam_width: int = 2
    candidates: int = 2
    n_traces: int = 3
    max_prompt_chars: int = 2000


class PromptSearch:
    """The APO search (module docstring). `on_round` gets each `RoundReport` (round 0: the initial
    prompt scored); `history` holds every candidate met, in creation order."""

    def __init__(
        self,
        settings: SearchSettings,
        optimizer: Optimizer,
        evaluate: Evaluate,
        traces: Traces,
        on_round: Callable[[RoundReport], None] | None = None,
    ) -> None:
        self.settings = settings
        self.optimizer = optimizer
        self.evaluate = evaluate
        self.traces = traces
        self.on_round = on_round or (lambda report: None)
        self.history: list[Candidate] = []

    def _new(self, round_: int, prompt: str, parent: int | None, **fields: Any) -> Candidate:
        candidate = Candidate(len(self.history), round_, prompt, parent, **fields)
        self.history.append(candidate)
        return candidate

    async def run(self, initial: str) -> Candidate:
        """Search from `initial`; returns the best candidate (the best-scored prompt met)."""
        root = self._new(0, initial, None)
        [scored] = await self.evaluate([initial], 0, "val")
        root.score = scored.score
        beam = [root]
        self.on_round(RoundReport(0, beam, [root]))
        for round_ in range(1, self.settings.rounds + 1):
            made, train_score = await self._expand(round_, beam)
            valid = [c for c in made if c.error is None]
            if valid:
                for candidate, result in zip(
                    valid, await self.evaluate([c.prompt for c in valid], round_, "val"), strict=True
                ):
                    candidate.score = result.score
            beam = select_beam([*beam, *valid], self.settings.beam_width)
            self.on_round(RoundReport(round_, beam, made, train_score))
        return beam[0]

    async def _expand(self, round_: int, beam: list[Candidate]) -> tuple[list[Candidate], float]:
        """Each beam member's train batch, critique and candidates (refused ones carry `error`)."""
        s = self.settings
        batches = await self.evaluate([c.prompt for c in beam], round_, "train")
        worst = [_lowest(batch.rewards, s.n_traces) for batch in batches]
        texts = await asyncio.gather(*(self.traces(w) for w in worst))
        proposals = await asyncio.gather(
            *(
                self.optimizer.propose(parent.prompt, text, s.candidates)
                for parent, text in zip(beam, texts, strict=True)
            )
        )
        made: list[Candidate] = []
        seen = {c.prompt.strip() for c in self.history}
        for parent, proposal in zip(beam, proposals, strict=True):
            critique = proposal.critique
            if not proposal.candidates:
                made.append(self._new(round_, parent.prompt, parent.id, critique=critique, error=proposal.error))
                continue
            for text in proposal.candidates:
                error = check_candidate(text, parent.prompt, s.max_prompt_chars)
                if error is None and text.strip() in seen:
                    error = "already scored"
                seen.add(text.strip())
                made.append(self._new(round_, text, parent.id, critique=critique, error=error))
        train_score = sum(b.score for b in batches) / len(batches) if batches else 0.0
        return made, train_score


def _lowest(rewards: Mapping[str, float | None], n: int) -> dict[str, float | None]:
    """The `n` lowest-reward rollouts (a failed one, None, counts lowest), in rollout order on ties."""
    order = sorted(enumerate(rewards.items()), key=lambda item: (-1e300 if item[1][1] is None else item[1][1], item[0]))
    return dict(pair for _, pair in order[:n])
