"""The engine: requests in, token updates out, one forward pass per step.

    chunks = scheduler.schedule()          # decode tokens and prefill chunks, packed
    logits = runner.forward(chunks)        # one pass; logits of the chunks that end a context
    tokens = sample(logits, sampled)
    updates = self._postprocess(sampled, tokens)

`add_request` and `cancel` may be called from any thread; `step` and `run` belong to one thread.
"""
from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from engine.detokenizer import IncrementalDetokenizer
from engine.kv_allocator import KVAllocator
from engine.kv_cache import KVMemory, KVShape
from engine.model_files import offline
from engine.model_runner import ModelRunner
from engine.placement import Placement, resolve
from engine.prefix_cache import PrefixCache
from engine.sampling import sample
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import FinishReason, SamplingParams, Sequence
from engine.tokenizer import SerializedTokenizer

log = logging.getLogger("brigade.engine")
IDLE_POLL_S = 0.5  # an idle engine thread wakes this often (to notice its stop event, and to prove it lives)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    max_batch: int = 32
    max_wait_ms: float = 10.0
    kv_budget_tokens: int = 32_768
    kv_budget_bytes: int | None = None  # when set, wins over kv_budget_tokens
    max_prefill_tokens: int = 4096  # tokens in one pass while nothing decodes
    prefill_chunk_tokens: int = 64  # prompt tokens in one pass beside decoding streams
    prefix_cache: bool = True
    device: str = "auto"  # engine/placement.py
    dtype: str = "auto"
    fast_max_tokens: int = 64  # mixed precision: passes up to this many tokens use the bf16 copy
    # Deterministic mode: pad each pass's rows and attend one query at a time, so that a token's
    # numbers never depend on what shares its pass (engine/batch_invariance.py): greedy answers
    # the same alone, batched, chunked, resumed. On by default (the exact default).
    batch_invariant: bool = True
    # float32 weights that lie exactly on a GGUF grid are read from it (engine/grid_linear.py).
    grid_weights: bool = True
    admission_patience_s: float = 2.0  # how long a request that does not fit may be passed over
    torch_threads: int = 0  # 0: leave torch's default


@dataclass
class EngineRequest:
    request_id: str
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: str | None = None
    messages: list[dict] | None = None
    prompt_ids: list[int] | None = None
    # Tokens already generated elsewhere; generation continues at index len(resume_ids).
    resume_ids: list[int] = field(default_factory=list)
    batch: bool = False  # the batch lane (engine/scheduler.py): behind interactive work, preemptible


@dataclass
class SequenceUpdate:
    """What one step did to one request: a new token, and/or its end."""

    request_id: str
    index: int | None  # the token's position in the output (None: ended without a new token)
    token_id: int | None
    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0  # on every token update and at the end
    completion_tokens: int = 0  # at the end
    timing: dict | None = None


