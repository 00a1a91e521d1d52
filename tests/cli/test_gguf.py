"""The GGUF metadata reader, on hand-built headers and on the embedded model."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from hearth import gguf
from hearth.models import embedded_model_path


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path: Path, kvs: list[tuple[str, int, bytes]], version: int = 3) -> Path:
    body = b"".join(_str(k) + struct.pack("<I", t) + v for k, t, v in kvs)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, len(kvs)) + body)
    return path


def test_reads_scalars_strings_and_skips_arrays(tmp_path: Path) -> None:
    tokens = struct.pack("<IQ", 8, 3) + _str("a") + _str("bb") + _str("ccc")
    scores = struct.pack("<IQ", 6, 4) + struct.pack("<4f", 1, 2, 3, 4)
    path = write_gguf(tmp_path / "m.gguf", [
        ("general.architecture", 8, _str("qwen2")),
        ("tokenizer.ggml.tokens", 9, tokens),
        ("tokenizer.ggml.scores", 9, scores),
        ("qwen2.context_length", 4, struct.pack("<I", 32768)),
        ("general.file_type", 4, struct.pack("<I", 15)),
        ("qwen2.rope.freq_base", 6, struct.pack("<f", 0.5)),
        ("general.flag", 7, struct.pack("<?", True)),
        ("general.big", 10, struct.pack("<Q", 1 << 40)),
    ])
    meta = gguf.read_metadata(path)
    assert meta["general.architecture"] == "qwen2"
    assert meta["tokenizer.ggml.tokens"] == {"array_of": 3}
    assert meta["tokenizer.ggml.scores"] == {"array_of": 4}
    assert meta["qwen2.rope.freq_base"] == 0.5
    assert meta["general.flag"] is True
    assert meta["general.big"] == 1 << 40
    assert gguf.context_length(meta) == 32768
    assert gguf.quantization(meta) == "Q4_K_M"


def test_unknown_file_type_and_missing_keys(tmp_path: Path) -> None:
    meta = gguf.read_metadata(write_gguf(tmp_path / "m.gguf", [("general.file_type", 4, struct.pack("<I", 999))]))
    assert gguf.quantization(meta) == "type 999"
    assert gguf.context_length(meta) is None


@pytest.mark.parametrize("data, message", [
    (b"NOPE" + bytes(20), "not a GGUF file"),
    (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    (b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + _str("general.name"), "truncated"),
])
def test_rejects_bad_headers(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(gguf.GGUFError, match=message):
        gguf.read_metadata(path)


def test_embedded_model_header_matches_its_file_name() -> None:
    path = embedded_model_path()
    meta = gguf.read_metadata(path)
    # The file is named after its quantization (SmolLM2-135M-Instruct.Q4_1.gguf).
    assert gguf.quantization(meta) == path.stem.rsplit(".", 1)[1]
    assert meta["general.architecture"] == "llama"
    n_ctx = gguf.context_length(meta)
    assert n_ctx is not None and n_ctx > 0
