"""The engine: requests in, token updates out, one forward pass per step.

    chunks = scheduler.schedule()          # decode tokens and prefill chunks, packed
    attach_drafts(chunks, ...)             # prompt-lookup drafts on rows sampled from raw logits (speculation.py)
    logits = runner.forward(chunks)        # one pass; logits of the chunks that end a context
    tokens = sample(logits, sampled)
    updates = outputs.process(sampled, tokens, ...)   # tokens into updates; ends by the finisher

A request with n answers is one sequence until its first token, then n (engine/choices.py).
`add_request` and `cancel` may be called from any thread (a request is read at the door,
engine/engine_request.py, and queued in the inbox, engine/inbox.py); `step` and `run` belong to
one thread. Every end of a sequence, whatever its reason, is the finisher's (engine/finishing.py).
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from engine import checkpoint
from engine.engine_request import EngineRequest, RequestReader, RequestRejected
from engine.finishing import Finisher
from engine.inbox import RequestInbox
from engine.kv_allocator import KVAllocator
from engine.kv_cache import KVMemory, KVShape
from engine.logprobs import TokenTexts, token_logprobs
from engine.model_files import offline
from engine.model_runner import ModelRunner
from engine.output_processor import OutputProcessor
from engine.outputs import Completion, SequenceUpdate
from engine.placement import Placement, resolve
from engine.prefix_cache import PrefixCache
from engine.prefix_index import PrefixChanges
from engine.sampling import sample
from engine.sampling_rows import sampling_rows
from engine.scheduler import Scheduler, SchedulerConfig
from engine.sequence import Sequence, SequenceStatus
from engine.speculation import Drafter, SpeculationConfig, Verifier, attach_drafts
from engine.starting import Starter
from engine.tokenizer import SerializedTokenizer, read_tokenizer

__all__ = ["Completion", "Engine", "EngineConfig", "EngineRequest", "RequestRejected", "SequenceUpdate"]

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
    # The build caches: the kernels' (engine/kernels.py) and the packed grids' (engine/grid_store.py).
    # Empty: each one's default folder under ~/.cache/brigade.
    kernel_dir: str = ""
    grid_dir: str = ""
    admission_patience_s: float = 2.0  # how long a request that does not fit may be passed over
    torch_threads: int = 0  # 0: leave torch's default
    # Prompt-lookup speculation (engine/speculation.py): draft tokens a plain greedy sequence may
    # have verified per step; 0 turns it off. Only where passes are batch-invariant (the same text).
    speculative_tokens: int = 2  # ops/core/settings.py says why 2
    # An answer whose last this many tokens are one unit going round ends "repetition"
    # (engine/repetition.py); 0: none is cut.
    repetition_stop_tokens: int = 64


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
        kernel_dir, grid_dir = (Path(folder) if folder else None for folder in (config.kernel_dir, config.grid_dir))
        self.runner = ModelRunner(model, self.placement, config.fast_max_tokens, config.batch_invariant,
                                  config.grid_weights, kernel_dir, grid_dir)
        self.context_length = int(getattr(mc, "max_position_embeddings", 2048))
        self.eos_ids = self._eos_ids()
        self.vocab_width = int(self.runner.primary.head.shape[0])  # the logits' width
        self.reader = RequestReader(self.tokenizer, self.vocab_width, self.context_length, self.kv)
        self.inbox = RequestInbox()
        self.finisher = Finisher(self.scheduler, self.inbox, clock)
        self.token_texts = TokenTexts(self.tokenizer)
        self.outputs = OutputProcessor(self.finisher, self.token_texts, self.eos_ids, self.context_length, clock)
        # A new sequence's detokenizer, guide and loop watch.
        self.starter = Starter(self.tokenizer, self.vocab_width, config.repetition_stop_tokens)
        self.speculation = (SpeculationConfig(tokens=config.speculative_tokens)
                            if config.speculative_tokens > 0 and self.runner.batch_invariant else None)
        self.verifier = Verifier()  # drafts checked against the step's own tokens, and counted
        # A sequence's draft source, made when it first may draft (a test gives drafts it chose).
        self.drafter_for: Callable[[Sequence], Drafter] = lambda seq: Drafter(self.speculation)
        self.prefill_tokens = 0  # prompt positions computed by forward passes
        # When the engine thread last came round its loop (monotonic). Idle, it comes round at
        # least every IDLE_POLL_S; a value much older than that is a wedged thread.
        self.loop_at = time.monotonic()
        # Told each step's decode rows (a step may also carry prompt chunks) before its forward
        # pass, on the engine thread: the worker's metrics take the batch size here. Must be cheap;
        # None: nobody listens.
        self.on_step: Callable[[int], None] | None = None
        # Told the requests whose context starts computing in this step (a first prefill chunk, or
        # a recompute after preemption), before the forward pass, on the engine thread: from here on
        # a crash may be the request's doing (the worker's claim counts it). None: nobody listens.
        self.on_started: Callable[[set[str]], None] | None = None

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def load(cls, config: EngineConfig, clock: Callable[[], float] = time.monotonic,
             reference: bool = False) -> "Engine":
        """The engine over the model folder `config.model`: read by engine/checkpoint.py where it
        can (a plain Llama), else by transformers (`reference=True` always: tests and benches that
        compare with transformers' own `generate` need its model)."""
        offline()
        if config.torch_threads > 0:
            torch.set_num_threads(config.torch_threads)
        placement = resolve(config.device, config.dtype)
        path = Path(config.model)
        started = time.monotonic()
        tokenizer = read_tokenizer(path)
        model = None if reference else checkpoint.read(path, placement.load_dtype, placement.device)
        if model is None:
            model = checkpoint.transformers_model(path, placement.load_dtype, placement.device)
        log.info("event=model_loaded path=%s device=%s dtype=%s reader=%s seconds=%.1f", path, placement.device,
                 placement.dtype, "brigade" if isinstance(model, checkpoint.Checkpoint) else "transformers",
                 time.monotonic() - started)
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
        """The prompt's token ids as the engine reads them (engine/engine_request.py)."""
        return self.reader.encode(request)

    def add_request(self, request: EngineRequest) -> int:
        """Queue a request (any thread). Returns its prompt length; raises RequestRejected."""
        group = self.reader.read(request, self.clock)
        self.inbox.put(group)
        return len(group.prompt_ids)

    def cancel(self, request_id: str) -> None:
        """Stop a request's every choice (any thread): waiting, it never runs; running, it leaves."""
        self.inbox.cancel(request_id)

    def holds(self, request_id: str) -> bool:
        """Whether the engine still has this request (any thread)."""
        return self.inbox.holds(request_id)

    def wake(self) -> None:
        """Interrupt an idle `run` loop (to notice its stop event)."""
        self.inbox.ring()

    # ---- the engine thread -----------------------------------------------------------------------

    def has_work(self) -> bool:
        return self.inbox.pending() or self.scheduler.has_work()

    def step(self) -> list[SequenceUpdate]:
        updates = self._take_inbox()
        chunks = self.scheduler.schedule()
        if not chunks:
            return updates
        if self.speculation is not None:
            attach_drafts(chunks, self.speculation, self.context_length, self.drafter_for)
        if self.on_step is not None:
            self.on_step(sum(c.decodes for c in chunks))
        if self.on_started is not None:
            started = {c.seq.request_id for c in chunks if c.start == 0}
            if started:
                self.on_started(started)
        try:
            logits = self.runner.forward(chunks)
            self.scheduler.computed(chunks)
            self.prefill_tokens += sum(max(0, min(c.start + c.length, len(c.seq.prompt_ids)) - c.start) for c in chunks)
            sampled, logits, drafted = sampling_rows(chunks, logits, self.token_texts, self._fork)
            tokens = sample(logits, sampled, self.eos_ids, self.starter.guides)
            logprobs = token_logprobs(logits, sampled, tokens, self.token_texts)
            kept = self.verifier.verify(drafted, sampled, tokens)
        except Exception:
            log.exception("event=step_failed chunks=%d decodes=%d", len(chunks), sum(c.decodes for c in chunks))
            return updates + self.finisher.fail([c.seq.request_id for c in chunks])
        # A prompt only scored ends where a token would have been sampled: its scores are complete.
        scored = [self.outputs.prompt_scored(c.seq) for c in chunks if c.samples and c.seq.scores_only]
        return updates + scored + self.outputs.process(sampled, tokens, logprobs, kept)

    def run(self, on_updates: Callable[[list[SequenceUpdate]], None], stop: threading.Event,
            on_turn: Callable[[], None] | None = None) -> None:
        """Step until `stop` is set, handing every step's updates to `on_updates`; `on_turn` is
        called on every turn of the loop, idle or not (on this thread)."""
        while not stop.is_set():
            self.loop_at = time.monotonic()
            updates = self.step()
            if updates:
                on_updates(updates)
            if on_turn is not None:
                on_turn()
            if self.scheduler.running:
                continue
            # Idle, or filling a micro-batch: sleep until the batch deadline or new input.
            wait = self.scheduler.seconds_until_admission() if self.scheduler.waiting else IDLE_POLL_S
            if wait > 0:
                self.inbox.wait(wait)

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
            "waiting": len(self.scheduler.waiting) + self.inbox.arrivals_waiting,
            # Held by sequences; the prefix cache's blocks give way on demand and count apart (as
            # vLLM's cached free blocks do not count as used).
            "kv_used_tokens": self.kv.used_tokens - self.prefix.cached_tokens,
            "kv_budget_tokens": self.kv.budget_tokens,
            "prefix_cached_tokens": self.prefix.cached_tokens,
            "prefix_query_tokens": self.prefix.query_tokens,
            "prefix_hit_tokens": self.prefix.hit_tokens,
            "tokens_generated": self.tokens_generated,
            "prefill_tokens": self.prefill_tokens,
            "preemptions": self.scheduler.preemptions,
            "spec_drafted_tokens": self.verifier.drafted_tokens,
            "spec_accepted_tokens": self.verifier.accepted_tokens,
            "spec_verify_steps": self.verifier.verify_steps,
        }

    def watch_prefixes(self) -> None:
        """Keep a journal of the prefix cache's stored and evicted blocks (a worker reports them)."""
        self.prefix.index.watch()

    def prefix_changes(self) -> PrefixChanges:
        """The prefix cache's changes since the last call; on the engine's thread (its callbacks)."""
        return self.prefix.index.changes()

    @property
    def tokens_generated(self) -> int:
        """Tokens taken by sequences since the engine was made (resumed ones not counted)."""
        return self.outputs.tokens_generated

    # ---- internals -----------------------------------------------------------------------------

    def _take_inbox(self) -> list[SequenceUpdate]:
        arrivals, cancels = self.inbox.take()
        for group in arrivals:
            for seq in group.live:
                self.starter.start(seq)
                self.scheduler.add(seq)
        updates = []
        for group in cancels:
            updates += self.finisher.cancel(group)
        return updates

    def _fork(self, seq: Sequence) -> list[Sequence]:
        """A request's further choices at its first token, started and scheduled: those running now."""
        running = []
        for child in self.inbox.get(seq.request_id).fork(seq):
            self.starter.start(child)
            self.scheduler.fork(seq, child)
            if child.status is SequenceStatus.RUNNING:  # else it waits, and is prefilled later
                running.append(child)
        return running
