"""Parsing JSON from clients and from disk with bounded cost: UTF-8 only, no lone surrogates,
a nesting limit and a value-count limit, all checked before anything deep or large is built.

Why each bound:
- nesting: Python's parser, pydantic, Jinja's `tojson` and the grammar converter all recurse;
  a body nested ~1000 deep raised RecursionError (a 500) wherever it first reached one of them.
  Refusing depth past MAX_DEPTH at the edge keeps every later stage far from the limit.
- values: `json.loads` holds the GIL for the whole parse, so a body of millions of tiny values
  stalled the event loop for as long; MAX_VALUES bounds that time (~0.1 s).
- surrogates: see `hearth.text`.

The structure scan runs on the raw bytes with numpy in fixed chunks (no per-byte Python loop, no
copy of the body larger than one chunk's arrays), and only when a cheap count says it might
matter: a body with at most MAX_DEPTH brackets cannot nest deeper than that.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from hearth.text import find_lone_surrogate, scrub_value

MAX_DEPTH = 100
MAX_VALUES = 2_000_000
_CHUNK = 1 << 20

# Structural bytes for the scan: +1 opens a level, -1 closes one; separators start a value.
_DELTA = np.zeros(256, dtype=np.int8)
_DELTA[[ord("["), ord("{")]] = 1
_DELTA[[ord("]"), ord("}")]] = -1
_SEPARATOR = np.zeros(256, dtype=bool)
_SEPARATOR[[ord(","), ord(":")]] = True
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE_PAIR = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")


class JSONRejected(ValueError):
    """The bytes are not JSON Hearth accepts; the message says why, in words for a client."""


def loads(data: bytes, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES,
          repair_surrogates: bool = False) -> Any:
    """Parse `data` (UTF-8 JSON) or raise JSONRejected. With `repair_surrogates` (for data an
    older server wrote), lone surrogates become U+FFFD instead of a refusal."""
    try:
        text = data.decode("utf-8")  # strict: raw surrogates and invalid UTF-8 are refused here
    except UnicodeDecodeError as e:
        raise JSONRejected(f"the body is not valid UTF-8 (byte {e.start})") from e
    check_structure(data, max_depth=max_depth, max_values=max_values)
    try:
        value = json.loads(text)
    except RecursionError as e:  # unreachable after check_structure; kept as the last line of defence
        raise JSONRejected(f"JSON nested deeper than {max_depth} levels") from e
    except ValueError as e:
        raise JSONRejected(f"not valid JSON: {e}") from e
    if _has_lone_surrogate_escape(data):
        if repair_surrogates:
            return scrub_value(value)
        where = find_lone_surrogate(value)
        if where is not None:
            raise JSONRejected(f"{where}: the text holds a lone UTF-16 surrogate (an unpaired \\uD800-\\uDFFF "
                               "escape); text must be valid Unicode")
    return value


def check_structure(data: bytes, *, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> None:
    """Refuse `data` if its arrays/objects nest deeper than `max_depth` or it holds more than
    about `max_values` values. Assumes JSON: a malformed body may pass and fail later in
    `json.loads`; a well-formed one is measured exactly (brackets and separators inside
    strings are not counted)."""
    brackets = data.count(b"[") + data.count(b"{")
    if brackets <= max_depth and brackets + data.count(b",") <= max_values:
        return
    # Drop escaped backslashes, then escaped quotes: every quote left opens or closes a string.
    plain = np.frombuffer(data.replace(b"\\\\", b"").replace(b'\\"', b""), dtype=np.uint8)
    depth = parity = values = 0
    for start in range(0, len(plain), _CHUNK):
        chunk = plain[start:start + _CHUNK]
        quote = chunk == ord('"')
        # uint8 sums wrap, which keeps their parity: odd means inside a string.
        outside = ((np.cumsum(quote, dtype=np.uint8) + parity) & 1) == 0
        parity = (parity + int(np.count_nonzero(quote))) & 1
        delta = _DELTA[chunk] * outside
        levels = np.cumsum(delta, dtype=np.int32)
        if depth + int(levels.max()) > max_depth:
            raise JSONRejected(f"JSON nested deeper than {max_depth} levels")
        depth += int(levels[-1])
        values += int(np.count_nonzero(_SEPARATOR[chunk] & outside)) + int(np.count_nonzero(delta > 0))
        if values > max_values:
            raise JSONRejected(f"JSON with more than {max_values} values")


def _has_lone_surrogate_escape(data: bytes) -> bool:
    """Whether `data` holds a \\uD800-\\uDFFF escape that is not half of a high+low pair. Exact:
    once escaped backslashes are gone, every backslash left starts a real escape. (Regexes
    without lookaround: one with lookbehind took seconds on a 30 MB body.)"""
    if not _SURROGATE_ESCAPE.search(data):
        return False
    return _SURROGATE_ESCAPE.search(_SURROGATE_PAIR.sub(b"", data.replace(b"\\\\", b""))) is not None
