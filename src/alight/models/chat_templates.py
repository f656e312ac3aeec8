"""Chat templates: which one a model's tokenizer uses, and alight's own for models whose template
ignores tools.

Many small instruct models (SmolLM2 among them) ship a ChatML template that renders only `role`
and `content`: the `tools` of a request and the `tool_calls` of assistant turns vanish without an
error, so the model never sees its tools and warm-start demonstrations of tool calls train empty
replies. `load_tokenizer` probes the template with a tool and a tool call; when either is dropped,
it uses alight's tool-rendering template for that family (ChatML: `chatml-tools`) and says so in
one line, or warns that tools will be dropped when no family template fits.

`engine.chat_template` chooses: `auto` (the model's own when it renders tools, else the family's),
`model` (always the model's own), a packaged template's name, or a path to a Jinja file.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alight.errors import ConfigError

logger = logging.getLogger(__name__)

AUTO = "auto"
MODEL = "model"

# The turns of a ChatML conversation after its system header, in the Qwen2.5/Hermes format: assistant
# tool calls as <tool_call> blocks, tool results as <tool_response> blocks in a user turn.
# `{% generation %}` marks assistant text for return_assistant_tokens_mask (warm start, SFT). alight's
# tiny model and `chatml-tools` share it.
CHATML_TURNS = """\
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- generation %}
            {{- message.content or '' }}
            {%- for call in message.tool_calls or [] %}
                {%- set call = call.function if call.function is defined else call %}
                {%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}
                {{- '<tool_call>\\n{"name": ' + call.name | tojson + ', "arguments": ' }}
                {{- (call.arguments if call.arguments is string else call.arguments | tojson) + '}\\n</tool_call>' }}
            {%- endfor %}
            {{- '<|im_end|>' }}
        {%- endgeneration %}
        {{- '\\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop.previtem.role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or loop.nextitem.role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# ChatML with tools and tool calls in the Hermes format that `alight.engines.toolcalls` parses. Tools
# are listed one line each (name, typed arguments, description) rather than as a JSON schema: a
# 135M-parameter model follows a short list better, and the prompt stays ~100 tokens shorter.
CHATML_TOOLS = (
    """\
{%- macro tool_line(tool) -%}
    {%- set tool = tool.function if tool.function is defined else tool -%}
    {%- set props = (tool.parameters or {}).properties or {} -%}
    {{- tool.name + '(' -}}
    {%- for arg, spec in props.items() -%}
        {{- arg + ': ' + (spec.type or 'any') -}}{%- if not loop.last %}{{- ', ' }}{%- endif -%}
    {%- endfor -%}
    {{- ')' -}}{%- if tool.description %}{{- ' - ' + tool.description }}{%- endif -%}
{%- endmacro -%}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- 'Tools you can call:' }}
    {%- for tool in tools %}
        {{- '\\n' + tool_line(tool) }}
    {%- endfor %}
    {{- '\\nTo call a tool, answer <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
"""
    + CHATML_TURNS
)

#: Templates alight ships, by the name `engine.chat_template` takes.
TEMPLATES: dict[str, str] = {"chatml-tools": CHATML_TOOLS}

# What a template must show of a probe conversation to count as rendering tools and tool calls.
_PROBE_TOOL, _PROBE_CALL, _PROBE_RESULT = "alight_probe_tool", "alight_probe_call", "alight_probe_result"
_PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "probe"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {"x": 1}}}],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": _PROBE_RESULT},
]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": _PROBE_TOOL,
            "description": "probe",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
        },
    }
]


@dataclass(frozen=True)
class ToolSupport:
    """What a chat template renders of tools (listed tools, assistant tool calls, tool results)."""

    tools: bool
    calls: bool
    results: bool

    @property
    def complete(self) -> bool:
        return self.tools and self.calls and self.results


def tool_support(template: str | None, tokenizer: Any) -> ToolSupport:
    """Render a probe conversation through `template` with `tokenizer`; a template that raises on
    it counts as rendering none of it."""
    if not template:
        return ToolSupport(False, False, False)
    try:
        text = tokenizer.apply_chat_template(
            _PROBE_MESSAGES, tools=_PROBE_TOOLS, chat_template=template, tokenize=False
        )
    except Exception:  # jinja raises TemplateError and others for what a template does not expect
        return ToolSupport(False, False, False)
    text = text if isinstance(text, str) else ""
    return ToolSupport(_PROBE_TOOL in text, _PROBE_CALL in text, _PROBE_RESULT in text)


def family_template(template: str | None) -> str | None:
    """The name of alight's tool-rendering template for the family `template` belongs to, if any."""
    if template and "<|im_start|>" in template:
        return "chatml-tools"
    return None


def read_template(choice: str) -> str:
    """A packaged template by name, or the text of a Jinja file."""
    if choice in TEMPLATES:
        return TEMPLATES[choice]
    path = Path(choice).expanduser()
    if path.is_file():
        return path.read_text()
    raise ConfigError(
        f"engine.chat_template {choice!r}: not {AUTO!r}, {MODEL!r}, a packaged template "
        f"({', '.join(TEMPLATES)}) or a template file"
    )


def choose_chat_template(tokenizer: Any, choice: str = AUTO, *, model: str = "the model") -> str | None:
    """The template to render chats of `model` with, by `choice` (see the module docstring).

    With `auto`, a template that drops tools is replaced by its family's, with one log line; when
    no family template fits, a warning says tools will be dropped and how to choose a template.
    """
    own = getattr(tokenizer, "chat_template", None)
    own = own if isinstance(own, str) else None
    if choice == MODEL:
        return own
    if choice != AUTO:
        return read_template(choice)
    support = tool_support(own, tokenizer)
    if own is None or support.complete:
        return own
    family = family_template(own)
    dropped = ", ".join(
        what
        for what, kept in (("tools", support.tools), ("tool calls", support.calls), ("tool results", support.results))
        if not kept
    )
    if family is None:
        logger.warning(
            "%s: its chat template drops %s, and alight has no template for its family: set "
            "engine.chat_template to a Jinja file that renders them",
            model,
            dropped,
        )
        return own
    logger.warning("%s: its chat template drops %s; using alight's %r template instead", model, dropped, family)
    return TEMPLATES[family]


def load_tokenizer(path: str | os.PathLike[str], chat_template: str = AUTO) -> Any:
    """The tokenizer of the model directory `path`, its chat template chosen by `chat_template`."""
    from transformers import AutoTokenizer

    from alight.models.progress import progress_bars_off

    with progress_bars_off():
        tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = choose_chat_template(tokenizer, chat_template, model=Path(path).name or str(path))
    return tokenizer
