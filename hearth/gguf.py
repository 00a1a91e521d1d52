"""Read a GGUF file's metadata (the key/value header) without loading the model.

Layout (little-endian): magic `GGUF`, version u32, tensor count u64, metadata count u64, then
that many `key (string) · value type (u32) · value`. Strings are a u64 length and UTF-8 bytes;
arrays are an element type (u32), a count (u64) and the elements. Arrays are skipped (the
tokenizer's are large and most readers need none of them); their element count is kept, and the
arrays a caller names are read whole.

The one GGUF reader: the model catalog checks a download with it, `hearth models` shows what it
reads, the benchmarks take the stop tokens from the vocabulary.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from pathlib import Path
from typing import Any, BinaryIO

_SCALARS: dict[int, str] = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# llama.cpp's `enum llama_ftype`: the value of `general.file_type`.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16",
    36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}


class GGUFError(ValueError):
    """The file is not a GGUF file this reader understands."""


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise GGUFError("truncated GGUF header")
    return data


def _unpack(f: BinaryIO, fmt: str) -> Any:
    return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]


def _string(f: BinaryIO) -> str:
    n = _unpack(f, "<Q")
    if n > 1 << 24:
        raise GGUFError("implausible string length in GGUF header")
    return _read(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int, whole: bool = False) -> Any:
    """One value; an array as `{"array_of": count}`, or as a list when `whole`."""
    if vtype in _SCALARS:
        return _unpack(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, count = _unpack(f, "<I"), _unpack(f, "<Q")
        if whole:
            return [_value(f, etype) for _ in range(count)]
        if etype in _SCALARS:
            f.seek(struct.calcsize(_SCALARS[etype]) * count, 1)
        else:
            for _ in range(count):
                _value(f, etype)
        return {"array_of": count}
    raise GGUFError(f"unknown GGUF value type {vtype}")


def read_metadata(path: str | Path, arrays: Collection[str] = ()) -> dict[str, Any]:
    """Every metadata key of the GGUF file at `path`: arrays as `{"array_of": count}`, except the
    keys named in `arrays`, read whole as lists."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        version = _unpack(f, "<I")
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        _unpack(f, "<Q")  # tensor count
        count = _unpack(f, "<Q")
        meta: dict[str, Any] = {"GGUF.version": version}
        for _ in range(count):
            key = _string(f)
            meta[key] = _value(f, _unpack(f, "<I"), whole=key in arrays)
        return meta


def quantization(meta: dict[str, Any]) -> str:
    file_type = meta.get("general.file_type")
    if not isinstance(file_type, int):
        return "?"
    return FILE_TYPES.get(file_type, f"type {file_type}")


def context_length(meta: dict[str, Any]) -> int | None:
    value = meta.get(f"{meta.get('general.architecture')}.context_length")
    return value if isinstance(value, int) else None
