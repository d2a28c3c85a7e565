"""Incremental detokenization: text is released only when it is final.

Two things are held back: a trailing incomplete UTF-8 character (decoded as U+FFFD until its
last byte arrives) and a tail that could still grow into a stop string. A stop string itself is
emitted only when asked (`include_stop`: vLLM's include_stop_str_in_output). Special tokens' text
(`<|im_end|>`) is left out unless `skip_special_tokens` is False.
"""
from __future__ import annotations

# Decode from a few tokens before the new ones, so that tokenizers whose decoding depends on
# the previous token (leading spaces, byte fallback) produce the same text as a full decode.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: list[int], stop: tuple[str, ...] = (),
                 skip_special_tokens: bool = True, include_stop: bool = False):
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.skip_special_tokens = skip_special_tokens
        self.include_stop = include_stop
        # Stop strings are looked for from here on: text released while they were not checked
        # (min_tokens) cannot end the answer later.
        self.search_from = 0
        self.ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # everything decoded so far (complete characters only)
        self.released = 0  # how much of self.text has been emitted
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def push(self, token_id: int, check_stop: bool = True) -> str:
        """Add one token; return the text that became final (maybe ''). Sets `stopped`, unless
        `check_stop` is False (before min_tokens): then the text is released as it is."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self.prefix_offset : self.read_offset])
        after = self._decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        if not check_stop:
            out = self.text[self.released:]
            self.released = self.search_from = len(self.text)
            return out
        return self._release()

    def _release(self) -> str:
        start = max(self.search_from, self.released - max((len(s) for s in self.stop), default=0))
        hits = [(i, len(s)) for i, s in ((self.text.find(s, start), s) for s in self.stop) if i >= 0]
        if hits:
            at, length = min(hits)
            end = at + length if self.include_stop else at
            self.stopped = True
        else:
            end = len(self.text) - self._held_tail()
        end = max(end, self.released)
        out = self.text[self.released : end]
        self.released = end
        return out

    def _held_tail(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def flush(self) -> str:
        """At the end of a sequence (not by stop string): release what was held back."""
        if self.stopped:
            return ""
        out = self.text[self.released :]
        self.released = len(self.text)
        return out
