"""Bounds on what a JSON schema or a GBNF grammar may cost before it is converted or parsed.

llama-cpp-python's schema converter writes repetitions out in full: `minItems: N` becomes N
copies of the item rule and `maxItems: N` N nested optional groups, so the grammar's size, the
converter's time and llama.cpp's parse (recursive per nesting level) grow with the counts a
client chooses (`minItems: 10000000` took 17 s and 1 GB). Optional properties cost quadratically
(every suffix of the list becomes a rule). Each bound below is checked on the schema before the
converter runs, and the grammar text is bounded before llama.cpp parses it; a breach is a 400
naming the limit.
"""

from __future__ import annotations

import re
from typing import Any

from hearth.errors import BadRequest

MAX_SCHEMA_DEPTH = 32  # nested subschemas
MAX_SCHEMA_NODES = 5_000  # subschemas in all
MAX_REPETITION = 1_000  # any one minItems / maxItems / minLength / maxLength / regex {m,n}
MAX_TOTAL_REPETITION = 10_000  # their sum over the whole schema
MAX_OPTIONAL_PROPERTIES = 100  # per object (the converter's cost is quadratic in them)
MAX_PROPERTY_NAME = 256  # characters (names are repeated in the rule names of everything below)
MAX_PATTERN = 1_000  # characters of one regex
MAX_GRAMMAR_BYTES = 1 << 20  # a grammar's text, converted or given
MAX_GRAMMAR_NESTING = 2_500  # parenthesis depth of a grammar (llama.cpp parses it recursively)

_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
           "minContains", "maxContains")
_QUANTIFIER = re.compile(r"\{\s*(\d*)\s*(?:,\s*(\d*)\s*)?\}")


def _too_big(what: str, limit: int, param: str) -> BadRequest:
    return BadRequest(f"{param}: the schema is too large for a grammar: {what} (the limit is {limit})", param=param)


def check_schema(schema: Any, param: str = "response_format") -> None:
    """Refuse (400) a schema whose grammar would be too large to build; walks it iteratively."""
    nodes = total = 0
    stack: list[tuple[Any, int, str]] = [(schema, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, list):
            stack.extend((v, depth, f"{path}[{i}]") for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise _too_big(f"more than {MAX_SCHEMA_NODES} subschemas", MAX_SCHEMA_NODES, param)
        if depth > MAX_SCHEMA_DEPTH:
            raise _too_big(f"subschemas nested deeper than {MAX_SCHEMA_DEPTH} levels at {path or 'the root'}",
                           MAX_SCHEMA_DEPTH, param)
        for key in _COUNTS:
            n = node.get(key)
            if isinstance(n, int | float) and not isinstance(n, bool):
                if n > MAX_REPETITION:
                    raise _too_big(f"{key} {n:g} at {path or 'the root'}", MAX_REPETITION, param)
                total += max(int(n), 0)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            if len(pattern) > MAX_PATTERN:
                raise _too_big(f"a pattern of {len(pattern)} characters at {path or 'the root'}", MAX_PATTERN, param)
            for m in _QUANTIFIER.finditer(pattern):
                n = max(int(g) for g in m.groups() if g) if any(m.groups()) else 0
                if n > MAX_REPETITION:
                    raise _too_big(f"the repetition {m.group(0)} in a pattern at {path or 'the root'}",
                                   MAX_REPETITION, param)
                total += n
        props = node.get("properties")
        if isinstance(props, dict):
            required = node.get("required")
            required = set(required) if isinstance(required, list) and all(isinstance(r, str) for r in required) \
                else set()
            optional = sum(1 for k in props if k not in required)
            if optional > MAX_OPTIONAL_PROPERTIES:
                raise _too_big(f"{optional} optional properties in one object at {path or 'the root'}",
                               MAX_OPTIONAL_PROPERTIES, param)
            long = next((k for k in props if len(k) > MAX_PROPERTY_NAME), None)
            if long is not None:
                raise _too_big(f"a property name of {len(long)} characters at {path or 'the root'}",
                               MAX_PROPERTY_NAME, param)
        if total > MAX_TOTAL_REPETITION:
            raise _too_big(f"repetition counts adding up to more than {MAX_TOTAL_REPETITION}",
                           MAX_TOTAL_REPETITION, param)
        stack.extend((v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in node.items()
                     if isinstance(v, dict | list))


def check_grammar(grammar: str, param: str = "grammar") -> None:
    """Refuse (400) a GBNF grammar too large or too deeply nested for llama.cpp to parse safely
    (its own parser caps `{m,n}` counts at 2000, not the text's size or its nesting)."""
    size = len(grammar.encode("utf-8", errors="replace"))
    if size > MAX_GRAMMAR_BYTES:
        raise BadRequest(f"{param}: the grammar is {size} bytes (the limit is {MAX_GRAMMAR_BYTES})", param=param)
    depth = _nesting(grammar)
    if depth > MAX_GRAMMAR_NESTING:
        raise BadRequest(f"{param}: the grammar nests groups {depth} deep (the limit is {MAX_GRAMMAR_NESTING})",
                         param=param)


_OPAQUE = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*')


def _nesting(grammar: str) -> int:
    """The deepest parenthesis nesting outside string literals, character classes and comments."""
    if grammar.count("(") <= MAX_GRAMMAR_NESTING:
        return grammar.count("(")
    depth = deepest = 0
    for c in re.findall(r"[()]", _OPAQUE.sub("", grammar)):
        depth += 1 if c == "(" else -1
        deepest = max(deepest, depth)
    return deepest
