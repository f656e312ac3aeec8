"""Reading the optimiser's answer: candidate prompts out of free text, and the checks a candidate
must pass before it costs any rollout. A weak optimiser's garbage yields no candidate and a reason,
never an exception: the search keeps the parent prompt and records the failure."""

from __future__ import annotations

import re
import string

PROMPT_TAG = re.compile(r"<prompt>(.*?)</prompt>", re.DOTALL | re.IGNORECASE)
FENCE = re.compile(r"```[A-Za-z0-9_-]*\n(.*?)```", re.DOTALL)


def parse_candidates(answer: str, n: int) -> list[str]:
    """At most `n` candidate prompts in `answer`, in order, stripped and without repeats:

    the blocks inside `<prompt>...</prompt>` tags; else the fenced code blocks; else the whole
    answer (many models answer with the bare prompt); nothing for an empty answer."""
    found = [m.group(1) for m in PROMPT_TAG.finditer(answer)]
    if not found:
        found = [m.group(1) for m in FENCE.finditer(answer)]
    if not found and "<prompt>" not in answer.lower():
        found = [answer]
    out: list[str] = []
    for text in (t.strip() for t in found):
        if text and text not in out:
            out.append(text)
    return out[: max(0, n)]


def placeholders(template: str) -> set[str] | None:
    """The named fields of an f-string template ({question} -> "question"); None when it is not
    a valid template (an unbalanced brace)."""
    try:
        return {field.split(".")[0].split("[")[0] for _, field, _, _ in string.Formatter().parse(template) if field}
    except ValueError:
        return None


def check_candidate(candidate: str, parent: str, max_chars: int) -> str | None:
    """Why `candidate` cannot replace `parent` (one line), or None when it may be scored: it is
    empty, too long, the parent itself, holds control characters, is no valid template, or
    drops or adds a placeholder the agent fills (the parent's fields must stay, no new ones)."""
    if not candidate.strip():
        return "empty prompt"
    if len(candidate) > max_chars:
        return f"longer than {max_chars} characters ({len(candidate)})"
    if candidate.strip() == parent.strip():
        return "same as its parent"
    if not all(ch.isprintable() or ch in "\n\t" for ch in candidate):
        return "holds control characters"
    fields, wanted = placeholders(candidate), placeholders(parent) or set()
    if fields is None:
        return "not a valid template (unbalanced { or })"
    if fields != wanted:
        missing, extra = sorted(wanted - fields), sorted(fields - wanted)
        parts = ([f"drops {{{', '.join(missing)}}}"] if missing else []) + (
            [f"adds {{{', '.join(extra)}}}"] if extra else []
        )
        return "placeholders differ: " + "; ".join(parts)
    return None
