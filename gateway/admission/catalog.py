"""The models this gateway can route to, and which version each request gets.

A snapshot of the registry (ops/rollout/registry.py) kept in memory: reloaded whenever its revision
number moves (polled every registry_poll_s, one GET), so a route change reaches this gateway
within a fraction of a second and is applied whole. Beside it, the versions live workers say
they serve (their heartbeats, read by the load monitor each second): a model is known when it is
registered or when a live worker serves it unregistered (a worker started on a folder with an
empty registry, whose version is "").

Choosing a version, in order: a version the request pins (`model: "name@v2"`); the model's route
(its shares, walked with a sticky hash of the API key, the OpenAI `user` or the conversation, so
one user stays on one version); without a route, the model's stable version.

The canary controller runs here too (`run_canaries`): every gateway tries for its lease each
tick, and the one that holds it steps every running canary (ops/rollout/canary.py).
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import redis.asyncio as aioredis

from gateway.request import ProtocolError
from ops.core import redis_keys, roster
from ops.rollout import registry
from ops.core.messages import ChatMessage, SamplingDefaults
from ops.rollout.registry import Snapshot
from ops.core.sampling_defaults import GenerationConfigError, sampling_defaults
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")


@dataclass(frozen=True)
class Choice:
    """The version a request runs on, and why (route, stable, pinned, unregistered)."""

    model: str
    version: str
    why: str
    # The routed version this request was meant for, when it had no live worker and the stable
    # version serves instead: that version is charged an error (which rolls a dead canary back).
    instead_of: str = ""

    @property
    def served(self) -> str:
        return redis_keys.served(self.model, self.version)


class Catalog:
    def __init__(self, client: aioredis.Redis, settings: Settings, fallback_defaults: SamplingDefaults,
                 created: int):
        self.redis = client
        self.settings = settings
        self.fallback_defaults = fallback_defaults  # an unregistered model's: this gateway's settings
        self.created = created
        self.snapshot = Snapshot()
        self.live: dict[str, set[str]] = {}  # model -> versions with a live worker (from heartbeats)
        self._last_served: dict[tuple[str, str], float] = {}  # (model, version) -> when last seen live
        self._defaults: dict[str, SamplingDefaults] = {}
        self._random = random.Random()
        self._held: tuple[Callable[[], dict | None], ...] = ()  # cards of the models the gateway holds itself

    # ---- keeping up -------------------------------------------------------------------------------

    async def refresh(self) -> None:
        self.snapshot = await registry.read_snapshot_async(self.redis)
        self._defaults.clear()

    async def run(self) -> None:
        while True:
            try:
                if await registry.revision_async(self.redis) != self.snapshot.revision:
                    await self.refresh()
                    log.info("event=registry_loaded revision=%d versions=%d routes=%d", self.snapshot.revision,
                             len(self.snapshot.entries), len(self.snapshot.routes))
            except (aioredis.RedisError, OSError) as exc:
                log.debug("event=registry_poll_failed error=%r", exc)
            await asyncio.sleep(self.settings.registry_poll_s)

    async def observe_now(self) -> None:
        """The live versions read now, not at the load monitor's last second (for `GET /v1/models`)."""
        self.observe_workers(await roster.live_workers_async(self.redis))

    def observe_workers(self, statuses: list[dict]) -> None:
        live: dict[str, set[str]] = {}
        for status in statuses:
            if status.get("draining") or not status.get("model"):
                continue
            live.setdefault(status["model"], set()).add(status.get("version") or "")
        self.live = live
        now = time.monotonic()
        for model, versions in live.items():
            for version in versions:
                self._last_served[(model, version)] = now

    def served_within(self, model: str, version: str, seconds: float) -> bool:
        """A live worker served this version within the last `seconds`."""
        seen = self._last_served.get((model, version))
        return seen is not None and time.monotonic() - seen <= seconds

    # ---- questions --------------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The registry revision this gateway routes by (readiness shows it)."""
        return self.snapshot.revision

    @property
    def default_model(self) -> str:
        """The registry's default model; without one, this gateway's BRIGADE_MODEL_NAME."""
        return self.snapshot.default or self.settings.model_name

    def known(self, model: str) -> bool:
        # The settings' model is known without a worker: its requests are no_workers, not not-found.
        return model in self.snapshot.models or model in self.live or model == self.settings.model_name

    def names(self) -> list[str]:
        return sorted(self.snapshot.models | set(self.live) | {self.settings.model_name})

    def resolve(self, ref: str | None, client_id: str | None = None) -> tuple[str, str]:
        """A request's `model` -> (model, pinned version or ""); model_not_found when neither the
        registry nor a live worker knows it."""
        if ref is None:
            return self.default_model, ""
        if not isinstance(ref, str) or not ref:
            raise ProtocolError("invalid_field", "`model` must be a non-empty string", client_id, "model")
        model, _, version = ref.partition("@")
        if not self.known(model):
            raise ProtocolError("model_not_found", f"the model {ref[:64]!r} does not exist; models: "
                                f"{', '.join(self.names()) or 'none'}", client_id, "model")
        if version and self.snapshot.entry(model, version) is None and version not in self.live.get(model, ()):
            versions = sorted({e.version for e in self.snapshot.versions(model)} | self.live.get(model, set()))
            raise ProtocolError("model_not_found", f"{model} has no version {version[:32]!r}; versions: "
                                f"{', '.join(v for v in versions if v) or 'none'}", client_id, "model")
        return model, version

    def defaults_for(self, model: str, version: str = "") -> SamplingDefaults:
        """What fills a request's unset sampling fields: the version's generation defaults (its
        registry entry) under the BRIGADE_DEFAULT_* overrides; the stable version's when none is
        chosen yet; this gateway's own for a model that is not registered."""
        version = version or self.snapshot.stable.get(model, "")
        entry = self.snapshot.entry(model, version)
        if entry is None:
            return self.fallback_defaults
        ref = entry.ref
        if ref not in self._defaults:
            try:
                self._defaults[ref] = sampling_defaults(self.settings, entry.generation, f"the registry's {ref}")
            except GenerationConfigError as exc:
                log.warning("event=registry_defaults_invalid model=%s error=%s", ref, exc)
                self._defaults[ref] = self.fallback_defaults
        return self._defaults[ref]

    def route(self, model: str, pinned: str, key_id: str | None, user: str | None, prompt: str | None,
              messages: list[ChatMessage] | None) -> Choice:
        """The version a request runs on: `choose`, except that a routed version with no live
        worker must not cost its users their answers: the stable one serves, when it is live."""
        conversation = registry.conversation_of(prompt, [m.model_dump() for m in messages]
                                                if messages is not None else None)
        choice = self.choose(model, pinned, key_id, user, conversation)
        if choice.why == "route" and not self.serving(choice.model, choice.version):
            fallback = self.snapshot.stable.get(model)
            if fallback and fallback != choice.version and self.serving(model, fallback):
                log.warning("event=routed_version_down model=%s version=%s served_by=%s", model, choice.version,
                            fallback)
                return Choice(model, fallback, "stable, routed version down", instead_of=choice.version)
        return choice

    def choose(self, model: str, pinned: str, key_id: str | None, user: str | None,
               conversation: str | None) -> Choice:
        if pinned:
            return Choice(model, pinned, "pinned")
        route = self.snapshot.routes.get(model)
        if route is not None and any(s.percent > 0 for s in route.shares):
            value = registry.sticky_value(route.sticky, key_id, user, conversation)
            at = registry.bucket(model, value) if value is not None else self._random.randrange(registry.BUCKETS)
            return Choice(model, registry.pick(route.shares, at), "route")
        stable = self.snapshot.stable.get(model)
        if stable is not None:
            return Choice(model, stable, "stable")
        live = sorted(self.live.get(model, {""}))
        return Choice(model, live[0], "unregistered")

    def shadows(self, model: str) -> list[str]:
        """The versions that get a shadow copy of this request (each with its share's chance)."""
        route = self.snapshot.routes.get(model)
        if route is None:
            return []
        return [s.version for s in route.shadows if s.percent > 0 and self._random.random() * 100 < s.percent]

    def serving(self, model: str, version: str) -> bool:
        return version in self.live.get(model, ())

    def folder(self, model: str, version: str) -> Path | None:
        """The version's folder on this machine (for its chat template), when it is here."""
        entry = self.snapshot.entry(model, version)
        if entry is None:
            return self.settings.model_dir if model == self.settings.model_name else None
        return registry.local_folder(entry, self.settings.store_dir)

    def list_beside(self, *cards: Callable[[], dict | None]) -> None:
        """Models the gateway answers with itself (the embedding model, the reranker), listed after
        the fleet's: each callable gives its card, or None while its model is not loaded."""
        self._held = cards

    def cards(self) -> list[dict]:
        """`GET /v1/models`: every model with a live worker, with its versions (OpenAI's shape, plus
        Brigade's fields: kind, versions, stable, route, sampling defaults, context length); then
        the models the gateway holds itself (`list_beside`), each with its kind."""
        out = []
        for model in sorted(self.live):
            entries = {e.version: e for e in self.snapshot.versions(model)}
            versions = []
            for version in sorted(set(entries) | self.live[model], key=lambda v: (entries[v].added_at if v in entries else 0, v)):
                entry = entries.get(version)
                versions.append({"version": version, "live": version in self.live[model],
                                 "checksum": entry.checksum if entry else None,
                                 "parameters": entry.parameters if entry else None,
                                 "max_model_len": entry.context_length if entry else None,
                                 "added_at": int(entry.added_at) if entry else None})
            stable = self.snapshot.stable.get(model)
            route = self.snapshot.routes.get(model)
            context = next((v["max_model_len"] for v in versions if v["version"] == stable and v["max_model_len"]), None)
            if context is None:
                context = next((v["max_model_len"] for v in versions if v["max_model_len"]), None)
            created = min((int(e.added_at) for e in entries.values()), default=self.created)
            out.append({"id": model, "object": "model", "created": created, "owned_by": "brigade", "kind": "generate",
                        "max_model_len": context if context is not None else self._context_of_folder(model),
                        "stable": stable, "versions": versions,
                        "route": route.model_dump(exclude={"model"}) if route else None,
                        "sampling_defaults": self.defaults_for(model).model_dump(exclude={"sources"})})
        held = (card() for card in self._held)
        out += [{"id": c.pop("id"), "object": "model", "created": self.created, "owned_by": "brigade", **c}
                for c in held if c is not None]
        return out

    def max_model_len(self, model: str) -> int | None:
        """The model's context length: its stable version's registry entry, another version's, or
        (unregistered) its folder's config (`POST /tokenize` reports it)."""
        stable = self.snapshot.stable.get(model)
        for entry in sorted(self.snapshot.versions(model), key=lambda e: e.version != stable):
            if entry.context_length:
                return entry.context_length
        return self._context_of_folder(model)

    def _context_of_folder(self, model: str) -> int | None:
        folder = self.folder(model, "")
        try:
            return json.loads((folder / "config.json").read_text()).get("max_position_embeddings") if folder else None
        except (OSError, ValueError):
            return None
