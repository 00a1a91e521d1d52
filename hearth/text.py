"""Text that can be stored, tokenized and sent back: valid Unicode, no lone UTF-16 surrogates.

JSON lets a string carry a lone surrogate (`"\\ud800"`), and Python decodes it into a `str`
that cannot be encoded as UTF-8: it would fail in the tokenizer, in SQLite, in every response
that echoes it. Requests are refused at the edge (`hearth.jsonsafe`); text already stored by an
older server is repaired on read with `scrub`, so it can never make a listing or history fail.
"""

from __future__ import annotations

import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(s: str) -> int | None:
    """The index of the first lone surrogate in `s`, or None. (A decoded `str` holds no valid
    pairs: JSON pairs decode to one code point, so any surrogate left is a lone one.)"""
    if s.isascii():
        return None
    m = _SURROGATE.search(s)
    return m.start() if m else None


def scrub(s: str) -> str:
    """`s` with every lone surrogate replaced by U+FFFD."""
    return s if lone_surrogate(s) is None else _SURROGATE.sub("\ufffd", s)


def scrub_value(value: Any) -> Any:
    """A JSON value with `scrub` applied to every string in it, keys included."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [scrub_value(v) for v in value]
    if isinstance(value, dict):
        return {scrub(k) if isinstance(k, str) else k: scrub_value(v) for k, v in value.items()}
    return value


def find_lone_surrogate(value: Any) -> str | None:
    """Where the first lone surrogate in a JSON value is, as a path (`messages[0].name`), or
    None. Iterative, so it holds for values of any depth."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if lone_surrogate(v) is not None:
                return path or "(the body)"
        elif isinstance(v, dict):
            for k, child in v.items():
                where = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and lone_surrogate(k) is not None:
                    return f"{path}.<key>" if path else "<key>"
                stack.append((child, where))
        elif isinstance(v, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(v))
    return None
