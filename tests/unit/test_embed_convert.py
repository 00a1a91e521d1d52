"""The sentence-transformers → GGUF conversion (hearth.embed_convert) on a tiny synthetic BERT
folder: tensor names and shapes as llama.cpp's BERT loader wants them, the pooling type, the
vocabulary's phantom-space spelling and token types, the normalizer options."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

from hearth.embed_convert import ConvertError, convert, pooling_type

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "the", "a", "b", "c"]
H, FF, LAYERS, POS = 8, 16, 2, 16


def folder(tmp_path: Path, pooling: dict[str, bool] | None = None) -> Path:
    d = tmp_path / "model"
    (d / "1_Pooling").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({
        "model_type": "bert", "vocab_size": len(VOCAB), "hidden_size": H, "num_hidden_layers": LAYERS,
        "num_attention_heads": 2, "intermediate_size": FF, "max_position_embeddings": POS,
        "type_vocab_size": 2, "layer_norm_eps": 1e-12}))
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pooling or {"pooling_mode_mean_tokens": True}))
    specials = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    (d / "tokenizer.json").write_text(json.dumps({
        "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(VOCAB) if t in specials],
        "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {t: i for i, t in enumerate(VOCAB)}}}))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
        "mask_token": "[MASK]"}))
    rng = np.random.default_rng(0)
    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": rng.standard_normal((len(VOCAB), H)),
        "embeddings.position_embeddings.weight": rng.standard_normal((POS, H)),
        "embeddings.token_type_embeddings.weight": rng.standard_normal((2, H)),
        "embeddings.LayerNorm.weight": np.ones(H), "embeddings.LayerNorm.bias": np.zeros(H),
        "embeddings.position_ids": np.arange(POS)[None, :],
        "pooler.dense.weight": rng.standard_normal((H, H)), "pooler.dense.bias": np.zeros(H),
    }
    for b in range(LAYERS):
        p = f"encoder.layer.{b}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            w[p + name + ".weight"] = rng.standard_normal((H, H))
            w[p + name + ".bias"] = np.zeros(H)
        w[p + "intermediate.dense.weight"] = rng.standard_normal((FF, H))
        w[p + "intermediate.dense.bias"] = np.zeros(FF)
        w[p + "output.dense.weight"] = rng.standard_normal((H, FF))
        w[p + "output.dense.bias"] = np.zeros(H)
        for norm in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + norm + ".weight"] = np.ones(H)
            w[p + norm + ".bias"] = np.zeros(H)
    save_file({k: v.astype(np.int64 if k.endswith("position_ids") else np.float32) for k, v in w.items()},
              str(d / "model.safetensors"))
    return d


def test_tensors_metadata_and_vocabulary(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    convert(folder(tmp_path), out, name="tiny")
    r = gguf.GGUFReader(str(out))
    f = {k: v.contents() for k, v in r.fields.items()}
    assert f["general.architecture"] == "bert" and f["general.name"] == "tiny"
    assert f["bert.pooling_type"] == 1  # mean
    assert f["bert.attention.causal"] is False
    assert (f["bert.block_count"], f["bert.embedding_length"], f["bert.context_length"]) == (LAYERS, H, POS)
    assert f["bert.feed_forward_length"] == FF and f["bert.attention.head_count"] == 2
    assert f["tokenizer.ggml.token_type_count"] == 2
    assert f["tokenizer.ggml.model"] == "bert"
    assert f["tokenizer.ggml.normalizer.lowercase"] is True and f["tokenizer.ggml.normalizer.strip_accents"] is True
    tokens = f["tokenizer.ggml.tokens"]
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokens[5:8] == ["\u2581hello", "\u2581world", "s"]  # word starts gain ▁, ## pieces lose ##
    types = f["tokenizer.ggml.token_type"]
    assert types[:5] == [int(gguf.TokenType.CONTROL)] * 5 and types[5] == int(gguf.TokenType.NORMAL)
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.seperator_token_id"]) == (2, 3)
    shapes = {t.name: (tuple(int(x) for x in t.shape), t.tensor_type.name) for t in r.tensors}
    assert shapes["token_embd.weight"] == ((H, len(VOCAB)), "F16")  # ggml's order: columns first
    assert shapes["position_embd.weight"] == ((H, POS), "F32")
    assert shapes["token_types.weight"] == ((H, 2), "F32")
    assert shapes["token_embd_norm.weight"] == ((H,), "F32")
    assert shapes["blk.1.ffn_up.weight"] == ((H, FF), "F16")
    assert shapes["blk.1.ffn_down.weight"] == ((FF, H), "F16")
    for b in range(LAYERS):
        for t in ("attn_q", "attn_k", "attn_v", "attn_output", "attn_output_norm", "ffn_up", "ffn_down",
                  "layer_output_norm"):
            assert f"blk.{b}.{t}.weight" in shapes and f"blk.{b}.{t}.bias" in shapes
    assert not any("pooler" in n or "position_ids" in n for n in shapes)
    assert len(shapes) == 5 + LAYERS * 16


@pytest.mark.parametrize(("config", "want"), [({"pooling_mode_cls_token": True}, 2),
                                              ({"pooling_mode": "lasttoken"}, 3)])
def test_pooling_types(tmp_path: Path, config: dict[str, bool], want: int) -> None:
    assert pooling_type(folder(tmp_path, config)) == want


def test_unsupported_pooling_and_models_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match="pooling"):
        pooling_type(folder(tmp_path, {"pooling_mode_max_tokens": True}))
    d = tmp_path / "model"
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ConvertError, match="BERT"):
        convert(d, tmp_path / "x.gguf", name="x")
