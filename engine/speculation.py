"""Prompt-lookup speculation: draft tokens from a sequence's own context, verified in one pass.

A decoding sequence whose last few tokens (an n-gram, 4 down to 2 tokens) appeared earlier in its
context proposes the tokens that followed them then (vLLM's "ngram" / prompt-lookup decoding):
answers that quote, summarise or edit their prompt repeat long runs of it. Its decode row then
feeds its last token and the draft together, and the pass returns logits for every one of those
positions. Verification keeps draft token i only while it is the token the model takes at that
position; the first miss is replaced by the model's own token, so a step gives 1 to k + 1 tokens
and the text is the model's, token for token, by construction: in the exact default the logits of
a position do not depend on how its pass was cut (engine/batch_invariance.py), so a verified
position has the bits a decode step would have given it.

A sampled row is verified the same way: the token it takes at a position is its own seeded draw
from that position's distribution (engine/sampling.py: token n's randomness comes from (seed, n),
not from a stream), so it is computed for each drafted position and the draft kept while they
agree. The answer is the one the same seed gives without speculation, token for token, and so its
distribution is exactly the model's. A draft token d is kept with probability p(d), the most
rejection sampling keeps of a one-token-certain draft (min(1, p(d) / q(d)) with q(d) = 1), and
unlike rejection sampling the seed's answer does not depend on whether a step drafted.

Only rows whose token comes from their raw logits, or from them plus a logit bias, draft (greedy
or sampled, no penalties, guide or pending min_tokens: SamplingParams.draftable) and that ask no
logprobs; a bias is added to each drafted position's logits as to the row's own (a benchmark that
bans end-of-sequence, as llama.cpp's `ignore_eos` does, drafts as an unbiased row does). The others
decode one
token a step as before. Drafting stops by itself where it does not pay: when more than
`max_decodes` sequences decode (a large batch's pass is already as wide as the machine computes
efficiently; vLLM's n-gram speculation is slower than none at high load), and, per sequence, after
its recent drafts were mostly refused (`min_acceptance` over the last `WINDOW` drafted tokens),
for `pause_steps` steps. In between, a sequence's drafts shorten as fewer of them hold
(`Drafter._length`): a verify pass's cost grows with its rows, and past `long_context` (where
each row's attention is a large part of a step) a sequence drafts one token at most.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from engine.logits_processing import apply_logit_bias
from engine.sampling import choose
from engine.sequence import Chunk, Sequence

if TYPE_CHECKING:
    import torch

WINDOW = 32  # drafted tokens over which a sequence's acceptance is judged


@dataclass(frozen=True)
class SpeculationConfig:
    tokens: int = 2  # draft tokens a sequence may propose per step; 0 turns speculation off
    max_ngram: int = 4
    min_ngram: int = 2
    max_decodes: int = 4  # more sequences decoding than this: none drafts
    min_acceptance: float = 0.3
    # From this context on a sequence drafts one token at most: each drafted row's attention reads
    # the whole context, and a one-stream's longest gaps are its widest verify passes. At a
    # 1,000-token context (default model, 2-core AVX2) a 3-row pass took 1.5 times a one-row step,
    # a 2-row one 1.12 times; with 2 drafts there, the inter-token p99 was 1.5-1.75x llama-server's.
    long_context: int = 512
    pause_steps: int = 32


class Drafter:
    """One sequence's n-gram index over its context, and how its recent drafts fared."""

    def __init__(self, config: SpeculationConfig):
        self.config = config
        self._latest: dict[tuple[int, ...], int] = {}  # n-gram -> where the token after its latest occurrence is
        self._indexed = 0  # n-grams ending before this position are in the index
        self._recent: deque[tuple[int, int]] = deque()  # (drafted, accepted) per verify step
        self._pause = 0  # steps left without drafting

    def propose(self, ids: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the latest earlier occurrence of the context's last
        n-gram (the longest that occurred); [] when none did or the drafter is paused."""
        if self._pause > 0:
            self._pause -= 1
            return []
        cfg = self.config
        end = len(ids)
        # Index the n-grams ending at every position before the last (the last is what is looked up).
        for stop in range(max(self._indexed, cfg.min_ngram), end):
            for n in range(cfg.min_ngram, min(cfg.max_ngram, stop) + 1):
                self._latest[tuple(ids[stop - n:stop])] = stop
        self._indexed = max(self._indexed, end)
        k = min(limit, self._length(end))
        if k <= 0:
            return []
        for n in range(min(cfg.max_ngram, end), cfg.min_ngram - 1, -1):
            after = self._latest.get(tuple(ids[end - n:end]))
            if after is not None:
                return ids[after:after + k]
        return []

    def _length(self, context: int) -> int:
        """How many tokens to draft now, at a context of `context` tokens. A verify pass costs more the more rows it has: on an AVX2
        CPU a 2-row pass of the default model costs about what a 1-row step does (its weights'
        reading is the step), a 5-row one about 2.2 times (measured: docs/benchmarks.md), so with
        acceptance a a 4-token draft gives (1 - a^5) / (1 - a) tokens for 2.2 steps' time and a
        1-token one 1 + a for one step's: at a = 0.3, 0.65x against 1.24x. So a sequence drafts
        `tokens` while its recent drafts mostly hold (and before it has any), 2 while about half
        do, 1 below that (and pauses below `min_acceptance`, in `verified`). A refused long draft
        also costs a stream its longest gap between tokens: past `long_context`, one token at most."""
        if context >= self.config.long_context:
            return min(1, self.config.tokens)
        drafted = sum(d for d, _ in self._recent)
        if drafted < WINDOW // 8:
            return self.config.tokens
        rate = sum(a for _, a in self._recent) / drafted
        if rate >= 0.8:
            return self.config.tokens
        return min(2 if rate >= 0.5 else 1, self.config.tokens)

    def verified(self, drafted: int, accepted: int) -> None:
        """A verify step's outcome; a sequence whose drafts are mostly refused pauses."""
        self._recent.append((drafted, accepted))
        while sum(d for d, _ in self._recent) > WINDOW and len(self._recent) > 1:
            self._recent.popleft()
        total = sum(d for d, _ in self._recent)
        if total >= WINDOW // 2 and sum(a for _, a in self._recent) < self.config.min_acceptance * total:
            self._pause = self.config.pause_steps
            self._recent.clear()


def verify(chunk: Chunk, logits, first: int) -> list[int]:
    """The tokens a drafted decode row takes after `first` (the token its first position gave, as
    any decode row samples it: engine/sampling.py): the model's token after each draft token it
    confirms. `logits` are the row's positions' ([1 + draft, vocab])."""
    seq, draft = chunk.seq, list(chunk.draft)
    if seq.params.logit_bias:  # the drafted positions' logits as the row's own were chosen from
        logits = logits.clone()
        for row in logits[1:]:
            apply_logit_bias(row, seq.params.logit_bias)
    if seq.params.greedy:
        targets = [first] + logits[1:].argmax(dim=-1).tolist()
    else:  # each later position's own seeded draw, while the one before it confirmed its draft token
        targets = [first]
        for ahead in range(1, len(draft) + 1):
            if targets[-1] != draft[ahead - 1]:
                break
            targets.append(choose(logits[ahead], seq, ahead))
    kept = accepted_prefix(draft, targets)
    seq.drafter.verified(len(draft), kept)
    return targets[1:kept + 1]


def accepted_prefix(draft: list[int], targets: list[int]) -> int:
    """How many draft tokens the model confirms: draft[i] is kept while it equals targets[i], the
    model's token at its position (targets has one more entry than draft: the token after them)."""
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return n


def attach_drafts(chunks: list[Chunk], config: SpeculationConfig, context_length: int,
                  drafter_for: Callable[[Sequence], Drafter]) -> None:
    """Give a step's decode rows whose token comes from their raw logits (or those plus a bias) a draft
    to verify, unless
    more than `max_decodes` sequences decode. A draft fits the sequence's cache as it is, its
    max_tokens and the context."""
    decoding = [c for c in chunks if c.decodes]
    if len(decoding) > config.max_decodes:
        return
    for c in decoding:
        seq, p = c.seq, c.seq.params
        if not p.draftable or len(seq.output_ids) < p.min_tokens or p.logprobs is not None:
            continue
        limit = min(seq.kv.capacity, context_length, len(seq.prompt_ids) + p.max_tokens) - c.start - 1
        if limit <= 0:
            continue
        if seq.drafter is None:
            seq.drafter = drafter_for(seq)
        draft = seq.drafter.propose(seq.all_ids, limit)
        if draft:
            c.draft = tuple(draft)
            c.length += len(draft)


class Verifier:
    """Each drafted row's kept tokens after a step (`verify`), and how drafts fare: the
    engine's `stats()` reports the counts, `brigade bench engine` the rates."""

    def __init__(self):
        self.drafted_tokens = 0  # draft tokens verified, and of those, kept
        self.accepted_tokens = 0
        self.verify_steps = 0  # decode rows that carried a draft

    def verify(self, drafted: dict[Sequence, tuple[Chunk, torch.Tensor]], sampled: list[Sequence],
               tokens: list[int]) -> dict[Sequence, list[int]]:
        """The tokens each drafted row takes after the one it sampled."""
        kept: dict[Sequence, list[int]] = {}
        if not drafted:
            return kept
        for seq, token in zip(sampled, tokens):
            if seq in drafted:
                chunk, positions = drafted[seq]
                kept[seq] = verify(chunk, positions, token)
                self.verify_steps += 1
                self.drafted_tokens += len(chunk.draft)
                self.accepted_tokens += len(kept[seq])
        return kept
