"""Fixtures for the engine tests: an embedded engine on the real tiny model (`tiny_dir`: tests/conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> Iterator[object]:
    """A shared embedded engine on the tiny model (its weights are never changed)."""
    from alight.engines.embedded import EmbeddedEngine

    eng = EmbeddedEngine("tiny", cache_dir=tiny_dir, max_new_tokens=32, batch_wait_ms=5)
    eng.load()
    yield eng
    asyncio.run(eng.close())


# -- real vLLM (vLLM's CPU build in a venv of its own; README's test command installs it) ----------

#: A generation_config.json of the kind many instruct models ship: vLLM samples with it whenever a
#: request leaves these settings out (top_k 1 made every recorded log-prob 0.0).
HOSTILE_GENERATION_CONFIG = {"top_k": 1, "min_p": 0.5, "repetition_penalty": 1.5, "temperature": 0.2, "top_p": 0.5}
#: A ChatML template that drops tools (as SmolLM2's does): alight's `auto` choice replaces it.
TOOLLESS_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="session")
def hostile_tiny(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a generation_config.json that would change sampling and a chat template
    that drops tools: what vLLM must not pick up from a model directory behind alight's back."""
    import json
    import shutil

    target = tmp_path_factory.mktemp("hostile") / "tiny"
    shutil.copytree(tiny_dir, target)
    config = json.loads((target / "generation_config.json").read_text())
    (target / "generation_config.json").write_text(json.dumps({**config, **HOSTILE_GENERATION_CONFIG}))
    tokenizer = json.loads((target / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**tokenizer, "chat_template": TOOLLESS_TEMPLATE}))
    return target


@pytest.fixture(scope="session")
def real_vllm(real_vllm_python: str, hostile_tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real vLLM server (CPU build, fp32) on `hostile_tiny` for the session, sleep mode on. Tests
    that change its weights put the original ones back."""
    from alight.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        str(hostile_tiny),
        python=real_vllm_python,
        served_name="tiny",
        dtype="float32",
        kv_cache_gib=1,
        sleep_mode=True,
        work_dir=tmp_path_factory.mktemp("vllm"),
        startup_timeout_s=600,
    )
    asyncio.run(engine.start())
    yield engine
    asyncio.run(engine.close())


@pytest.fixture(scope="module")
def hostile_embedded(hostile_tiny: Path) -> Iterator[object]:
    """An embedded engine on `hostile_tiny` (the other row of the engine conformance tests)."""
    from alight.engines.embedded import EmbeddedEngine

    eng = EmbeddedEngine(str(hostile_tiny), served_name="tiny", max_new_tokens=32, batch_wait_ms=5)
    eng.load()
    yield eng
    asyncio.run(eng.close())
