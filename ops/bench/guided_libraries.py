"""The three grammar libraries behind one small face, for `brigade bench guided` only.

The engine knows one library (engine/guided.py); this bench must also measure the two it did not
choose, so that the choice can be checked again on another CPU or a newer release. Each adapter
compiles a spec, starts a matcher, fills one shared int32 bitmask for a batch of matchers, applies
it to float32 logits and advances a matcher by a token, the same steps the engine takes per token.
"""
from __future__ import annotations

import json
import re

import torch

from engine.guided import apply_bitmask


def _choice_regex(value: str) -> str:
    return "(" + "|".join(re.escape(c) for c in json.loads(value)) + ")"


class Brigade:
    """xgrammar through engine/guided.py: exactly the engine's path (Guides.start, fill, apply)."""

    name = "xgrammar"

    def __init__(self, tokenizer, vocab_size: int):
        from engine.guided import Guides

        self._guides = Guides(tokenizer, vocab_size)

    def compile(self, kind: str, value: str):
        from engine.guided import GuideSpec

        spec = GuideSpec(kind, value)
        self._guides.start(spec)  # compiles (and caches) the grammar
        return spec

    def matcher(self, compiled):
        return self._guides.start(compiled)

    def fill(self, matchers: list) -> torch.Tensor:
        return self._guides.fill(matchers)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        apply_bits(logits, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept(token)


class XGrammarOwnApply:
    """xgrammar straight, with its own CPU apply kernel (as vLLM calls it) instead of Brigade's."""

    name = "xgrammar_own_apply"

    def __init__(self, tokenizer, vocab_size: int):
        import xgrammar as xgr

        self._xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self._compiler = xgr.GrammarCompiler(info, max_threads=1)
        self._batch = xgr.BatchGrammarMatcher(max_threads="auto")
        self._vocab_size = vocab_size

    def compile(self, kind: str, value: str):
        if kind == "json_schema":
            return self._compiler.compile_json_schema(value, any_whitespace=False, separators=(",", ":"),
                                                      strict_mode=True)
        if kind == "regex":
            return self._compiler.compile_regex(value)
        if kind == "choice":
            return self._compiler.compile_regex(_choice_regex(value))
        raise ValueError(kind)

    def matcher(self, compiled):
        return self._xgr.GrammarMatcher(compiled)

    def fill(self, matchers: list) -> torch.Tensor:
        bitmask = self._xgr.allocate_token_bitmask(len(matchers), self._vocab_size)
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask)
        else:
            self._batch.batch_fill_next_token_bitmask(matchers, bitmask)
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self._xgr.apply_token_bitmask_inplace(logits, bitmask)  # its own CPU kernel, as vLLM uses it

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


class LLGuidance:
    """llguidance, compact JSON (no flexible whitespace); its parallel fill for a batch."""

    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self._llg, self._fill = llguidance, llguidance.torch
        self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self._executor = llguidance.LLExecutor()
        self._words = (vocab_size + 31) // 32

    def compile(self, kind: str, value: str):
        if kind == "json_schema":
            grammar = self._llg.LLMatcher.grammar_from_json_schema(value, defaults={"whitespace_flexible": False})
        else:
            grammar = self._llg.grammar_from(kind, value)
        error = self._llg.LLMatcher.validate_grammar(grammar, self._tokenizer)
        if error:
            raise ValueError(error)
        return grammar

    def matcher(self, compiled):
        return self._llg.LLMatcher(self._tokenizer, compiled)

    def fill(self, matchers: list) -> torch.Tensor:
        bitmask = torch.empty((len(matchers), self._words), dtype=torch.int32)
        if len(matchers) == 1:
            self._fill.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self._fill.fill_next_token_bitmask_par(self._executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        apply_bits(logits, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class Outlines:
    """outlines_core: a regex index over the vocabulary (JSON schemas become one regex)."""

    name = "outlines_core"

    def __init__(self, tokenizer, vocab_size: int):
        import outlines_core as oc

        self._oc = oc
        self._eos = tokenizer.eos_token_id
        self._vocab = oc.Vocabulary(self._eos, _token_bytes(tokenizer))
        self._vocab_size = vocab_size

    def compile(self, kind: str, value: str):
        if kind == "json_schema":
            regex = self._oc.json_schema.build_regex_from_schema(value, "")
        elif kind == "regex":
            regex = value
        elif kind == "choice":
            regex = _choice_regex(value)
        else:
            raise ValueError(kind)
        return self._oc.Index(regex, self._vocab)

    def matcher(self, compiled):
        return self._oc.Guide(compiled)

    def fill(self, matchers: list) -> torch.Tensor:
        words = (self._vocab_size + 31) // 32
        bitmask = torch.zeros((len(matchers), words), dtype=torch.int32)
        for row, guide in enumerate(matchers):
            guide.write_mask_into(bitmask[row].data_ptr(), words, 4)
        return bitmask

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        apply_bits(logits, bitmask)

    def accept(self, matcher, token: int) -> bool:
        if token == self._eos and matcher.is_finished():
            return True  # its final state allows EOS in the mask, yet it does not advance on it
        if not matcher.accepts_tokens([token]):
            return False
        matcher.advance(token, return_tokens=False)
        return True


def apply_bits(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Brigade's apply for the libraries whose bitmask has the same layout (bit t%32 of word t//32)."""
    apply_bitmask(logits, list(range(logits.shape[0])), bitmask)


def _token_bytes(tokenizer) -> dict[bytes, list[int]]:
    """Each token's bytes (byte-level BPE: each character of a token stands for one byte)."""
    to_byte = {c: b for b, c in _byte_chars().items()}
    special = set(tokenizer.all_special_ids)
    vocab: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in special or any(c not in to_byte for c in token):
            continue
        vocab.setdefault(bytes(to_byte[c] for c in token), []).append(token_id)
    return vocab


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte-to-character table: printable bytes stand for themselves, the others are
    shifted past 255 (transformers 5 no longer exports it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, shift = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shift)
            shift += 1
    return table


LIBRARIES = {"xgrammar": Brigade, "xgrammar_own_apply": XGrammarOwnApply, "llguidance": LLGuidance,
             "outlines_core": Outlines}
