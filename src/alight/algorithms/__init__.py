"""LightningRL: credit assignment, automatic intermediate rewards (AIR), advantages, the batch format.

`LightningRL.from_config(adapter_cfg, algorithm_cfg, tokenizer=...)` is the entry point:
`.adapt_rollouts(rollouts, spans_by_rollout) -> (transitions, stats)` and
`.batch(transitions, pad_id) -> TransitionBatch`. The parts are pure functions over plain data.
"""

from alight.algorithms.advantages import (
    ESTIMATORS,
    compute_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
)
from alight.algorithms.air import AirRule, AirRules, air_rewards, parse_air_rules
from alight.algorithms.batch import META_KEYS, TransitionBatch
from alight.algorithms.credit import (
    CREDIT_MODES,
    Credit,
    discounted_credit,
    identity_credit,
    last_credit,
    make_credit,
)
from alight.algorithms.lightning import LightningRL, credit_and_advantages

__all__ = [
    "CREDIT_MODES",
    "ESTIMATORS",
    "META_KEYS",
    "AirRule",
    "AirRules",
    "Credit",
    "LightningRL",
    "TransitionBatch",
    "air_rewards",
    "compute_advantages",
    "credit_and_advantages",
    "discounted_credit",
    "grpo_advantages",
    "identity_credit",
    "last_credit",
    "make_credit",
    "parse_air_rules",
    "reinforce_pp_advantages",
    "rloo_advantages",
]
