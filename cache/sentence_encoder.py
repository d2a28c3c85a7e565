"""A sentence-transformers folder of the common shape encoded without sentence-transformers.

Importing sentence-transformers (with the scikit-learn and scipy it pulls in) was about 4 s of
a gateway's 14-15 s start on a 2-core machine (2026-12). The folders a cache uses are nearly all one
shape: a transformer, mean pooling over its tokens, then an L2 normalisation (all-MiniLM-L6-v2,
all-mpnet-base-v2). `read` encodes such a folder the way sentence-transformers 6 does, step for
step (the batches sorted by length, the tokenizer's padding and truncation, the masked mean, the
two normalisations `encode(normalize_embeddings=True)` makes): the same vectors bit for bit
(tests/test_sentence_encoder.py). The transformer is cache/bert.py's where it is a plain BERT (the
default), else transformers' `AutoModel`. Any other folder returns None and cache/embedder.py loads
it through sentence-transformers.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TRANSFORMER = "sentence_transformers.models.Transformer"
POOLING = "sentence_transformers.models.Pooling"
NORMALIZE = "sentence_transformers.models.Normalize"
MEAN_ONLY = {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False, "pooling_mode_max_tokens": False,
             "pooling_mode_mean_sqrt_len_tokens": False}


class MeanPooledEncoder:
    """A transformer's tokens averaged over the attention mask, then L2-normalised."""

    def __init__(self, folder: Path, max_seq_length: int, normalized: bool):
        import torch

        from cache import bert
        from engine.tokenizer import read_tokenizer

        self.torch = torch
        self.tokenizer = read_tokenizer(folder)
        self.model = bert.read(folder) or transformers_model(folder)
        self.max_seq_length = max_seq_length
        self.normalized = normalized  # the folder ends with a Normalize module
        self.dim = int(self.model.config.hidden_size)

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        """sentence-transformers' `encode(texts, batch_size, normalize_embeddings=True)`: longest
        texts first (its order: numpy's argsort of the negated character counts), so that each
        batch is padded as it pads it, and the rows put back in the callers' order."""
        torch, F = self.torch, self.torch.nn.functional
        order = np.argsort([-len(t) for t in texts])
        rows = []
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                batch = [texts[i] for i in order[start:start + batch_size]]
                features = self.tokenizer(batch, padding=True, truncation="longest_first", return_tensors="pt",
                                          max_length=self.max_seq_length)
                tokens = self.model(**features).last_hidden_state
                mask = features["attention_mask"].unsqueeze(-1).to(tokens.dtype)
                summed = (tokens * mask).sum(dim=1, dtype=tokens.dtype)
                counts = torch.clamp(mask.sum(dim=1, dtype=tokens.dtype), min=1e-9)
                vectors = (summed / counts).to(tokens.dtype)
                if self.normalized:
                    vectors = F.normalize(vectors, p=2, dim=1)
                rows.extend(F.normalize(vectors, p=2, dim=1))  # encode's own, on top
        back = np.argsort(order)
        return np.stack([rows[i].numpy() for i in back]) if rows else np.zeros((0, self.dim), np.float32)


def transformers_model(folder: Path):
    """A transformer other than a plain BERT (cache/bert.py), through transformers."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    return AutoModel.from_pretrained(folder, local_files_only=True).eval()


class SentenceTransformersEncoder:
    """Any other folder, through sentence-transformers itself."""

    def __init__(self, folder: Path):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(folder), device="cpu", local_files_only=True).eval()
        self.tokenizer = self.model.tokenizer
        self.max_seq_length = int(self.model.max_seq_length)
        self.dim = int(self.model.get_embedding_dimension() if hasattr(self.model, "get_embedding_dimension")
                       else self.model.get_sentence_embedding_dimension())

    def encode(self, texts: list[str], batch_size: int) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size, normalize_embeddings=True, convert_to_numpy=True,
                                 show_progress_bar=False)


def load(folder: Path) -> MeanPooledEncoder | SentenceTransformersEncoder:
    """The folder's encoder: transformers alone where it can (`read`), else sentence-transformers."""
    return read(folder) or SentenceTransformersEncoder(folder)


def read(folder: Path) -> MeanPooledEncoder | None:
    """The folder's encoder when it is the common shape (module docstring), else None."""
    try:
        modules = json.loads((folder / "modules.json").read_text())
        kinds = [m["type"] for m in modules]
        if kinds not in ([TRANSFORMER, POOLING], [TRANSFORMER, POOLING, NORMALIZE]) or modules[0]["path"]:
            return None
        pooling = json.loads((folder / modules[1]["path"] / "config.json").read_text())
        config = json.loads((folder / "sentence_bert_config.json").read_text())
    except (OSError, ValueError, KeyError):
        return None
    if any(pooling.get(k, False) != v for k, v in MEAN_ONLY.items()) or pooling.get("include_prompt") is False \
            or config.get("do_lower_case") or not config.get("max_seq_length"):
        return None
    return MeanPooledEncoder(folder, int(config["max_seq_length"]), NORMALIZE in kinds)