class RequestRejected(Exception):
    """A request the engine can never serve, with a stable error code for the client."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Engine:
    def __init__(self, model, tokenizer, config: EngineConfig, placement: Placement | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.model = model.eval()
        # One lock per tokenizer, also when engines share it (`brigade bench engine`'s float32 one).
        self.tokenizer = tokenizer if isinstance(tokenizer, SerializedTokenizer) else SerializedTokenizer(tokenizer)
        self.config = config
        self.placement = placement or resolve(config.device, config.dtype)
        mc = model.config
        head_dim = getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads
        self.kv_shape = KVShape(
            layers=mc.num_hidden_layers,
            kv_heads=getattr(mc, "num_key_value_heads", None) or mc.num_attention_heads,
            head_dim=head_dim,
            dtype=self.placement.kv_dtype,
            device=self.placement.device,
        )
        budget = config.kv_budget_tokens
        if config.kv_budget_bytes:
            budget = config.kv_budget_bytes // self.kv_shape.bytes_per_token
        self.kv = KVMemory(budget)
        self.prefix = PrefixCache(self.kv, enabled=config.prefix_cache)
        # Requests' timings and the scheduler's waits read this clock (a test drives it by hand).
        self.clock = clock
        self.scheduler = Scheduler(
            SchedulerConfig(config.max_batch, config.max_wait_ms, config.max_prefill_tokens,
                            config.prefill_chunk_tokens, config.admission_patience_s),
            KVAllocator(self.kv_shape, self.kv, self.prefix), clock,
        )
        self.runner = ModelRunner(model, self.placement, config.fast_max_tokens, config.batch_invariant,
                                  config.grid_weights)
        self.context_length = int(getattr(mc, "max_position_embeddings", 2048))
        self.eos_ids = self._eos_ids()
        self.sequences: dict[str, Sequence] = {}
        self.detoks: dict[str, IncrementalDetokenizer] = {}
        self.tokens_generated = 0
        # When the engine thread last came round its loop (monotonic). Idle, it comes round at
        # least every IDLE_POLL_S; a value much older than that is a wedged thread.
        self.loop_at = time.monotonic()
        # Told each step's decode rows (a step may also carry prompt chunks) before its forward
        # pass, on the engine thread: the worker's metrics take the batch size here. Must be cheap;
        # None: nobody listens.
        self.on_step: Callable[[int], None] | None = None
        self._inbox: list[Sequence] = []
        self._cancels: list[str] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def load(cls, config: EngineConfig, clock: Callable[[], float] = time.monotonic) -> "Engine":
        offline()
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        placement = resolve(config.device, config.dtype)
        path = Path(config.model)
        started = time.monotonic()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=placement.load_dtype, attn_implementation="sdpa")
        model.to(placement.device)
        log.info("event=model_loaded path=%s device=%s dtype=%s seconds=%.1f", path, placement.device,
                 placement.dtype, time.monotonic() - started)
        return cls(model, tokenizer, config, placement, clock)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(source)
        return ids

    # ---- the thread-safe door -----------------------------------------------------------------

    def encode(self, request: EngineRequest) -> list[int]:
        if request.prompt_ids is not None:
            return list(request.prompt_ids)
        if request.messages is not None:
            text = self.tokenizer.apply_chat_template(request.messages, add_generation_prompt=True, tokenize=False)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if request.prompt is not None:
            return self.tokenizer(request.prompt)["input_ids"]
        raise RequestRejected("invalid_request", "a request needs a prompt, messages or prompt_ids")

    def add_request(self, request: EngineRequest) -> int:
        """Queue a request (any thread). Returns its prompt length; raises RequestRejected."""
        prompt_ids = self.encode(request)
        params = request.params
        if not prompt_ids:
            raise RequestRejected("empty_prompt", "the prompt is empty after tokenization")
        need = len(prompt_ids) + params.max_tokens
        limit = min(self.context_length, self.kv.budget_tokens)
        if need > self.context_length or not self.kv.can_ever_fit(need):
            raise RequestRejected(
                "context_overflow",
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) = {need} "
                f"exceeds the {limit} tokens this model and KV budget allow",
            )
        seed = params.seed if params.seed is not None else random.getrandbits(63)
        seq = Sequence(request.request_id, prompt_ids, params, seed, request.resume_ids, batch=request.batch,
                       arrived=self.clock())
        with self._lock:
            if request.request_id in self.sequences or any(s.request_id == seq.request_id for s in self._inbox):
                raise RequestRejected("duplicate_id", f"request {request.request_id!r} is already in the engine")
            self._inbox.append(seq)
        self._wake.set()
        return len(prompt_ids)

    def cancel(self, request_id: str) -> None:
        """Stop a request (any thread): a waiting one never runs, a running one leaves at the next step."""
        with self._lock:
            self._cancels.append(request_id)
        self._wake.set()

    def holds(self, request_id: str) -> bool:
        """Whether the engine still has this request (any thread)."""
        with self._lock:
            return request_id in self.sequences or any(s.request_id == request_id for s in self._inbox)

    def wake(self) -> None:
        """Interrupt an idle `run` loop (to notice its stop event)."""
        self._wake.set()

    # ---- the engine thread -----------------------------------------------------------------------

    def has_work(self) -> bool:
        with self._lock:
            pending = bool(self._inbox or self._cancels)
        return pending or self.scheduler.has_work()

    def step(self) -> list[SequenceUpdate]:
        updates = self._take_inbox()
        chunks = self.scheduler.schedule()
        if not chunks:
            return updates
        if self.on_step is not None:
            self.on_step(sum(c.decodes for c in chunks))
        try:
            logits = self.runner.forward(chunks)
            self.scheduler.computed(chunks)
            sampled = [c.seq for c in chunks if c.samples]
            tokens = sample(logits, sampled)
        except Exception:
            log.exception("event=step_failed chunks=%d decodes=%d", len(chunks), sum(c.decodes for c in chunks))
            return updates + [self._finish(c.seq, FinishReason.ERROR) for c in chunks]
        return updates + self._postprocess(sampled, tokens)

    def run(self, on_updates: Callable[[list[SequenceUpdate]], None], stop: threading.Event) -> None:
        """Step until `stop` is set, handing every step's updates to `on_updates`."""
        while not stop.is_set():
            self.loop_at = time.monotonic()
            updates = self.step()
            if updates:
                on_updates(updates)
            if self.scheduler.running:
                continue
            # Idle, or filling a micro-batch: sleep until the batch deadline or new input.
            wait = self.scheduler.seconds_until_admission() if self.scheduler.waiting else IDLE_POLL_S
            if wait > 0:
                self._wake.wait(wait)
                self._wake.clear()

    def generate(self, requests: list[EngineRequest],
                 on_finished: Callable[["Completion"], None] | None = None) -> dict[str, "Completion"]:
        """Serve a list of requests to completion on the calling thread (library use, tests, bench);
        `on_finished` is told each completion as it ends (a progress bar)."""
        done: dict[str, Completion] = {r.request_id: Completion(r.request_id) for r in requests}
        for r in requests:
            self.add_request(r)
        while any(c.finish_reason is None for c in done.values()):
            for u in self.step():
                done[u.request_id].absorb(u)
                if on_finished is not None and u.finish_reason is not None:
                    on_finished(done[u.request_id])
        return done

    def stats(self) -> dict[str, int]:
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting) + len(self._inbox),
            # Held by sequences; the prefix cache's blocks give way on demand and count apart (as
            # vLLM's cached free blocks do not count as used).
            "kv_used_tokens": self.kv.used_tokens - self.prefix.cached_tokens,
            "kv_budget_tokens": self.kv.budget_tokens,
            "prefix_cached_tokens": self.prefix.cached_tokens,
            "prefix_query_tokens": self.prefix.query_tokens,
            "prefix_hit_tokens": self.prefix.hit_tokens,
            "tokens_generated": self.tokens_generated,
            "preemptions": self.scheduler.preemptions,
        }

    # ---- internals -----------------------------------------------------------------------------

    def _take_inbox(self) -> list[SequenceUpdate]:
        with self._lock:  # inbox to sequences in one step, so that holds() never misses a request
            arrivals, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, []
            self.sequences.update((seq.request_id, seq) for seq in arrivals)
        for seq in arrivals:
            detok = IncrementalDetokenizer(self.tokenizer, seq.prompt_ids, seq.params.stop)
            # A resumed request: replay the tokens already sent, so that text held back at the
            # hand-over (half a character, a possible stop string) is released exactly once.
            for token in seq.output_ids:
                detok.push(token)
            self.detoks[seq.request_id] = detok
            self.scheduler.add(seq)
        updates = []
        for request_id in cancels:
            seq = self.sequences.get(request_id)
            if seq is not None and not seq.is_finished:
                updates.append(self._finish(seq, FinishReason.CANCELLED))
        return updates

    def _postprocess(self, seqs: list[Sequence], tokens: list[int]) -> list[SequenceUpdate]:
        now = self.clock()
        updates = []
        for seq, token in zip(seqs, tokens):
            if seq.timing.first_token is None:
                seq.timing.first_token = now
            seq.output_ids.append(token)
            self.tokens_generated += 1
            detok = self.detoks[seq.request_id]
            reason = None
            if token in self.eos_ids and not seq.params.ignore_eos:
                text, reason = "", FinishReason.STOP
            else:
                text = detok.push(token)
                if detok.stopped:
                    reason = FinishReason.STOP
                elif len(seq.output_ids) >= seq.params.max_tokens or seq.num_tokens >= self.context_length:
                    reason = FinishReason.LENGTH
            if reason is FinishReason.LENGTH or (reason is FinishReason.STOP and not detok.stopped):
                text += detok.flush()
            update = SequenceUpdate(seq.request_id, len(seq.output_ids) - 1, token, text,
                                    prompt_tokens=len(seq.prompt_ids))
            if reason is not None:
                self._finish(seq, reason, update)
            updates.append(update)
        return updates

    def _finish(self, seq: Sequence, reason: FinishReason, update: SequenceUpdate | None = None) -> SequenceUpdate:
        self.scheduler.finish(seq, reason)
        with self._lock:
            self.sequences.pop(seq.request_id, None)
        self.detoks.pop(seq.request_id, None)
        if update is None:
            update = SequenceUpdate(seq.request_id, None, None, "")
        update.finish_reason = reason.value
        update.prompt_tokens = len(seq.prompt_ids)
        update.completion_tokens = len(seq.output_ids)
        update.timing = seq.timing.summary(len(seq.output_ids) - seq.resumed_tokens)
        return update


@dataclass
class Completion:
    """A whole answer gathered from updates (for library use)."""

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    timing: dict | None = None

    def absorb(self, update: SequenceUpdate) -> None:
        self.text += update.text
        if update.token_id is not None:
            self.token_ids.append(update.token_id)
        if update.finish_reason is not None:
            self.finish_reason = update.finish_reason
            self.timing = update.timing
