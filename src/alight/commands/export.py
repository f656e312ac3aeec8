"""The SFT export (`alight trace RUN --export-sft`): the transitions fine-tuning from a store would
select (`alight.trainer.sft_source`), written as chat rows to train on anywhere.

An exported row is one selected transition's LLM call as OpenAI chat data: the request's
messages, then the assistant message the model answered (content and tool calls), and the tools
the call offered: `{"messages": [...], "tools": [...]}`, what `warm_start.data` reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from alight import semconv
from alight.algorithms.sft import check_selection
from alight.config.schema import AdapterConfig, AlgorithmConfig
from alight.errors import ConfigError
from alight.trainer.sft_source import Selection, is_url, last_span_id, read_selection


def chat_row(span: Mapping[str, Any]) -> dict[str, Any] | None:
    """One LLM call as `{"messages": [...request, response], "tools": [...]}`; None for a call
    recorded without chat messages (the completions API)."""
    attributes = span.get("attributes") or {}
    messages = attributes.get(semconv.LLM_REQUEST_MESSAGES)
    response = attributes.get(semconv.LLM_RESPONSE_MESSAGE)
    if not isinstance(messages, list) or not isinstance(response, Mapping):
        return None
    answer = {k: v for k, v in response.items() if v is not None}
    answer["role"] = "assistant"
    return {"messages": [*messages, answer], "tools": list(attributes.get(semconv.LLM_REQUEST_TOOLS) or [])}


def chat_rows(selection: Selection) -> tuple[list[dict[str, Any]], int]:
    """The chat rows of the selected transitions, in order, and how many had none (no chat messages)."""
    rows, missing = [], 0
    for t in selection.transitions:
        span = selection.spans.get(last_span_id(t) or "")
        row = chat_row(span) if span is not None else None
        if row is None:
            missing += 1
        else:
            rows.append(row)
    return rows, missing


def write_rows(rows: Sequence[Mapping[str, Any]], out: Path) -> None:
    """`out.jsonl`: one JSON row per line; any other path: a Hugging Face dataset (`save_to_disk`)."""
    try:
        if out.suffix == ".jsonl":
            out.parent.mkdir(parents=True, exist_ok=True)
            with out.open("w") as f:
                for row in rows:
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
            return
        from datasets import Dataset

        Dataset.from_list(list(rows)).save_to_disk(str(out))
    except OSError as err:
        raise ConfigError(f"cannot write {out}: {err.strerror or err}") from None


def export_settings(
    target: str,
    *,
    config: Path | None = None,
    overrides: Sequence[str] = (),
    min_reward: float | None = None,
    select: str | None = None,
    agent_match: str | None = None,
    splits: Sequence[str] = (),
) -> tuple[AdapterConfig, AlgorithmConfig]:
    """The adapter and algorithm settings of an export: `config`, else the run directory's own
    config.yaml, else the defaults; then Hydra `overrides`; then the options given."""
    import dataclasses

    from alight.commands.trace import transition_settings
    from alight.trainer.session import CONFIG_FILE

    if config is None and not is_url(target) and (Path(target).expanduser() / CONFIG_FILE).is_file():
        config = Path(target).expanduser() / CONFIG_FILE
    adapter, algorithm = transition_settings(config, overrides)
    if agent_match is not None:
        adapter = dataclasses.replace(adapter, agent_match=agent_match or None)
    sft = dataclasses.replace(
        algorithm.sft, select=select or algorithm.sft.select, splits=list(splits) or list(algorithm.sft.splits)
    )
    bar = algorithm.sft_min_reward if min_reward is None else min_reward
    return adapter, dataclasses.replace(algorithm, sft=sft, sft_min_reward=bar)


def export_tokenizer(target: str) -> Any:
    """The tokenizer of a run directory's starting model (rebuilds ids of calls recorded without
    them), or None (such calls are then left out)."""
    from alight.trainer.run_dir import BASE_MODEL_DIR

    base = Path(target).expanduser() / BASE_MODEL_DIR
    if is_url(target) or not (base / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base)


def export_sft(target: str, out: Path, adapter: AdapterConfig, algorithm: AlgorithmConfig) -> dict[str, Any]:
    """Write the selection of the store at `target` to `out` (see `write_rows`); returns what was
    written and the selection's counts."""
    check_selection(algorithm.sft.select, algorithm.sft.splits)
    selection = read_selection(target, adapter, algorithm, tokenizer=export_tokenizer(target))
    rows, missing = chat_rows(selection)
    if not rows:
        counts = selection.counts
        raise ConfigError(
            f"{target}: no transition selected ({counts.eligible} succeeded rollouts of "
            f"{'/'.join(algorithm.sft.splits)}, {counts.transitions} transitions; bar {algorithm.sft_min_reward:g})"
        )
    write_rows(rows, out)
    return {
        "out": str(out),
        "format": "jsonl" if out.suffix == ".jsonl" else "dataset",
        "rows": len(rows),
        "without_messages": missing,
        "select": algorithm.sft.select,
        "min_reward": algorithm.sft_min_reward,
        "splits": list(algorithm.sft.splits),
        "agent_match": adapter.agent_match,
        **selection.counts.as_dict(),
    }
