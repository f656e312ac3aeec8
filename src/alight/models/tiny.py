"""The embedded default policy: a tiny Qwen2 causal LM with a byte-level tokenizer, built offline.

`build_tiny_model` writes an ordinary Hugging Face model directory, so everything downstream
(transformers, the SFT warm start, vLLM) treats it like any hub model. The tokenizer has one id per
byte and no merges, so every ASCII character (space, newline and tab included) is one token and any
text round-trips exactly. It speaks the Qwen2.5/Hermes chat and tool-call format, so the recipes'
prompts and tool calls need no special casing.

Why byte-level BPE and not a WordLevel model over characters: for `model_type: qwen2`, transformers 5
ignores the pipeline in tokenizer.json and rebuilds `Qwen2Tokenizer` (byte-level BPE, NFC, Qwen's
split regex) from the vocabulary and merges alone. So tokenizer.json here *is* that pipeline, with
no merges: transformers 4 (which reads the file as written) and 5 tokenize identically.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alight.errors import ConfigError
from alight.models.chat_templates import CHATML_TURNS
from alight.models.progress import progress_bars_off

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import Qwen2ForCausalLM

EOS_TOKEN = "<|endoftext|>"
IM_END = "<|im_end|>"

#: Special tokens of the tiny tokenizer, ids 0-6 in this order; each encodes to one id.
TINY_SPECIAL_TOKENS: tuple[str, ...] = (
    EOS_TOKEN,
    "<|im_start|>",
    IM_END,
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

# Qwen2's pre-tokenizer split (transformers' tokenization_qwen2.PRETOKENIZE_REGEX); with no merges it
# changes no ids, but keeping it makes tokenizer.json identical to what transformers 5 rebuilds.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

#: Written next to the weights: marks a directory as ours (safe to rebuild) and records how it was built.
MARKER_FILE = "alight_tiny_model.json"
#: Bumped when the tokenizer or chat template changes; a cached model of another format is rebuilt.
TINY_FORMAT = 2

# Qwen2.5/Hermes format. `{% generation %}` marks assistant text for return_assistant_tokens_mask (SFT).
# Tools are listed by signature only, `name(arg, ...)`, not as Qwen's JSON schema preamble: with one
# token per byte that preamble costs ~600 tokens of every prompt, and a tiny model learns the
# call format from its warm start, not from instructions.
CHAT_TEMPLATE = (
    """\
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- '# Tools' }}
    {%- for tool in tools %}
        {%- set tool = tool.function if tool.function is defined else tool %}
        {{- '\n' + tool.name + '(' + ((tool.parameters or {}).properties or {}).keys() | join(', ') + ')' }}
    {%- endfor %}
    {{- '<|im_end|>\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
"""
    + CHATML_TURNS
)


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,  # head size 32: supported by every attention kernel vLLM ships
    num_kv_heads: int = 2,
    intermediate_size: int | None = 448,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a tiny Qwen2 model with a byte-level chat tokenizer to `out_dir` and return its path.

    The directory holds config.json, generation_config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json (with the chat template), special_tokens_map.json and `MARKER_FILE`;
    `AutoTokenizer` and `AutoModelForCausalLM` load it offline. The same arguments give
    bit-identical weights; the caller's torch RNG state is left untouched. The defaults give
    about 0.92M parameters; `intermediate_size=None` means 4 * `hidden_size`. An existing
    directory is only overwritten if it is empty or holds a tiny model built here before.

    Raises:
        ConfigError: the sizes are inconsistent, or `out_dir` is a file or a non-empty directory
            that is not a tiny model. Nothing is written in that case.
    """
    out = Path(out_dir)
    sizes = {
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": 4 * hidden_size if intermediate_size is None else intermediate_size,
        "max_position_embeddings": max_position_embeddings,
    }
    _check_sizes(sizes)
    _check_out_dir(out)

    tokenizer = _build_tokenizer(max_position_embeddings)
    model = _build_model(tokenizer.vocab_size_with_specials, sizes, seed)

    out.parent.mkdir(parents=True, exist_ok=True)
    # Build next to the target and move the files in at the end, so a failure leaves no half model.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging = Path(tmp)
        with progress_bars_off():
            model.save_pretrained(staging)
        tokenizer.save(staging)
        (staging / MARKER_FILE).write_text(
            json.dumps(
                {
                    "builder": "alight.models.build_tiny_model",
                    "format": TINY_FORMAT,
                    "arguments": {**sizes, "seed": seed},
                },
                indent=2,
            )
            + "\n"
        )
        out.mkdir(exist_ok=True)
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    return out


def _check_sizes(sizes: dict[str, int]) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"tiny model: {name} must be a positive integer, got {value!r}")
    hidden, heads, kv_heads = sizes["hidden_size"], sizes["num_heads"], sizes["num_kv_heads"]
    if hidden % heads:
        raise ConfigError(f"tiny model: hidden_size {hidden} is not divisible by num_heads {heads}")
    if heads % kv_heads:
        raise ConfigError(f"tiny model: num_heads {heads} is not divisible by num_kv_heads {kv_heads}")
    if (hidden // heads) % 2:
        raise ConfigError(f"tiny model: head size hidden_size/num_heads = {hidden // heads} must be even (RoPE)")


def _check_out_dir(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"tiny model: {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER_FILE).is_file():
        raise ConfigError(f"tiny model: {out} is a non-empty directory that holds no tiny model; choose another")


class _TinyTokenizer:
    """The byte-level tokenizer, saved in the layout that transformers 4.x and 5.x both load."""

    def __init__(self, backend: Tokenizer, max_length: int) -> None:
        self.backend = backend
        self.max_length = max_length
        self.vocab_size_with_specials = backend.get_vocab_size(with_added_tokens=True)

    def save(self, directory: Path) -> None:
        self.backend.save(str(directory / "tokenizer.json"))
        specials = {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN, "unk_token": None}
        extra = list(TINY_SPECIAL_TOKENS[1:])
        # Written by hand, not by save_pretrained: transformers 5 writes a list-valued
        # "extra_special_tokens" that transformers 4.x (pinned by many vLLM installs) cannot load,
        # moves the template to chat_template.jinja and writes no special_tokens_map.json.
        config = {
            "tokenizer_class": "Qwen2Tokenizer",
            **specials,
            "bos_token": None,
            "additional_special_tokens": extra,
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "split_special_tokens": False,
            "model_max_length": self.max_length,
            "chat_template": CHAT_TEMPLATE,
        }
        _write_json(directory / "tokenizer_config.json", config)
        _write_json(directory / "special_tokens_map.json", {**specials, "additional_special_tokens": extra})


def _byte_symbols() -> list[str]:
    """The 256 printable stand-ins byte-level BPE uses for bytes 0-255, in byte order (GPT-2's table)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), 256)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(shifted)) for b in range(256)]


def _vocab() -> dict[str, int]:
    return {token: i for i, token in enumerate((*TINY_SPECIAL_TOKENS, *_byte_symbols()))}


def _build_tokenizer(max_length: int) -> _TinyTokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    # Exactly the pipeline of transformers 5's Qwen2Tokenizer, with one token per byte and no merges.
    backend = Tokenizer(
        models.BPE(
            vocab=_vocab(),
            merges=[],
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in TINY_SPECIAL_TOKENS])
    return _TinyTokenizer(backend, max_length)


def _build_model(vocab_size: int, sizes: dict[str, int], seed: int) -> Qwen2ForCausalLM:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    eos, im_end = TINY_SPECIAL_TOKENS.index(EOS_TOKEN), TINY_SPECIAL_TOKENS.index(IM_END)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=sizes["hidden_size"],
        intermediate_size=sizes["intermediate_size"],
        num_hidden_layers=sizes["num_layers"],
        num_attention_heads=sizes["num_heads"],
        num_key_value_heads=sizes["num_kv_heads"],
        max_position_embeddings=sizes["max_position_embeddings"],
        max_window_layers=sizes["num_layers"],
        tie_word_embeddings=True,
        bos_token_id=eos,  # as in Qwen2.5: no BOS is prepended, the id only fills the field
        eos_token_id=eos,
        pad_token_id=eos,
        dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    # Stop at the end of a turn as well as at the end of text.
    generation = {"bos_token_id": eos, "eos_token_id": [im_end, eos], "pad_token_id": eos}
    model.generation_config = GenerationConfig.from_dict(generation)
    return model


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def is_current_tiny_model(path: str | os.PathLike[str]) -> bool:
    """Whether `path` holds a complete tiny model of the current format (else it needs a rebuild)."""
    directory = Path(path)
    try:
        marker = json.loads((directory / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == TINY_FORMAT and (directory / "model.safetensors").is_file()
