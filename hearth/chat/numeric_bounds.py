"""Numeric bounds of a JSON schema as GBNF: `minimum`, `maximum`, `exclusiveMinimum`,
`exclusiveMaximum` and `multipleOf` on `integer` and `number`, which llama.cpp's converter (the
one llama-cpp-python 0.3 vendors) accepts and ignores (`maximum: 150` let a model write 1815).

What is enforced, and what is refused (400 naming the keyword and where it is) instead of being
ignored:

- integers: every bound, exclusive ones made inclusive (`exclusiveMaximum: 10` is `<= 9`,
  `minimum: 0.5` is `>= 1`), becomes a digit-range grammar that writes exactly the integers in
  the range, canonically (no leading zeros, no `-0`). An open side stops at 16 digits, as the
  converter's own integer rule does.
- numbers: bounds that are whole numbers are enforced (`0 <= x <= 1`, `x < 100`): the integer
  part is a digit range, and at a bound the fraction is held to what keeps the value inside
  (`1` or `1.0` at `maximum: 1`, a nonzero fraction at `exclusiveMinimum: 0`). A bounded number
  is written without an exponent, with at most enough fraction digits that the decimal parses
  to a double on the same side of the bound. A fractional bound (`maximum: 0.5`) is refused.
- `multipleOf`: on integers, 1 (nothing to do) or a range with both ends holding at most
  `MAX_MULTIPLES` multiples (written out as alternatives); anything else is refused.
- draft-4's boolean `exclusiveMinimum`/`exclusiveMaximum` make `minimum`/`maximum` exclusive.

`check_numbers` walks a schema before the converter runs (that is where the path for the error
is known); `numeric_rule` gives the grammar the converter substitutes for a bounded subschema.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hearth.errors import BadRequest

KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
INT_DIGITS = 16  # an open side writes at most this many digits (the converter's integer rule)
MAX_MULTIPLES = 256  # multipleOf: the most multiples a range may hold to be written out
SIGNIFICANT = 15  # digits a double keeps exactly: a bounded number writes no more than these
_EXACT = 10**15  # number bounds from here to _OPEN are refused: doubles cannot hold them exactly
_OPEN = 10**17  # a number bound past this is no bound (a bounded number has at most 16 digits)
_SKIP = ("$ref", "anyOf", "oneOf", "allOf", "const", "enum")  # the converter writes these itself


@dataclass(frozen=True, slots=True)
class Range:
    """The bounds of one subschema: `lo`/`hi` (None: open) and whether each is exclusive."""

    lo: float | None = None
    lo_excl: bool = False
    hi: float | None = None
    hi_excl: bool = False
    multiple: float | None = None


def _types(schema: dict[str, Any]) -> list[str]:
    t = schema.get("type")
    return [x for x in (t if isinstance(t, list) else [t]) if x in ("integer", "number")]


def applies(schema: Any) -> bool:
    """Whether `schema` is an integer or number subschema with numeric keywords that the
    converter would ignore (not an enum, const, ref or union, which it writes itself)."""
    return (isinstance(schema, dict) and bool(_types(schema)) and any(k in schema for k in KEYWORDS)
            and not any(k in schema for k in _SKIP))


def _range(schema: dict[str, Any], at: str, param: str) -> Range:
    def num(key: str) -> float | None:
        v = schema.get(key)
        if v is None or isinstance(v, bool):
            return None
        if not isinstance(v, int | float) or not math.isfinite(v):
            raise BadRequest(f"{param}: {key} at {at} must be a finite number", param=param)
        return v

    lo, hi = num("minimum"), num("maximum")
    lo_excl = hi_excl = False
    if schema.get("exclusiveMinimum") is True:
        lo_excl = True
    elif (x := num("exclusiveMinimum")) is not None and (lo is None or x >= lo):
        lo, lo_excl = x, True
    if schema.get("exclusiveMaximum") is True:
        hi_excl = True
    elif (x := num("exclusiveMaximum")) is not None and (hi is None or x <= hi):
        hi, hi_excl = x, True
    multiple = num("multipleOf")
    if multiple is not None and multiple <= 0:
        raise BadRequest(f"{param}: multipleOf at {at} must be greater than 0", param=param)
    return Range(lo, lo_excl, hi, hi_excl, multiple)


def _int_bounds(r: Range) -> tuple[int | None, int | None]:
    lo = None if r.lo is None else (math.floor(r.lo) + 1 if r.lo_excl else math.ceil(r.lo))
    hi = None if r.hi is None else (math.ceil(r.hi) - 1 if r.hi_excl else math.floor(r.hi))
    return lo, hi


def check_numbers(schema: Any, param: str = "response_format", where: str = "") -> None:
    """Refuse (400) numeric keywords Hearth cannot enforce, naming the keyword and its path."""
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        if applies(node):
            _check(node, f"{where}{path or 'the root'}", param)
        stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in node.items() if isinstance(v, dict | list))


def _check(schema: dict[str, Any], at: str, param: str) -> None:
    r = _range(schema, at, param)
    types = _types(schema)
    if "integer" in types:
        lo, hi = _int_bounds(r)
        if lo is not None and hi is not None and lo > hi:
            raise BadRequest(f"{param}: no integer satisfies the bounds at {at}", param=param)
        k = r.multiple
        if k is not None and k != 1 and (k != int(k) or lo is None or hi is None
                                         or _multiples_count(lo, hi, int(k)) > MAX_MULTIPLES):
            raise BadRequest(f"{param}: multipleOf {k:g} at {at} cannot be enforced: Hearth enforces an integer "
                             f"multipleOf only between a minimum and a maximum holding at most {MAX_MULTIPLES} "
                             "multiples", param=param)
    if "number" not in types:
        return
    if r.multiple is not None:
        raise BadRequest(f"{param}: multipleOf at {at} cannot be enforced on a number (use type integer)",
                         param=param)
    for key, v in (("exclusiveMinimum" if r.lo_excl else "minimum", r.lo),
                   ("exclusiveMaximum" if r.hi_excl else "maximum", r.hi)):
        if v is not None and v != int(v):
            raise BadRequest(f"{param}: {key} {v:g} at {at} cannot be enforced: Hearth enforces bounds on a "
                             "number only when they are whole numbers", param=param)
    inexact = any(b is not None and _EXACT <= abs(b) < _OPEN for b in (r.lo, r.hi))
    if inexact or (r.lo is not None and r.lo >= _EXACT) or (r.hi is not None and r.hi <= -_EXACT):
        raise BadRequest(f"{param}: the bounds at {at} are too large to enforce on a number", param=param)
    if r.lo is not None and r.hi is not None and (r.lo > r.hi or (r.lo == r.hi and (r.lo_excl or r.hi_excl))):
        raise BadRequest(f"{param}: no number satisfies the bounds at {at}", param=param)


def _multiples_count(lo: int, hi: int, k: int) -> int:
    return max(0, hi // k - (lo + k - 1) // k + 1)


def numeric_rule(schema: dict[str, Any], type_: str) -> str:
    """A GBNF expression (no trailing `space`) for the values of `schema`, an integer or number
    subschema that `applies` and that `check_numbers` passed."""
    r = _range(schema, "", "")
    if type_ == "integer":
        lo, hi = _int_bounds(r)
        if r.multiple is not None and r.multiple != 1 and lo is not None and hi is not None:
            k = int(r.multiple)
            values = range((lo + k - 1) // k * k, hi + 1, k)
            return "(" + " | ".join(f'"{v}"' for v in values) + ")" if values else '""'
        wide = 10**INT_DIGITS  # past the digits an open side writes: no bound at all
        return int_range(None if lo is not None and lo <= -wide else lo, None if hi is not None and hi >= wide else hi)
    return number_range(r)


# --- integers ---------------------------------------------------------------------------------

def _cls(a: int, b: int) -> str:
    return f'"{a}"' if a == b else f"[{a}-{b}]"


def _any(n: int) -> str:
    return "" if n == 0 else "[0-9]" if n == 1 else f"[0-9]{{{n}}}"


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _ge(r: str) -> list[str]:
    """Alternatives for the fixed-width digit strings >= r."""
    if r == "0" * len(r):
        return [_any(len(r))]
    d, rest = int(r[0]), r[1:]
    if not rest:
        return [_cls(d, 9)]
    alts = [_seq(f'"{d}"', x) for x in _ge(rest)]
    return alts + ([_seq(_cls(d + 1, 9), _any(len(rest)))] if d < 9 else [])


def _le(r: str) -> list[str]:
    """Alternatives for the fixed-width digit strings <= r."""
    if r == "9" * len(r):
        return [_any(len(r))]
    d, rest = int(r[0]), r[1:]
    if not rest:
        return [_cls(0, d)]
    alts = [_seq(f'"{d}"', x) for x in _le(rest)]
    return ([_seq(_cls(0, d - 1), _any(len(rest)))] if d > 0 else []) + alts


def _span(s: str, t: str) -> list[str]:
    """Alternatives for the digit strings of s's width between s and t (s <= t, same width)."""
    i = next((i for i, (a, b) in enumerate(zip(s, t, strict=True)) if a != b), len(s))
    if i == len(s):
        return [f'"{s}"']
    prefix = f'"{s[:i]}"' if i else ""
    a, b, width = int(s[i]), int(t[i]), len(s) - i - 1
    if width == 0:
        return [_seq(prefix, _cls(a, b))]
    low_full, high_full = s[i + 1:] == "0" * width, t[i + 1:] == "9" * width
    alts = [] if low_full else [_seq(prefix, f'"{a}"', x) for x in _ge(s[i + 1:])]
    first, last = (a if low_full else a + 1), (b if high_full else b - 1)
    if first <= last:
        alts.append(_seq(prefix, _cls(first, last), _any(width)))
    return alts + ([] if high_full else [_seq(prefix, f'"{b}"', x) for x in _le(t[i + 1:])])


