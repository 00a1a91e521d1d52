"""llama.cpp's JSON-schema-to-GBNF converter (the Python port llama-cpp-python vendors), with the
two things Hearth adds to it:

- numeric bounds: an `integer` or `number` subschema with `minimum`/`maximum`/`exclusive*`/
  `multipleOf` becomes the range grammar of `numeric_bounds` (the converter ignores them); a
  `type` list carries them to its integer and number members (the converter drops every keyword
  but the type there);
- refs beside other keywords: the converter resolves a node's `$ref` and walks none of its
  siblings, so the refs inside a `$defs` that sits beside a `$ref` (pydantic's recursive root,
  `{"$defs": {"Tree": ...}, "$ref": "#/$defs/Tree"}`) were never resolved. Here every node is
  walked; only local refs (`#…`) resolve, as `allow_fetch=False` made them before;
- one rule per ref: the converter names a ref's rule after the ref's last segment and reuses any
  rule already of that name, so two tools' `$defs/Item` (or a def named like a primitive,
  `string`) would share one rule. Here every distinct ref gets its own name, claimed before its
  subschema is visited so that a recursive ref points at it.

The class is built on first use: importing llama_cpp loads its shared library.
"""

from __future__ import annotations

import functools
from typing import Any

from hearth.chat.numeric_bounds import KEYWORDS, applies, numeric_rule


@functools.cache
def converter_class() -> Any:
    from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE, RESERVED_NAMES, SchemaConverter

    class Converter(SchemaConverter):  # its methods are unannotated: calls to them are marked below
        def __init__(self, **kw: Any) -> None:
            super().__init__(**kw)  # type: ignore[no-untyped-call]
            self._ref_names: dict[str, str] = {}

        def visit(self, schema: Any, name: str) -> Any:
            if isinstance(schema, dict) and isinstance(schema.get("type"), list) and applies(schema):
                bounds = {k: schema[k] for k in KEYWORDS if k in schema}
                members = [{"type": t, **bounds} if t in ("integer", "number") else {"type": t}
                           for t in schema["type"]]
                return super().visit({"anyOf": members}, name)  # type: ignore[no-untyped-call]
            if applies(schema):
                rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
                rule = numeric_rule(schema, schema["type"]) + " space"
                return self._add_rule(rule_name, rule)  # type: ignore[no-untyped-call]
            return super().visit(schema, name)  # type: ignore[no-untyped-call]

        def resolve_refs(self, schema: Any, url: str) -> Any:
            def visit(node: Any) -> None:
                if isinstance(node, list):
                    for v in node:
                        visit(v)
                    return
                if not isinstance(node, dict):
                    return
                ref = node.get("$ref")
                if isinstance(ref, str) and ref not in self._refs:
                    if not ref.startswith("#"):
                        raise ValueError(f"unsupported $ref {ref!r}: only local refs (#/…) are resolved")
                    target = schema
                    for sel in ref[1:].split("/")[1:]:
                        sel = sel.replace("~1", "/").replace("~0", "~")
                        if isinstance(target, list) and sel.isdigit() and int(sel) < len(target):
                            target = target[int(sel)]
                        elif isinstance(target, dict) and sel in target:
                            target = target[sel]
                        else:
                            raise ValueError(f"cannot resolve $ref {ref!r}: no {sel!r} there")
                    node["$ref"] = ref = f"{url}{ref}"
                    self._refs[ref] = target
                for v in node.values():
                    visit(v)

            visit(schema)
            return schema

        def _resolve_ref(self, ref: str) -> Any:
            name = self._ref_names.get(ref)
            if name is None:
                base, i = INVALID_RULE_CHARS_RE.sub("-", ref.split("/")[-1]) or "ref", 0
                name = base
                taken = set(self._rules) | set(self._ref_names.values()) | RESERVED_NAMES
                while name in taken:
                    i += 1
                    name = f"{base}{i}"
                self._ref_names[ref] = name
            if name not in self._rules and ref not in self._refs_being_resolved:
                self._refs_being_resolved.add(ref)
                name = self.visit(self._refs[ref], name)
                self._refs_being_resolved.remove(ref)
            return name

    return Converter
