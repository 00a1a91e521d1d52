"""Read scalar metadata from a GGUF file header without loading the model."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

# GGUF value types
_SCALARS: dict[int, str] = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING = 8
_ARRAY = 9

Scalar = int | float | bool | str
Value = Scalar | list[Scalar]

# Token texts llama.cpp treats as end-of-generation, whatever the EOS id says.
_EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>", "<|eom_id|>")


def _read(f: BinaryIO, fmt: str) -> int | float | bool:
    size = struct.calcsize(fmt)
    value: int | float | bool = struct.unpack(fmt, f.read(size))[0]
    return value


def _read_str(f: BinaryIO) -> str:
    n = int(_read(f, "<Q"))
    return f.read(n).decode("utf-8", errors="replace")


def _read_value(f: BinaryIO, vtype: int, keep: bool) -> Value | None:
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _read_str(f)
    if vtype == _ARRAY:
        etype = int(_read(f, "<I"))
        count = int(_read(f, "<Q"))
        if etype in _SCALARS and not keep:
            f.seek(struct.calcsize(_SCALARS[etype]) * count, 1)
            return None
        items = [_read_value(f, etype, keep) for _ in range(count)]
        return [i for i in items if i is not None and not isinstance(i, list)] if keep else None
    raise ValueError(f"unknown GGUF value type {vtype}")


def read_metadata(path: Path, arrays: frozenset[str] = frozenset()) -> dict[str, Value]:
    """Return the scalar key/values of the GGUF header, plus the arrays named in `arrays`."""
    out: dict[str, Value] = {}
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version = int(_read(f, "<I"))
        _n_tensors = _read(f, "<Q")
        n_kv = int(_read(f, "<Q"))
        out["gguf.version"] = version
        for _ in range(n_kv):
            key = _read_str(f)
            value = _read_value(f, int(_read(f, "<I")), key in arrays)
            if value is not None:
                out[key] = value
    return out


def stop_token_ids(path: Path) -> list[int]:
    """Token ids that end generation (EOS/EOT/EOG), for servers that need a logit bias instead of ignore_eos."""
    meta = read_metadata(path, frozenset({"tokenizer.ggml.tokens"}))
    ids: set[int] = set()
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        ids.update(i for i, text in enumerate(tokens) if text in _EOG_TEXTS)
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
    return sorted(ids)
