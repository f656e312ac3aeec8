"""Third-party progress bars off: alight's own progress is the dashboard, the JSON lines and train.log.

transformers draws `Loading weights` and `Writing model shards` bars (tqdm, on stderr) when a model
is loaded or saved, and huggingface_hub and datasets draw theirs; in `alight train` they would tear
the live view, and in `alight dev` and `alight serve` they bury the command's own output.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def quiet_progress_bars() -> None:
    """Turn the progress bars of transformers, huggingface_hub and datasets off for good, in this
    process and (through the environment) in the processes it starts: for a command's whole run."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is imported
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    for module, switch in (
        ("huggingface_hub.utils", "disable_progress_bars"),
        ("transformers.utils.logging", "disable_progress_bar"),
    ):
        if module in sys.modules:  # imported before the environment said so: its own switch
            getattr(sys.modules[module], switch)()


@contextlib.contextmanager
def progress_bars_off() -> Iterator[None]:
    """transformers' (and huggingface_hub's) progress bars off while the block loads or saves a
    model, then as they were: library code does not change a caller's choice for good."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]
