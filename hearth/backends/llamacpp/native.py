"""llama.cpp calls both runners make the same way (the chat runner and the embedding runner):
loading a model file, tokenizing, reading a metadata value."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as L


def load_model(path: str) -> Any:
    """The model at `path` on the CPU (llama_model_p); a clear error when it is not one."""
    mparams = L.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = L.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def tokenize(vocab: Any, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    cap = len(data) + 16
    buf = (L.llama_token * cap)()
    n = L.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:  # the buffer was short: -n is the count
        cap = -n
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    return list(buf[:n])


def model_meta(model: Any, key: str) -> str | None:
    """A GGUF metadata value as text, whatever its length; None when the key is absent."""
    buf = ctypes.create_string_buffer(1 << 16)
    n = L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        L.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")
