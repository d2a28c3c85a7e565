"""The engine's tokenizer, shared by threads: one call at a time.

Celery task threads encode prompts while the engine thread decodes tokens, and the Rust tokenizer
under a transformers fast tokenizer raises "Already borrowed" when two threads use it at once (its
padding and truncation settings are mutable state). Calls take microseconds to milliseconds; the
lock costs less.
"""
from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from pathlib import Path


class SerializedTokenizer:
    """A fast tokenizer behind one lock. Other attributes (ids of special tokens, ...) are read
    through."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._lock = threading.Lock()

    def __call__(self, *args, **kwargs):
        with self._lock:
            return self._tokenizer(*args, **kwargs)

    def decode(self, *args, **kwargs):
        with self._lock:
            return self._tokenizer.decode(*args, **kwargs)

    def apply_chat_template(self, *args, **kwargs):
        with self._lock:
            return self._tokenizer.apply_chat_template(*args, **kwargs)

    @contextmanager
    def exclusive(self):
        """The tokenizer itself, for a library that must be handed the real object (guided
        decoding's token table); no other call runs meanwhile."""
        with self._lock:
            yield self._tokenizer

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


# Tokenizer classes (by tokenizer_config.json's name) read through their own module, as
# `AutoTokenizer` would pick them: transformers 5 has one BERT class, which "BertTokenizerFast" names too.
OWN_CLASSES = {"TokenizersBackend": ("transformers.tokenization_utils_tokenizers", "TokenizersBackend"),
               "BertTokenizer": ("transformers.models.bert.tokenization_bert", "BertTokenizer"),
               "BertTokenizerFast": ("transformers.models.bert.tokenization_bert", "BertTokenizer")}


def read_tokenizer(folder: Path):
    """The folder's tokenizer through its own class where that is one of OWN_CLASSES (what
    `AutoTokenizer` returns for it), else `AutoTokenizer`. Model-free (no torch): `AutoTokenizer`
    resolves a class through every model's config, about 3-5 s of a worker's or a gateway's start
    (2-core AVX2, 2026-12), where this import takes about 1."""
    import importlib

    config = folder / "tokenizer_config.json"
    name = json.loads(config.read_text()).get("tokenizer_class") if config.exists() else None
    if name in OWN_CLASSES:
        module, cls = OWN_CLASSES[name]
        return getattr(importlib.import_module(module), cls).from_pretrained(folder)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
