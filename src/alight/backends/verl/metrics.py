"""verl's update metrics in alight's names (what `VerlBackend.update` reports)."""

from __future__ import annotations

from typing import Any

#: alight's metric names -> the names verl's actor and critic report (after verl's own `actor/`
#: and `critic/` prefixes); verl's other metrics pass through under their own names.
METRIC_NAMES = {
    "actor/loss": "actor/loss",
    "actor/pg_loss": "actor/pg_loss",
    "actor/pg_clipfrac": "actor/pg_clipfrac",
    "actor/ppo_kl": "actor/ppo_kl",
    "actor/kl": "actor/kl_loss",
    "actor/entropy": "actor/entropy_loss",
    "actor/grad_norm": "actor/grad_norm",
    "actor/lr": "actor/lr",
    "critic/loss": "critic/loss",
    "critic/vf_loss": "critic/vf_loss",
    "critic/vf_clipfrac": "critic/vf_clipfrac",
    "critic/vpred_mean": "critic/vpred_mean",
    "critic/grad_norm": "critic/grad_norm",
    "critic/lr": "critic/lr",
}
#: verl metrics dropped (constants, or renamed above).
DROPPED_METRICS = ("actor/kl_coef",)


def alight_metrics(output: Any, prefix: str) -> dict[str, float]:
    """verl's reduced metrics of an update (a worker's output), renamed into alight's (`METRIC_NAMES`)."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict

    reduced = reduce_metrics(rename_dict(dict(tu.get(output, "metrics")), prefix))
    renamed = {ours: theirs for ours, theirs in METRIC_NAMES.items() if ours.startswith(prefix)}
    metrics = {ours: float(reduced.pop(theirs)) for ours, theirs in renamed.items() if theirs in reduced}
    for key, value in reduced.items():
        if key not in DROPPED_METRICS and hasattr(value, "__float__"):  # numbers and numpy scalars
            metrics.setdefault(key, float(value))
    return metrics
