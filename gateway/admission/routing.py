"""Prefix-aware routing: which worker's own queue a request goes to, or the shared queue.

With one shared queue each turn of a conversation lands on whichever worker is free, and with N
workers its history is prefilled again (N-1)/N of the time. So a request whose prompt begins
with blocks a worker's prefix cache holds (worker_prefixes.py) goes to that worker's own queue,
weighed against its load, as llm-d's and SGLang's routers do:

- each live worker of the chosen version scores the prompt tokens its cache holds, less
  `route_load_tokens` for each request of load it carries (running, waiting in its engine, and
  routed here since its last heartbeat);
- the best score wins (`prefix_hit`), unless that worker carries more than `route_imbalance`
  requests beyond the least loaded: then the least loaded (`load_fallback`), as it does when
  its own score wins the trade;
- a prompt no worker holds any block of goes to the shared queue (`miss`), taken by whichever
  worker is free, as before routing.
An idle worker takes a routed request its worker did not take in time (workers/stealing.py).
Routing happens inside the version the catalog chose; batch lines keep the shared queue, and
anything unknown (no tokenizer, an error, one worker) keeps it too: routing never refuses.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from cache.query import PromptRenderer
from engine.prefix_index import BLOCK_TOKENS, block_keys
from gateway import metrics
from gateway.admission.catalog import Catalog, Choice
from gateway.admission.worker_prefixes import WorkerPrefixes
from gateway.request import Generate
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")

PIECES_REMEMBERED = 2_048  # tokenized pieces of chats (system prompts, turns) a version's tokenizer keeps


@dataclass(frozen=True)
class Destination:
    worker: str | None  # the instance whose own queue, or None: the shared queue
    decision: str  # prefix_hit | load_fallback | miss | shared (routing off, a batch line, one worker) | unknown
    matched_tokens: int = 0


def choose(loads: dict[str, int], matched: dict[str, int], load_tokens: int, imbalance: int,
           block_tokens: int = BLOCK_TOKENS) -> Destination:
    """Pure: the live workers' loads and the blocks each holds of the prompt -> where it goes."""
    held = {w: n for w, n in matched.items() if n and w in loads}
    if not loads or not held:
        return Destination(None, "miss")
    least = min(loads, key=lambda w: (loads[w], w))

    def score(w: str) -> int:
        return held.get(w, 0) * block_tokens - load_tokens * loads[w]

    best = max(held, key=lambda w: (score(w), -loads[w], w))
    if loads[best] - loads[least] > imbalance or score(least) > score(best):
        return Destination(least, "load_fallback", held.get(least, 0) * block_tokens)
    return Destination(best, "prefix_hit", held[best] * block_tokens)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def worker_load(status: dict) -> int:
    return int(status.get("running", 0)) + int(status.get("waiting", 0))


class PromptTokens:
    """A version's tokenizer and chat template, one call at a time: the prompt's token ids as the
    engine's `encode` makes them.

    A chat's rendered text is cut at the tokenizer's added tokens (`<|im_start|>`, `<|im_end|>`),
    which a fast tokenizer splits out before anything else, so each piece between them tokenizes
    alone to the same ids it has inside the whole text. Pieces are remembered (LRU): a conversation's
    next turn, or another chat of a tenant with the same system prompt, tokenizes only its new
    messages. A long prompt tokenized whole costs about 2 ms for 1,300 tokens on the 2-core AVX2
    machine, most of a routing decision (docs/scaling.md); its remembered pieces cost nothing."""

    def __init__(self, folder, remembered: int = PIECES_REMEMBERED):
        self.renderer = PromptRenderer(folder)
        self._lock = threading.Lock()
        self._pieces: OrderedDict[str, list[int]] = OrderedDict()
        self._remembered = remembered
        tokenizer = self.renderer.tokenizer
        added = tokenizer.get_added_vocab() if tokenizer is not None else {}
        self._added = {text: added[text] for text in added if text}
        self._split = (re.compile("(" + "|".join(re.escape(t) for t in sorted(self._added, key=len, reverse=True)) + ")")
                       if self._added else None)

    def ids(self, cmd: Generate) -> list[int] | None:
        tokenizer = self.renderer.tokenizer
        if tokenizer is None:
            return None
        with self._lock:
            if cmd.prompt_ids is not None:
                return list(cmd.prompt_ids)
            if cmd.messages is not None:
                text = self.renderer.render([m.model_dump(exclude_none=True) for m in cmd.messages], cmd.tools)
                return self.encode(text)
            return tokenizer(cmd.prompt)["input_ids"] if cmd.prompt is not None else None

    def encode(self, text: str) -> list[int]:
        """`tokenizer(text, add_special_tokens=False)`'s ids, piece by remembered piece."""
        if self._split is None:
            return self.renderer.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids: list[int] = []
        for piece in self._split.split(text):
            if not piece:
                continue
            if piece in self._added:
                ids.append(self._added[piece])
                continue
            known = self._pieces.get(piece)
            if known is None:
                known = self.renderer.tokenizer(piece, add_special_tokens=False)["input_ids"]
                self._pieces[piece] = known
                if len(self._pieces) > self._remembered:
                    self._pieces.popitem(last=False)
            else:
                self._pieces.move_to_end(piece)
            ids.extend(known)
        return ids


