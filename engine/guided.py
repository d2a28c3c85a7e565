"""Guided decoding: the one module that knows the grammar library (xgrammar).

A request may ask that its answer follow a JSON schema, be any JSON object, match a regex, be one
of a list of choices or follow a grammar. Before sampling each step, every guided row of the
logits gets -inf on the tokens its grammar forbids now; after sampling, its matcher accepts the
token. xgrammar was chosen on this CPU for the cheapest mask per token (docs/guided.md); nothing
else in Brigade imports it, so changing library means changing this file.

JSON answers are compact (no free whitespace, "," and ":" with no spaces): a small model sampling
at temperature 1.0 would otherwise wander in spaces and newlines until max_tokens.
"""
from __future__ import annotations

import functools
import json
import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import xgrammar as xgr
from jsonschema import SchemaError, validators

from engine.tokenizer import SerializedTokenizer

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
CHECK_CACHE = 1024  # validated specs kept for the gateway (tokenizer-free grammars, a few KB each)
COMPILED_CACHE = 256  # compiled grammars kept per engine (token tables: tens to hundreds of KB each)
# The JSON schema keywords xgrammar enforces (or that do not constrain the value). Others (not,
# allOf, if/then/else, uniqueItems, multipleOf, patternProperties, ...) it would ignore, and an
# answer could then break the schema: refused instead, so "strict" means the answer validates.
SCHEMA_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "anyOf", "oneOf", "$ref", "$defs", "definitions", "pattern", "format",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "strict", "nullable",
})
# Shares of forbidden tokens between which a row's mask is applied by torch's index, not numpy's
# masked write (apply_bitmask).
MIXED_MASK = (0.2, 0.8)
_COMPACT = {"any_whitespace": False, "separators": (",", ":")}
_NATIVE_PREFIX = re.compile(r"^\[[\d:]+\] \S+\.cc:\d+: ")  # "[14:35:32] /project/cpp/x.cc:94: "


@dataclass(frozen=True)
class GuideSpec:
    """What an answer must follow. `kind` and `value`:
    json_schema: the schema as JSON text (strict: the answer validates against it);
    json_object: any JSON object (value "");
    regex: the regex (xgrammar's syntax: no lookaround, no backreferences);
    choice: a JSON list of strings, the answer is exactly one of them;
    grammar: an EBNF grammar (GBNF style, `root ::= ...`) when the text contains `::=`, else Lark
    (`start: ...`)."""

    kind: str
    value: str = ""


class GuideError(ValueError):
    """A spec the client got wrong; `reason` is one human line (the gateway's 400 says it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def check(spec: GuideSpec) -> None:
    """Raise GuideError unless `spec` can guide an answer. No tokenizer: cheap, cached by spec."""
    _grammar(spec)


@functools.lru_cache(maxsize=CHECK_CACHE)
def _grammar(spec: GuideSpec) -> xgr.Grammar:
    """The tokenizer-free grammar of `spec` (an invalid spec raises, and is not cached)."""
    try:
        if spec.kind == "json_schema":
            return xgr.Grammar.from_json_schema(_checked_schema(spec.value), strict_mode=True, **_COMPACT)
        if spec.kind == "json_object":
            # Not strict: strict mode would forbid every property of an object schema that names none.
            return xgr.Grammar.from_json_schema('{"type": "object"}', strict_mode=False, **_COMPACT)
        if spec.kind == "regex":
            return xgr.Grammar.from_regex(spec.value)
        if spec.kind == "choice":
            return xgr.Grammar.from_ebnf("root ::= " + " | ".join(_ebnf_string(c) for c in _choices(spec.value)))
        if spec.kind == "grammar":
            if not spec.value.strip():
                raise GuideError("the grammar is empty")
            if "::=" in spec.value:
                return xgr.Grammar.from_ebnf(spec.value)
            return xgr.Grammar.from_lark(spec.value)
    except RuntimeError as exc:  # xgrammar's parse errors: keep the message, drop its source location
        line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GuideError(f"invalid {spec.kind}: {_NATIVE_PREFIX.sub('', line)}") from None
    raise GuideError(f"unknown guide kind {spec.kind!r} (one of {', '.join(KINDS)})")


def _checked_schema(text: str) -> str:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GuideError(f"the JSON schema is not JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise GuideError("the JSON schema must be a JSON object")
    try:
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise GuideError(f"invalid JSON schema at {where}: {exc.message}") from None
    _refuse_unsupported(schema, "#")
    return text


def _refuse_unsupported(node, where: str) -> None:
    """Walk every subschema; raise on a keyword the library would silently ignore."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            _refuse_unsupported(item, f"{where}/{i}")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key not in SCHEMA_KEYWORDS:
            raise GuideError(f"unsupported JSON schema keyword {key!r} at {where}")
        if key in ("properties", "$defs", "definitions"):
            for name, sub in value.items():
                _refuse_unsupported(sub, f"{where}/{key}/{name}")
        elif key in ("items", "prefixItems", "anyOf", "oneOf", "additionalProperties"):
            _refuse_unsupported(value, f"{where}/{key}")


def _choices(value: str) -> list[str]:
    try:
        choices = json.loads(value)
    except json.JSONDecodeError:
        raise GuideError("choice must be a JSON list of strings") from None
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise GuideError("choice must be a JSON list of strings")
    if not choices or not any(choices):
        raise GuideError("choice needs at least one non-empty string")
    return choices


def _ebnf_string(text: str) -> str:
    # A JSON string literal is an EBNF one: quotes, backslashes and control characters escaped.
    return json.dumps(text, ensure_ascii=False)


