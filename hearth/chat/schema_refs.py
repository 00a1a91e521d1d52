"""Local `$ref`s of a schema that is placed inside another: a forced tool call's grammar wraps each
tool's parameters in the call object (`{"name": ..., "arguments": <parameters>}`), so a ref
written against the parameters' root (`#/$defs/Item`, what pydantic emits for nested models)
would resolve against the wrapper and fail ("Error resolving ref input#/$defs/…").

`reroot` rewrites every local ref of the parameters to point into `#/$defs/<key>`, where the
caller files the parameters (with their own `$defs` and `definitions` inside them) at the
wrapper's root: `#/$defs/Item` becomes `#/$defs/<key>/$defs/Item`, and `#` (the parameters
themselves, a recursive root) becomes `#/$defs/<key>`. Nothing is inlined, so recursive models
stay recursive rules in the grammar. Refs that are not local (`https://…`, relative files) are
left as they are, for the converter to refuse.
"""

from __future__ import annotations

from typing import Any


def has_refs(schema: Any) -> bool:
    """Whether a `$ref` appears anywhere in `schema` (walked iteratively)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def reroot(schema: Any, key: str) -> Any:
    """A copy of `schema` whose local refs point into `#/$defs/{key}`, where the caller puts it."""
    if isinstance(schema, list):
        return [reroot(v, key) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: reroot(v, key) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
        out["$ref"] = f"#/$defs/{key}{ref[1:]}"
    return out
