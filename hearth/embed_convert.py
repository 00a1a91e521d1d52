"""A sentence-transformers BERT folder (safetensors weights, tokenizer.json, 1_Pooling) into a
GGUF that llama.cpp serves as an embedding model (`bert` architecture, WordPiece vocabulary,
the folder's pooling type).

The converter: llama.cpp's own `convert_hf_to_gguf.py` (its `conversion/bert.py`) imports torch
and transformers at the top, a multi-gigabyte install for a 90 MB model. The `gguf` package on
PyPI is llama.cpp's own writer (gguf-py, from the same repository), with its tensor-name maps
(`TensorNameMap` for `MODEL_ARCH.BERT`) and its special-token reader (`SpecialVocab`), so this
module drives it from numpy + safetensors and follows `conversion/bert.py` step by step:

- hyperparameters from config.json as `TextModel.set_gguf_parameters` writes them, causal
  attention off, the pooling type from the Pooling module's config (`_try_set_pooling_type`);
- the vocabulary as `BertModel.set_vocab`: tokens in id order, special tokens CONTROL, the
  "phantom space" spelling llama.cpp's WPM tokenizer expects (`##piece` → `piece`, a word start
  → `▁word`), `token_type_count`, special ids from `SpecialVocab`; plus the BertNormalizer's
  `lowercase`/`strip_accents` (the newer gguf-py in llama.cpp's tree writes them; the PyPI
  release lacks the helper, so the keys are written by name);
- tensors renamed by `TensorNameMap`, the pooler and `position_ids` dropped (mean pooling does
  not use them), 2-D weights as F16 and norms, biases and the position and token-type embeddings as F32
  (the converter's default `f16` and its always-F32 table).

Normalisation (sentence-transformers' Normalize module) is not in the file: llama.cpp pools,
and the server L2-normalises every vector it answers (as llama-server's `embd_normalize` 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

ARCH = "bert"

# Pooling config keys (sentence-transformers' Pooling module) → llama.cpp's pooling type
# (LLAMA_POOLING_TYPE_MEAN 1, CLS 2, LAST 3), as conversion/base.py `_try_set_pooling_type`.
POOLING_FLAGS = (("pooling_mode_mean_tokens", 1), ("pooling_mode_cls_token", 2), ("pooling_mode_lasttoken", 3))
POOLING_NAMES = {"mean": 1, "cls": 2, "lasttoken": 3}


# Kept F32 whatever the file type, as the converter's table says (llama.cpp adds them to F32
# activations, and its CPU add has no f32 + f16)
F32_TENSORS = ("position_embd.weight", "token_types.weight")


class ConvertError(Exception):
    pass


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"cannot read {path.name}: {e}") from e


def pooling_type(folder: Path) -> int:
    """The folder's pooling as llama.cpp's pooling type; ConvertError if it has no Pooling module
    or one llama.cpp cannot do (max pooling, mean-sqrt-len)."""
    modules = _json(folder / "modules.json") if (folder / "modules.json").is_file() else []
    path = next((m.get("path", "") for m in modules if str(m.get("type", "")).endswith("Pooling")), None)
    if path is None:
        raise ConvertError(f"{folder} has no sentence-transformers Pooling module (modules.json)")
    config = _json(folder / path / "config.json")
    for key, value in POOLING_FLAGS:
        if config.get(key):
            return value
    mode = config.get("pooling_mode")
    if mode in POOLING_NAMES:
        return POOLING_NAMES[mode]
    raise ConvertError(f"pooling {config} is not one llama.cpp has (mean, cls, last token)")


def vocabulary(folder: Path, vocab_size: int) -> tuple[list[str], list[int], dict[str, bool]]:
    """Tokens in id order (phantom-space spelling), their gguf.TokenType, and the normalizer's
    options, from tokenizer.json (a WordPiece model)."""
    import gguf

    tok = _json(folder / "tokenizer.json")
    model = tok.get("model") or {}
    if model.get("type") != "WordPiece":
        raise ConvertError(f"the tokenizer is {model.get('type')!r}, not WordPiece: not a BERT vocabulary")
    vocab: dict[str, int] = model["vocab"]
    special = {t["content"] for t in tok.get("added_tokens", []) if t.get("special")}
    by_id = {i: t for t, i in vocab.items()}
    if max(by_id) >= vocab_size:
        raise ConvertError(f"token id {max(by_id)} is past the model's vocab_size {vocab_size}")
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        t = by_id.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
        elif t in special:
            tokens.append(t)
            types.append(int(gguf.TokenType.CONTROL))
        else:  # BertModel.set_vocab's phantom(): a continuation loses ##, a word start gains ▁
            tokens.append(t[2:] if t.startswith("##") else "\u2581" + t)
            types.append(int(gguf.TokenType.NORMAL))
    norm = tok.get("normalizer") or {}
    options: dict[str, bool] = {}
    if norm.get("type") == "BertNormalizer":
        lower = bool(norm.get("lowercase", True))
        strip = norm.get("strip_accents")
        # HF BertNormalizer: strip_accents None follows lowercase (as llama.cpp's default does)
        options = {"lowercase": lower, "strip_accents": lower if strip is None else bool(strip)}
    return tokens, types, options


def tensor_plan(names: list[str], n_blocks: int) -> dict[str, str]:
    """HF tensor name → GGUF tensor name (gguf.TensorNameMap for BERT), the unused ones left out."""
    import gguf

    names_map = gguf.TensorNameMap(gguf.MODEL_ARCH.BERT, n_blocks)
    plan: dict[str, str] = {}
    for hf in names:
        name = hf[5:] if hf.startswith("bert.") else hf
        if name.endswith(".gamma"):
            name = name[:-6] + ".weight"
        if name.endswith(".beta"):
            name = name[:-5] + ".bias"
        if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias") or \
                name.startswith(("cls.predictions", "cls.seq_relationship")):
            continue
        new = names_map.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise ConvertError(f"tensor {hf!r} has no BERT name in llama.cpp's map")
        plan[hf] = new
    return plan


def convert(folder: Path, out: Path, *, name: str) -> None:
    """Write the GGUF for the sentence-transformers folder `folder` to `out`."""
    import gguf
    from safetensors.numpy import load_file

    config = _json(folder / "config.json")
    if config.get("model_type") != "bert":
        raise ConvertError(f"model_type {config.get('model_type')!r}: only BERT folders are converted")
    pooling = pooling_type(folder)
    n_blocks = int(config["num_hidden_layers"])
    tokens, types, norm = vocabulary(folder, int(config["vocab_size"]))
    try:
        weights = load_file(str(folder / "model.safetensors"))
    except (OSError, ValueError) as e:
        raise ConvertError(f"cannot read model.safetensors: {e}") from e
    plan = tensor_plan(sorted(weights), n_blocks)

    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name(name)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    w.add_block_count(n_blocks)
    w.add_context_length(int(config["max_position_embeddings"]))
    w.add_embedding_length(int(config["hidden_size"]))
    w.add_feed_forward_length(int(config["intermediate_size"]))
    w.add_head_count(int(config["num_attention_heads"]))
    w.add_layer_norm_eps(float(config["layer_norm_eps"]))
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_token_type_count(int(config.get("type_vocab_size", 1)))
    w.add_tokenizer_model("bert")
    w.add_tokenizer_pre("default")  # WPM has one pre-tokenizer; llama.cpp ignores the name for it
    w.add_token_list(tokens)
    w.add_token_types(types)
    for key, value in norm.items():
        w.add_bool(f"tokenizer.ggml.normalizer.{key}", value)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)
    for hf, new in plan.items():
        data = weights[hf]
        keep_f32 = data.ndim <= 1 or new.endswith("_norm.weight") or new in F32_TENSORS or \
            not new.endswith(".weight")
        w.add_tensor(new, data.astype(np.float32 if keep_f32 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