class Matcher:
    """One request's place in its grammar."""

    def __init__(self, matcher: xgr.GrammarMatcher, guides: "Guides"):
        self._matcher = matcher
        self._guides = guides
        self._done: bool | None = None  # worked out on demand, forgotten at each token

    def accept(self, token_id: int) -> bool:
        """Advance by `token_id`; False (and no move) if the grammar did not allow it."""
        self._done = None
        return self._matcher.accept_token(token_id)

    @property
    def done(self) -> bool:
        """The answer is complete: EOS was accepted, or nothing but EOS is allowed now."""
        if self._matcher.is_terminated():
            return True
        if not self._matcher.is_completed():
            return False
        if self._done is None:  # complete, but it may go on ("[a-z]+" after "abc"): ask the mask
            self._done = self._guides.only_stop_allowed(self)
        return self._done


class Guides:
    """The engine's guides: the tokenizer's token table, compiled grammars (LRU), the batch mask."""

    def __init__(self, tokenizer, vocab_size: int, cache_size: int = COMPILED_CACHE):
        """`vocab_size` is the width of the model's logits (ids past the tokenizer's are masked)."""
        if isinstance(tokenizer, SerializedTokenizer):  # the engine's: xgrammar needs the real one
            with tokenizer.exclusive() as inner:
                self._info = xgr.TokenizerInfo.from_huggingface(inner, vocab_size=vocab_size)
        else:
            self._info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        # One bound on compiled grammars (ours); the library's own cache is off.
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)
        self._batch = xgr.BatchGrammarMatcher(max_threads="auto")
        self._compiled: OrderedDict[GuideSpec, xgr.CompiledGrammar] = OrderedDict()
        self._cache_size = cache_size
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._stop_ids = list(self._info.stop_token_ids)
        # The row of a matcher that has accepted EOS: xgrammar refuses to fill one, and it may only
        # stop (an engine that masks a finished row by mistake must not get free tokens).
        self._stop_only = torch.zeros((self.words,), dtype=torch.int32)
        for t in self._stop_ids:
            self._stop_only[t // 32] |= _bit(t % 32)

    def start(self, spec: GuideSpec) -> Matcher:
        """A matcher at the start of `spec`'s grammar. Raises GuideError on an invalid spec."""
        compiled = self._compiled.get(spec)
        if compiled is None:
            compiled = self._compiler.compile_grammar(_grammar(spec))
            self._compiled[spec] = compiled
            if len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
        else:
            self._compiled.move_to_end(spec)
        return Matcher(xgr.GrammarMatcher(compiled), self)

    def fill(self, matchers: list[Matcher], rows: list[int] | None = None, batch: int | None = None) -> torch.Tensor:
        """An int32 bitmask [batch, ceil(vocab/32)]: row rows[i] says what matchers[i] allows (bit
        t%32 of word t//32 set: allowed); other rows allow everything."""
        rows = list(range(len(matchers))) if rows is None else rows
        bitmask = xgr.allocate_token_bitmask(batch or len(matchers), self.vocab_size)  # all allowed
        live, live_rows = [], []
        for m, row in zip(matchers, rows):
            if m._matcher.is_terminated():
                bitmask[row] = self._stop_only
            else:
                live.append(m._matcher)
                live_rows.append(row)
        if len(live) == 1:  # the batch call's own cost is about the fill's at batch 1
            live[0].fill_next_token_bitmask(bitmask, live_rows[0])
        elif live:
            self._batch.batch_fill_next_token_bitmask(live, bitmask, live_rows)
        return bitmask

    def mask(self, logits: torch.Tensor, rows: list[int], matchers: list[Matcher]) -> None:
        """In place: logits[rows[i], t] = -inf for each token t that matchers[i] forbids now."""
        if not matchers:
            return
        apply_bitmask(logits, rows, self.fill(matchers, rows, logits.shape[0]))

    def only_stop_allowed(self, matcher: Matcher) -> bool:
        allowed = ~_forbidden(self.fill([matcher]), self.vocab_size)[0]
        allowed[self._stop_ids] = False
        return not allowed.any()


def _bit(i: int) -> int:
    """Bit i of an int32 word as a signed value (bit 31 is the sign)."""
    return (1 << i) - (1 << 32) * (i == 31)


def _forbidden(bitmask: torch.Tensor, vocab_size: int) -> np.ndarray:
    """Booleans [rows, vocab], True where a bit is 0. numpy's unpackbits and a masked write cost
    about 2.5x less here than xgrammar's own CPU apply kernel (docs/guided.md); the bytes are
    inverted before unpacking, 8x fewer than the booleans."""
    return np.unpackbits(~bitmask.numpy().view(np.uint8), axis=1, bitorder="little").view(np.bool_)[:, :vocab_size]


def apply_bitmask(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> None:
    """-inf in logits[row] wherever bitmask[row] has a 0 bit, for each of `rows`.

    numpy's masked write (copyto) branches per token: about twice as cheap as torch's boolean index
    when nearly all tokens are forbidden (JSON structure, choices) or nearly all allowed (inside a
    string), but about twice as dear when the two are mixed (a character-class regex), where torch's
    index is used instead (docs/guided.md)."""
    forbidden = _forbidden(bitmask[rows], logits.shape[1])
    numpy_ok = logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous()
    for i, row in enumerate(rows):
        share = np.count_nonzero(forbidden[i]) / forbidden.shape[1]
        if numpy_ok and not MIXED_MASK[0] < share < MIXED_MASK[1]:
            np.copyto(logits[row].numpy(), -np.inf, where=forbidden[i])
        else:
            logits[row][torch.from_numpy(forbidden[i]).to(logits.device)] = float("-inf")  # a view: in place