class PrefixRouter:
    def __init__(self, settings: Settings, catalog: Catalog, index: WorkerPrefixes,
                 running: Callable[[str], bool] = lambda rid: True):
        self.settings = settings
        self.catalog = catalog
        self.index = index
        self.running = running  # whether a request this gateway queued has not ended yet (its reply route)
        self._statuses: list[dict] = []
        # Requests this gateway routed to each worker since its last heartbeats: counted in its load
        # while they run (one that ended already is in neither the heartbeat nor the count).
        self._routed: dict[str, list[str]] = {}
        self._tokens: dict[str, asyncio.Future[PromptTokens]] = {}

    def observe(self, statuses: list[dict]) -> None:
        """Each second's heartbeats (the load monitor's): loads, and workers gone from the index."""
        self._statuses = statuses
        self._routed.clear()
        live = {s.get("instance") for s in statuses}
        for instance in [i for i in self.index.held if i not in live]:
            self.index.forget(instance)
        if self.settings.routing == "prefix" and _in_event_loop():
            # A version with two workers routes: its tokenizer loads now, not in its first request's way.
            served = Counter((s.get("model"), s.get("version") or "") for s in statuses if not s.get("draining"))
            for (model, version), n in served.items():
                if n > 1 and model:
                    self._loading(self.catalog.folder(model, version))

    async def preload(self) -> None:
        """At start, before any request: the default model's stable version's tokenizer, so that
        the first burst does not wait for it (a chaos run's first requests waited seconds)."""
        if self.settings.routing != "prefix":
            return
        model = self.catalog.default_model
        choice = self.catalog.choose(model, "", None, None, None)
        try:
            await self._loading(self.catalog.folder(model, choice.version))
        except Exception as exc:  # its first routed request tries again, or keeps the shared queue
            self._tokens.pop(str(self.catalog.folder(model, choice.version)), None)
            log.warning("event=route_tokenizer_not_loaded model=%s error=%r", model, exc)

    def _routed_running(self, instance: str) -> int:
        return sum(1 for rid in self._routed.get(instance, ()) if self.running(rid))

    def loads(self, choice: Choice) -> dict[str, int]:
        return {s["instance"]: worker_load(s) + self._routed_running(s["instance"]) for s in self._statuses
                if "instance" in s and s.get("model") == choice.model and (s.get("version") or "") == choice.version
                and not s.get("draining")}

    async def route(self, cmd: Generate, choice: Choice, lane: str, rid: str = "") -> Destination:
        """Where the request goes; never raises (anything unknown keeps the shared queue)."""
        try:
            routed = await self._route(cmd, choice, lane)
        except Exception as exc:
            log.warning("event=route_failed client_id=%s error=%r", cmd.id, exc)
            routed = Destination(None, "unknown")
        metrics.ROUTING_DECISIONS.labels(choice.model, choice.version, routed.decision).inc()
        if routed.worker is not None:
            self._routed.setdefault(routed.worker, []).append(rid)
        return routed

    async def _route(self, cmd: Generate, choice: Choice, lane: str) -> Destination:
        if self.settings.routing != "prefix" or lane != "interactive" or cmd.params.truncate_prompt_tokens:
            return Destination(None, "shared")
        loads = self.loads(choice)
        if len(loads) < 2:
            return Destination(None, "shared")
        started = time.perf_counter()
        try:
            tokens = await self._tokens_for(choice)
            ids = await asyncio.to_thread(tokens.ids, cmd)
        except Exception as exc:  # a template that cannot render this input: the shared queue
            log.debug("event=route_unknown client_id=%s error=%r", cmd.id, exc)
            return Destination(None, "unknown")
        if not ids:
            return Destination(None, "unknown")
        chain = [f"{k:016x}" for k in block_keys(ids)]
        routed = choose(loads, self.index.matched(chain), self.settings.route_load_tokens, self.settings.route_imbalance)
        metrics.ROUTING_SECONDS.labels(choice.model, choice.version).observe(time.perf_counter() - started)
        return routed

    async def _tokens_for(self, choice: Choice) -> PromptTokens:
        """The version's tokenizer, loaded once: every request that comes while it loads awaits the
        same load (a burst that each started its own held every enqueue for seconds)."""
        folder = self.catalog.folder(choice.model, choice.version)
        try:
            return await asyncio.shield(self._loading(folder))
        except Exception:
            self._tokens.pop(str(folder), None)  # the next request tries again
            raise

    def _loading(self, folder) -> asyncio.Future[PromptTokens]:
        key = str(folder)
        if key not in self._tokens:
            self._tokens[key] = asyncio.ensure_future(asyncio.to_thread(PromptTokens, folder or "/nonexistent"))
        return self._tokens[key]
