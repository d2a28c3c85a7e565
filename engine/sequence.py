"""A request's token state inside the engine: its ids, sampling settings, status and timings, and
the chunk of its context a step computes."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum, auto
from functools import cached_property


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class FinishReason(str, Enum):
    STOP = "stop"
    LENGTH = "length"
    REPETITION = "repetition"  # a degenerate loop, ended (engine/repetition.py)
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class SamplingParams:
    # 0: the prompt is only scored (prompt_logprobs); the sequence ends once its prompt is
    # computed, with no token sampled (evaluation harnesses' `echo` with `max_tokens: 0`).
    max_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k cut
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    # Each token's randomness is drawn from (seed, token index); see sampling.py.
    seed: int | None = None
    # Keep going past end-of-sequence (benchmarks that need a fixed number of tokens).
    ignore_eos: bool = False
    # The OpenAI API's and vLLM's further fields; each default leaves the answer as it was.
    n: int = 1  # answers from one prefill: the prompt's sequence is forked at its first token
    logprobs: int | None = None  # each token's raw logprob and this many alternatives
    prompt_logprobs: int | None = None  # the same for every prompt token (no prefix-cache hit)
    presence_penalty: float = 0.0  # OpenAI's rule, over the generated tokens only
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)
    min_p: float = 0.0  # sampling: drop tokens under min_p x the best one's probability
    min_tokens: int = 0  # until then, EOS and stop_token_ids are masked and stop strings unchecked
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None  # only the prompt's last N tokens are read (vLLM's)
    guide: object | None = None  # engine.guided.GuideSpec: structured output

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @cached_property  # asked of every row at every step; the fields never change (frozen)
    def plain(self) -> bool:
        """Whether the raw logits' argmax is its token (the batch's one argmax serves it), once
        min_tokens is behind it."""
        return self.greedy and self.raw

    @cached_property
    def draftable(self) -> bool:
        """Whether its token at a drafted position can be found as at its own row: chosen from the raw
        logits or from them plus a logit bias, which is the same at every position (a penalty or a
        guide depends on the tokens before the position; engine/speculation.py)."""
        return (self.repetition_penalty == 1.0 and not self.presence_penalty and not self.frequency_penalty
                and self.guide is None)

    @cached_property
    def raw(self) -> bool:
        """Whether its token is chosen from the raw logits (argmax or a draw), once min_tokens is
        behind it: no penalty, bias or guide changes them."""
        return (self.repetition_penalty == 1.0 and not self.presence_penalty and not self.frequency_penalty
                and not self.logit_bias and self.guide is None)


@dataclass
class Timing:
    """Seconds, measured on the engine's clock (time.monotonic unless the engine is given another)."""

    arrived: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None

    def summary(self, completion_tokens: int) -> dict[str, float | None]:
        def span(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(b - a, 6)

        tpot = None
        if self.first_token is not None and self.finished is not None and completion_tokens > 1:
            tpot = round((self.finished - self.first_token) / (completion_tokens - 1), 6)
        return {
            "queue_s": span(self.arrived, self.admitted),
            "prefill_s": span(self.admitted, self.first_token),
            "ttft_s": span(self.arrived, self.first_token),
            "tpot_s": tpot,
            "engine_s": span(self.arrived, self.finished),
        }


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        seed: int,
        resume_ids: list[int] | None = None,
        batch: bool = False,
        arrived: float | None = None,
        choice: int = 0,
    ):
        self.request_id = request_id
        # Which of the request's n answers this is (SamplingParams.n); its seed is the choice's.
        self.choice = choice
        # The batch lane: served in the rows interactive requests leave, preempted when they need them.
        self.batch = batch
        self.prompt_ids = list(prompt_ids)
        self.params = params
        # The seed actually used: the request's, or one drawn at arrival so that a resumed
        # request keeps its random stream too.
        self.seed = seed
        # Tokens generated before this engine saw the request (a resumed request); the next
        # token's index is len(output_ids).
        self.output_ids: list[int] = list(resume_ids or [])
        self.resumed_tokens = len(self.output_ids)
        self.status = SequenceStatus.WAITING
        # Its keys and values while admitted (engine/kv_cache.SequenceKV), and how many of its
        # context's positions they hold: positions num_computed.. are fed in coming steps.
        self.kv = None
        self.num_computed = 0
        # When admission first passed this sequence over for lack of memory (engine/scheduler.py).
        self.passed_over_at: float | None = None
        self.finish_reason: FinishReason | None = None
        self.timing = Timing() if arrived is None else Timing(arrived)
        # Set by the engine: the text released so far (engine/detokenizer.py), the guide's matcher
        # (None: unguided), and the prompt's logprobs by position as its chunks compute them
        # (None: not asked for, or already sent).
        self.detok = None
        self.matcher = None
        self.prompt_logprobs: dict[int, dict] | None = None
        # Its prompt-lookup drafter (engine/speculation.py), made when it first may draft; the watch
        # on its output for a degenerate loop (engine/repetition.py; None: not watched).
        self.drafter = None
        self.repeats = None

    @property
    def scores_prompt(self) -> bool:
        """Whether every prompt position's logits are wanted (prompt_logprobs not yet sent): its
        prompt is computed whole, never taken from the prefix cache."""
        return self.prompt_logprobs is not None

    @property
    def scores_only(self) -> bool:
        """Whether it takes no token at all (max_tokens 0): its prompt is scored, then it ends."""
        return self.params.max_tokens == 0

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_total_tokens(self) -> int:
        """The KV positions this sequence may ever need: prompt plus every token it may generate."""
        return len(self.prompt_ids) + self.params.max_tokens

    @property
    def uncomputed(self) -> int:
        """Context positions whose keys and values are still to be computed (1 when decoding)."""
        return self.num_tokens - self.num_computed

    def token_ids(self, start: int, end: int) -> list[int]:
        """Context ids start .. end-1, without building the whole context (a decode step needs one)."""
        p = len(self.prompt_ids)
        if start >= p:
            return self.output_ids[start - p:end - p]
        return self.prompt_ids[start:end] + self.output_ids[:max(0, end - p)]

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED


@dataclass
class Chunk:
    """Positions start .. start+length-1 of a sequence's context, computed in this step. A decode
    chunk may carry a draft (engine/speculation.py): tokens guessed to follow its context, fed
    after its last token at the next positions and verified from their logits."""

    seq: Sequence
    start: int
    length: int
    draft: tuple[int, ...] = ()

    @property
    def context_length(self) -> int:
        """The positions of the sequence's own context in the chunk (all but the draft)."""
        return self.length - len(self.draft)

    def ids(self) -> list[int]:
        return self.seq.token_ids(self.start, self.start + self.context_length) + list(self.draft)

    @property
    def samples(self) -> bool:
        """Whether this chunk reaches the end of the context, so its last logits give a token."""
        return self.start + self.context_length == self.seq.num_tokens

    @property
    def every_position(self) -> bool:
        """Whether the pass returns logits for each of its positions (a prompt being scored)."""
        return self.seq.scores_prompt and self.start < len(self.seq.prompt_ids)

    @property
    def decodes(self) -> bool:
        """Whether this chunk feeds one generated token (a decode row), not a piece of a prompt."""
        return self.context_length == 1 and self.start >= len(self.seq.prompt_ids)