def _naturals(lo: int, hi: int | None) -> list[str]:
    """Alternatives for the canonical decimals of the integers in [lo, hi], 0 <= lo; hi None:
    up to INT_DIGITS digits (or lo's own width, if longer)."""
    if hi is None:
        hi = 10 ** max(INT_DIGITS, len(str(lo))) - 1
    alts: list[str] = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        start, end = max(lo, 10 ** (width - 1) if width > 1 else 0), min(hi, 10**width - 1)
        if start <= end:
            alts += _span(str(start), str(end))
    return alts


def _group(alts: list[str]) -> str:
    return alts[0] if len(alts) == 1 and " " not in alts[0] else "(" + " | ".join(alts) + ")"


def int_range(lo: int | None, hi: int | None) -> str:
    """A GBNF expression for exactly the integers in [lo, hi] (None: open), canonically written."""
    alts: list[str] = []
    if hi is None or hi >= 0:
        alts += _naturals(max(lo, 0) if lo is not None else 0, hi)
    if lo is None or lo < 0:
        negative = _naturals(max(-hi, 1) if hi is not None else 1, -lo if lo is not None else None)
        alts.append(_seq('"-"', _group(negative)))
    return _group(alts) if alts else '""'


# --- numbers ----------------------------------------------------------------------------------

