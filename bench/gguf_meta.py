"""The tokens that end generation, from a GGUF file's header (read by `hearth.gguf`)."""

from __future__ import annotations

from pathlib import Path

from hearth.gguf import read_metadata

# Token texts llama.cpp treats as end-of-generation, whatever the EOS id says.
_EOG_TEXTS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>", "<|eom_id|>")


def stop_token_ids(path: Path) -> list[int]:
    """Token ids that end generation (EOS/EOT/EOG), for servers that need a logit bias instead of ignore_eos."""
    meta = read_metadata(path, arrays={"tokenizer.ggml.tokens"})
    ids: set[int] = set()
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        ids.update(i for i, text in enumerate(tokens) if text in _EOG_TEXTS)
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
    return sorted(ids)
