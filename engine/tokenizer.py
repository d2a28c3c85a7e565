"""The engine's tokenizer, shared by threads: one call at a time.

Celery task threads encode prompts while the engine thread decodes tokens, and the Rust tokenizer
under a transformers fast tokenizer raises "Already borrowed" when two threads use it at once (its
padding and truncation settings are mutable state). Calls take microseconds to milliseconds; the
lock costs less.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager


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
