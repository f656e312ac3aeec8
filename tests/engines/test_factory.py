"""make_engine: engines by kind name."""

from __future__ import annotations

from pathlib import Path

import pytest

from alight.engines.embedded import EmbeddedEngine
from alight.engines.factory import make_engine
from alight.engines.litellm_engine import LiteLLMEngine
from alight.engines.vllm_engine import VLLMEngine
from alight.errors import ConfigError


def test_each_kind(tiny_dir: Path) -> None:
    embedded = make_engine("embedded", model="tiny", cache_dir=tiny_dir, max_context=None)
    assert isinstance(embedded, EmbeddedEngine) and embedded.model_names == ["tiny"]
    litellm = make_engine("litellm", model="openai/x", base_url="http://127.0.0.1:1/v1", served_name="policy")
    assert isinstance(litellm, LiteLLMEngine) and litellm.model_names == ["policy", "openai/x"]
    remote = make_engine("vllm", model=str(tiny_dir), base_url="http://127.0.0.1:1/v1")
    assert isinstance(remote, VLLMEngine)  # starts nothing yet


def test_unknown_kind_or_option_is_a_one_line_config_error() -> None:
    with pytest.raises(ConfigError, match=r"engine\.kind must be one of embedded, vllm, litellm, got 'sglang'"):
        make_engine("sglang")
    with pytest.raises(ConfigError, match="has no option temperatur") as err:
        make_engine("embedded", temperatur=0.5)
    assert "\n" not in str(err.value)
