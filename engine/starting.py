"""The start of a sequence, in one place (the counterpart of engine/finishing.py): what a new
sequence needs before its first step.

Its detokenizer (stop strings, special tokens, the stop string kept or cut), its guide's
matcher (engine/guided.py) and its loop watch (engine/repetition.py; none with ignore_eos, which
asks for exactly max_tokens) are made; a resumed sequence (tokens it generated on another worker, or
before a preemption) replays those tokens into them, so that text held back at the hand-over (half
a character, a possible stop string) is released exactly once and its grammar goes on where it
was; a request that asked for its prompt's logprobs gets a place to gather them (its first choice,
before its first token).
"""
from __future__ import annotations

from engine.detokenizer import IncrementalDetokenizer
from engine.repetition import RepeatWatch
from engine.sequence import Sequence
from engine.tokenizer import SerializedTokenizer


class Starter:
    def __init__(self, tokenizer: SerializedTokenizer, vocab_width: int, repetition_span: int = 0):
        self.tokenizer = tokenizer
        self.vocab_width = vocab_width
        self.repetition_span = repetition_span  # 0: no sequence is watched for a loop
        self.guides = None  # engine/guided.Guides, made when a request first brings a guide

    def start(self, seq: Sequence) -> None:
        p = seq.params
        seq.detok = IncrementalDetokenizer(self.tokenizer, seq.prompt_ids, p.stop, p.skip_special_tokens,
                                           p.include_stop_str_in_output)
        if p.guide is not None:
            seq.matcher = self._guides().start(p.guide)
        seq.repeats = RepeatWatch(self.repetition_span) if self.repetition_span and not p.ignore_eos else None
        replayed: list[int] = []
        for n, token in enumerate(seq.output_ids, start=1):
            seq.detok.push(token, check_stop=n >= p.min_tokens)
            if seq.matcher is not None:
                seq.matcher.accept(token)
            if seq.repeats is not None:
                replayed.append(token)
                seq.repeats.took(replayed)
        if p.prompt_logprobs is not None and seq.choice == 0 and not seq.output_ids:
            seq.prompt_logprobs = {}

    def _guides(self):
        """The engine's guides, made when a request first brings a guide: only engines that meet
        one load the grammar library."""
        if self.guides is None:
            from engine.guided import Guides

            with self.tokenizer.exclusive() as tokenizer:
                self.guides = Guides(tokenizer, self.vocab_width)
        return self.guides
