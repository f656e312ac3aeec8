"""Settings read from `key = value` text."""

from __future__ import annotations


class Settings:
    """String settings with typed getters."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    @classmethod
    def from_text(cls, text: str) -> Settings:
        """`key = value` lines; blank lines and lines starting with '#' are skipped."""
        values: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"not a 'key = value' line: {line!r}")
            values[key.strip()] = value.strip()
        return cls(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def get_int(self, key: str, default: int = 0) -> int:
        return int(self.values[key]) if key in self.values else default

    def get_bool(self, key: str, default: bool = False) -> bool:
        if key not in self.values:
            return default
        return bool(self.values[key])
