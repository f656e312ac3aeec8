"""Chat templates: a template that drops tools is found by probing and replaced by alight's family
template (with one log line), and alight's ChatML tool template renders what the engines parse."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from alight.engines.toolcalls import parse_tool_calls
from alight.errors import ConfigError
from alight.models.chat_templates import (
    CHATML_TOOLS,
    choose_chat_template,
    load_tokenizer,
    tool_support,
)

pytest.importorskip("transformers")

# SmolLM2-135M-Instruct's own template (what its GGUF carries): ChatML with role and content only.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# A template of another family that drops tools too (Llama-2-like): alight has no template for it.
OTHER_TEMPLATE = "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate arithmetic.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}, "digits": {}}},
    },
}
CALL = {"id": "call_0", "type": "function", "function": {"name": "calculate", "arguments": {"expression": "2+3"}}}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be exact."},
    {"role": "user", "content": "2+3?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_0", "content": "5"},
    {"role": "assistant", "content": "5."},
]


@pytest.fixture
def tokenizer(tiny_dir: Path) -> Any:
    return load_tokenizer(tiny_dir)


def test_the_probe_tells_what_a_template_drops(tokenizer: Any) -> None:
    assert tool_support(tokenizer.chat_template, tokenizer).complete  # the tiny model's own renders all
    smol = tool_support(SMOLLM2_TEMPLATE, tokenizer)
    assert (smol.tools, smol.calls, smol.results) == (False, False, True)
    assert not tool_support(None, tokenizer).complete
    assert not tool_support("{{ raise_exception('no') }}", tokenizer).complete  # a template that raises


def test_auto_keeps_a_template_that_renders_tools(tokenizer: Any) -> None:
    own = tokenizer.chat_template
    assert choose_chat_template(tokenizer, "auto") == own


def test_auto_replaces_a_chatml_template_that_drops_tools_and_says_so(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    with caplog.at_level(logging.WARNING, logger="alight.models.chat_templates"):
        chosen = choose_chat_template(tokenizer, "auto", model="smol")
    assert chosen == CHATML_TOOLS
    lines = [r.getMessage() for r in caplog.records]
    assert (
        len(lines) == 1 and "smol" in lines[0] and "drops tools, tool calls" in lines[0] and "chatml-tools" in lines[0]
    )


def test_model_keeps_the_own_template_and_another_family_is_kept_with_a_warning(
    tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    assert choose_chat_template(tokenizer, "model") == SMOLLM2_TEMPLATE
    tokenizer.chat_template = OTHER_TEMPLATE
    with caplog.at_level(logging.WARNING, logger="alight.models.chat_templates"):
        assert choose_chat_template(tokenizer, "auto", model="llama") == OTHER_TEMPLATE
    assert "engine.chat_template" in caplog.records[0].getMessage()


def test_a_named_or_file_template_and_a_bad_choice(tokenizer: Any, tmp_path: Path) -> None:
    assert choose_chat_template(tokenizer, "chatml-tools") == CHATML_TOOLS
    path = tmp_path / "t.jinja"
    path.write_text(OTHER_TEMPLATE)
    assert choose_chat_template(tokenizer, str(path)) == OTHER_TEMPLATE
    with pytest.raises(ConfigError, match=r"engine\.chat_template 'nope'"):
        choose_chat_template(tokenizer, "nope")


def test_chatml_tools_renders_tools_calls_and_results(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION, tools=[CALC_TOOL], chat_template=CHATML_TOOLS, tokenize=False)
    assert text == (
        "<|im_start|>system\nBe exact.\n\nTools you can call:\n"
        "calculate(expression: string, digits: any) - Evaluate arithmetic.\n"
        'To call a tool, answer <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n2+3?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call>'
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n5.<|im_end|>\n"
    )


def test_a_rendered_call_parses_back_to_the_same_call(tokenizer: Any) -> None:
    prompt = tokenizer.apply_chat_template(
        CONVERSATION[:2], tools=[CALC_TOOL], chat_template=CHATML_TOOLS, add_generation_prompt=True, tokenize=False
    )
    full = tokenizer.apply_chat_template(
        CONVERSATION[:3], tools=[CALC_TOOL], chat_template=CHATML_TOOLS, tokenize=False
    )
    assert full.startswith(prompt)
    reply = full[len(prompt) :].removesuffix("<|im_end|>\n")
    content, calls = parse_tool_calls(reply)
    assert not content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("calculate", {"expression": "2+3"})
    ]


def test_warm_start_demonstrations_train_the_tool_call_not_an_empty_reply(tiny_dir: Path, tmp_path: Path) -> None:
    """With SmolLM2's own template a tool-call turn renders to a bare end-of-turn; through
    load_tokenizer's choice, the demonstration's target holds the call."""
    from alight.adapters.demonstrations import demonstration_transitions

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = SMOLLM2_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    (model / "chat_template.jinja").unlink(missing_ok=True)
    row = {"messages": CONVERSATION[1:], "tools": [CALC_TOOL]}
    targets = {}
    for choice in ("model", "auto"):
        tok = load_tokenizer(model, choice)
        transitions, _ = demonstration_transitions([row], tok, mode="transition")
        targets[choice] = tok.decode(transitions[0].response_ids)
    assert "calculate" not in targets["model"]  # the silent drop this guards against
    assert '<tool_call>\n{"name": "calculate"' in targets["auto"]
