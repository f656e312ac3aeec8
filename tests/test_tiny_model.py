"""The embedded default model: a real tiny Qwen2 built offline, loaded back with transformers."""

from __future__ import annotations

import json
import os
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from alight.errors import ConfigError
from alight.models import TINY_SPECIAL_TOKENS, build_tiny_model
from tests.fixtures.tools import ADD_TOOLS

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ALPHABET = [chr(c) for c in range(0x20, 0x7F)] + ["\n", "\t"]

TOOLS = ADD_TOOLS

CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "2+3 and 1+1?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}},
        ],
    },
    {"role": "tool", "content": "5"},
    {"role": "tool", "content": "2"},
    {"role": "assistant", "content": "5 and 2."},
]

EXPECTED = """\
<|im_start|>system
Use the tools.

# Tools
add(a, b)<|im_end|>
<|im_start|>user
2+3 and 1+1?<|im_end|>
<|im_start|>assistant
<tool_call>
{"name": "add", "arguments": {"a": 2, "b": 3}}
</tool_call>
<tool_call>
{"name": "add", "arguments": {"a": 1, "b": 1}}
</tool_call><|im_end|>
<|im_start|>user
<tool_response>
5
</tool_response>
<tool_response>
2
</tool_response><|im_end|>
<|im_start|>assistant
5 and 2.<|im_end|>
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir).eval()


def test_directory_is_a_standard_qwen2_checkpoint(model_dir: Path, model: Any, tokenizer: Any) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert {"tokenizer_config.json", "special_tokens_map.json"} <= names
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["model_type"] == "qwen2"
    assert "<|im_start|>" in json.loads((model_dir / "tokenizer_config.json").read_text())["chat_template"]
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.vocab_size == len(tokenizer) == 256 + len(TINY_SPECIAL_TOKENS)


def test_parameter_count_of_the_defaults(model: Any) -> None:
    # 2 layers x 138,624 + tied embeddings 263 x 96 + final norm 96 (the lm_head shares the embeddings).
    assert model.num_parameters() == 920_576
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_transformers_rebuilds_exactly_the_saved_tokenizer(model_dir: Path, tokenizer: Any) -> None:
    # transformers 5 rebuilds Qwen2Tokenizer from the vocabulary; transformers 4 reads tokenizer.json as is.
    saved = json.loads((model_dir / "tokenizer.json").read_text())
    loaded = json.loads(tokenizer.backend_tokenizer.to_str())
    for part in ("normalizer", "pre_tokenizer", "decoder", "model"):
        assert loaded[part] == saved[part], part


@given(st.text(alphabet=ALPHABET, max_size=300))
@settings(max_examples=200, deadline=None)
def test_ascii_text_round_trips_one_token_per_character(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    if not any(token in text for token in TINY_SPECIAL_TOKENS):
        assert len(ids) == len(text)


@given(st.text(max_size=100))
@settings(max_examples=200, deadline=None)
def test_any_nfc_text_round_trips(tokenizer: Any, text: str) -> None:
    text = unicodedata.normalize("NFC", text)
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_special_tokens_are_single_ids(tokenizer: Any) -> None:
    for i, token in enumerate(TINY_SPECIAL_TOKENS):
        assert tokenizer.encode(token, add_special_tokens=False) == [i]
        assert tokenizer.convert_ids_to_tokens(i) == token
    assert tokenizer.encode("x<|im_end|>\n", add_special_tokens=False)[1] == 2
    assert tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None


def test_chat_template_renders_tools_calls_and_responses(tokenizer: Any) -> None:
    rendered = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert rendered == EXPECTED
    ids = tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]
    assert ids == tokenizer.encode(rendered, add_special_tokens=False)
    assert tokenizer.decode(ids) == rendered


def test_chat_template_without_tools_and_with_generation_prompt(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert rendered == expected
    no_system = tokenizer.apply_chat_template(messages[1:], tokenize=False)
    assert no_system == "<|im_start|>user\nHi<|im_end|>\n"


def test_assistant_tokens_mask_covers_exactly_the_assistant_turns(tokenizer: Any) -> None:
    out = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    kept = [i for i, keep in zip(out["input_ids"], out["assistant_masks"], strict=True) if keep]
    first = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
    second = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call><|im_end|>'
    assert tokenizer.decode(kept) == first + second + "5 and 2.<|im_end|>"


def test_forward_and_generate(model: Any, tokenizer: Any) -> None:
    # transformers 5: tokenize=True returns a BatchEncoding by default (return_dict=True), not a list of ids.
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "2+2?"}], add_generation_prompt=True)
    input_ids = torch.tensor([prompt["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids).logits
    assert logits.shape == (1, input_ids.shape[1], len(tokenizer))
    out = model.generate(input_ids, max_new_tokens=4, do_sample=False)
    assert out.shape[0] == 1
    assert input_ids.shape[1] < out.shape[1] <= input_ids.shape[1] + 4
    assert model.generation_config.eos_token_id == [2, 0]  # <|im_end|> and <|endoftext|>
    assert model.generation_config.pad_token_id == 0


def test_same_seed_same_weights_other_seed_other_weights(tmp_path: Path, model_dir: Path) -> None:
    from safetensors.torch import load_file

    small = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}
    a = load_file(build_tiny_model(tmp_path / "a", seed=1, **small) / "model.safetensors")
    b = load_file(build_tiny_model(tmp_path / "b", seed=1, **small) / "model.safetensors")
    c = load_file(build_tiny_model(tmp_path / "c", seed=2, **small) / "model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_building_leaves_the_global_rng_alone(tmp_path: Path) -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1)
    assert torch.equal(torch.rand(3), expected)


def test_rebuilding_over_a_tiny_model_is_allowed(tmp_path: Path) -> None:
    small = {"hidden_size": 16, "num_heads": 2, "num_kv_heads": 1}
    build_tiny_model(tmp_path / "m", num_layers=1, **small)
    build_tiny_model(tmp_path / "m", num_layers=2, **small)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["num_hidden_layers"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no staging directory left behind


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"hidden_size": 90, "num_heads": 4}, "not divisible by num_heads"),
        ({"num_heads": 4, "num_kv_heads": 3}, "not divisible by num_kv_heads"),
        ({"hidden_size": 12, "num_heads": 4, "num_kv_heads": 1}, "must be even"),
        ({"num_layers": 0}, "num_layers must be a positive integer"),
        ({"max_position_embeddings": -1}, "max_position_embeddings must be a positive integer"),
    ],
)
def test_inconsistent_sizes_are_config_errors(tmp_path: Path, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as err:
        build_tiny_model(tmp_path / "m", **kwargs)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "m").exists()
    assert list(tmp_path.iterdir()) == []


def test_a_foreign_directory_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no tiny model"):
        build_tiny_model(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        build_tiny_model(tmp_path / "file")