def _fractions(digits: int) -> tuple[str, str]:
    """(any fraction, a nonzero fraction), each with at most `digits` digits; "" when none may be."""
    if digits <= 0:
        return "", ""
    any_ = f'"." [0-9]{{1,{digits}}}' if digits > 1 else '"." [0-9]'
    nonzero = f'"." [0-9]{{0,{digits - 1}}} [1-9]' if digits > 1 else '"." [1-9]'
    return any_, nonzero


def _magnitude(lo: int, lo_excl: bool, hi: int | None, hi_excl: bool, frac: tuple[str, str]) -> list[str]:
    """Alternatives for the unsigned decimals m (integer part and fraction, no exponent) with
    lo <(=) m <(=) hi, integer lo >= 0 and hi (None: open)."""
    any_frac, nonzero = frac
    opt = f"({any_frac})?" if any_frac else ""
    alts: list[str] = []
    if hi is not None and hi == lo:
        return [] if lo_excl or hi_excl else [_seq(f'"{lo}"', '(".0")?')]
    if lo_excl:
        if nonzero:
            alts.append(_seq(f'"{lo}"', nonzero))
    else:
        alts.append(_seq(f'"{lo}"', opt))
    if hi is None or lo + 1 <= hi - 1:
        inner = _naturals(lo + 1, None if hi is None else hi - 1)
        alts.append(_seq(_group(inner), opt))
    if hi is not None and not hi_excl:  # an exclusive hi is covered up to it by hi - 1 (or lo) above
        alts.append(_seq(f'"{hi}"', '(".0")?'))
    return alts


def number_range(r: Range) -> str:
    """A GBNF expression for decimals in the range `r`, whose bounds are whole numbers."""
    lo = None if r.lo is None or r.lo <= -_OPEN else int(r.lo)
    hi = None if r.hi is None or r.hi >= _OPEN else int(r.hi)
    widest = max((len(str(abs(b))) for b in (lo, hi) if b is not None), default=1)
    frac = _fractions(SIGNIFICANT - widest)
    alts: list[str] = []
    if hi is None or hi > 0 or (hi == 0 and not r.hi_excl):  # the values >= 0
        if lo is not None and lo >= 0:
            alts += _magnitude(lo, r.lo_excl, hi, r.hi_excl, frac)
        else:
            alts += _magnitude(0, False, hi, r.hi_excl, frac)
    if lo is None or lo < 0:  # the values < 0, written as "-" and their magnitude, which is > 0
        if hi is not None and hi < 0:
            mag = _magnitude(-hi, r.hi_excl, None if lo is None else -lo, r.lo_excl, frac)
        else:
            mag = _magnitude(0, True, None if lo is None else -lo, r.lo_excl, frac)
        if mag:
            alts.append(_seq('"-"', _group(mag)))
    return _group(alts) if alts else '""'
