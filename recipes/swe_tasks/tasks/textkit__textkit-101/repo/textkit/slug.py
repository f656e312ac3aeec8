"""URL slugs for titles."""

from __future__ import annotations

import re
import unicodedata

_SEPARATORS = re.compile(r"[\s_]+")
_UNSAFE = re.compile(r"[^a-z0-9-]")


def slugify(title: str, max_length: int | None = None) -> str:
    """A lower-case ASCII slug of `title`: the words joined by '-', at most `max_length` long."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    text = _SEPARATORS.sub("-", text.lower())
    text = _UNSAFE.sub("", text)
    if max_length is not None:
        text = text[:max_length]
    return text
