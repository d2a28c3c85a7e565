"""Canary releases: a new version's share raised step by step while it keeps its objectives, and
set to 0 the moment it breaks one.

A canary's record (redis_keys.canary(model), JSON) names the canary and the stable version it is
compared with, the steps (percents, ending at 100), how long each step lasts, the objectives
(ops/rollout/slo.py, ratios against the stable version in the same window) and the fewest requests a
verdict needs. One controller at a time steps every running canary: whoever holds
redis_keys.CANARY_LEASE (any gateway, or the reaper) calls `Controller.tick` every canary_tick_s. A tick
reads both versions' outcomes (ops/rollout/outcomes.py) over the sliding window and decides:
- a breach, with enough requests: rolled back (route stable=100, canary=0), the reason and the
  evidence (both versions' numbers, each objective's value and limit) kept in the record;
- every objective held, enough requests, and the step has lasted its interval: the next step;
  the step to 100 is the promotion (route canary=100 and the registry's stable version, in one
  transaction);
- otherwise nothing (waiting for requests, or for the interval).
Every decision is also pushed to redis_keys.canary_log(model), capped at CANARY_LOG_MAX.

The window starts no earlier than the canary did: outcomes of the canary version from before
(an earlier canary, a shadow) are not its evidence. Every function takes `now` so that tests and
tools can drive time; outcome streams are read by their ids, which are the write time. What the
numbers say (VersionStats, each objective's Verdict) is canary_verdicts.py's.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Literal

import redis
from pydantic import BaseModel, ConfigDict, Field

from ops.core import redis_keys
from ops.rollout import outcomes, registry
from ops.rollout.canary_verdicts import Verdict, VersionStats, breach_reason, judge
from ops.rollout.registry import RegistryError, RouteSpec, Share
from ops.core.settings import RolloutSettings
from ops.rollout.slo import InvalidObjective, Objective, parse_slo

log = logging.getLogger("brigade.canary")


class CanaryError(RegistryError):
    """A canary operation that cannot be done; the message says what to do instead."""


class CanaryRecord(BaseModel):
    """One model's canary, running or ended."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    model: str
    version: str  # the canary
    stable: str  # the version it is compared with (and gives traffic back to on a rollback)
    steps: list[float]  # percents of the model's traffic, increasing, the last 100
    step_index: int = 0
    interval_s: float
    window_s: float
    slo: str
    min_requests: int
    state: Literal["running", "promoted", "rolled_back", "aborted"] = "running"
    reason: str = ""
    started_at: float
    step_started_at: float
    ended_at: float | None = None
    evidence: dict = Field(default_factory=dict)  # at the last decision: both versions' stats, each verdict
    history: list[dict] = Field(default_factory=list)  # every decision, oldest first

    @property
    def share(self) -> float:
        return self.steps[self.step_index]

    @property
    def objectives(self) -> list[Objective]:
        return parse_slo(self.slo)


@dataclass(frozen=True)
class Decision:
    """What a tick (or an operator) did to one canary."""

    model: str
    version: str
    kind: Literal["stepped", "promoted", "rolled_back", "aborted"]
    reason: str
    share: float  # the canary's share after the decision


# ---- the record in Redis ----------------------------------------------------------------------------


def read(client: redis.Redis, model: str) -> CanaryRecord | None:
    raw = client.get(redis_keys.canary(model))
    return CanaryRecord.model_validate_json(raw) if raw else None


def _log(client: redis.Redis, model: str, entry: dict) -> None:
    pipe = client.pipeline(transaction=True)
    pipe.lpush(redis_keys.canary_log(model), json.dumps(entry))
    pipe.ltrim(redis_keys.canary_log(model), 0, redis_keys.CANARY_LOG_MAX - 1)
    pipe.execute()


def log_entries(client: redis.Redis, model: str, count: int = 20) -> list[dict]:
    """The newest decisions first."""
    return [json.loads(raw) for raw in client.lrange(redis_keys.canary_log(model), 0, count - 1)]


def _save_if_running(client: redis.Redis, record: CanaryRecord, started_at: float) -> bool:
    """Write the record only while the stored one is the same canary, still running: a hand's
    abort or promote between a tick's read and its write wins."""
    name = redis_keys.canary(record.model)

    def save(pipe) -> bool:
        raw = pipe.get(name)
        current = CanaryRecord.model_validate_json(raw) if raw else None
        if current is None or current.state != "running" or current.started_at != started_at:
            return False
        pipe.multi()
        pipe.set(name, record.model_dump_json())
        return True

    return client.transaction(save, name, value_from_callable=True)


def _note(record: CanaryRecord, kind: str, reason: str, now: float) -> dict:
    entry = {"at": round(now, 3), "kind": kind, "version": record.version, "share": record.share, "reason": reason}
    record.history.append(entry)
    return entry


def _route(client: redis.Redis, model: str, shares: list[Share], why: str, stable: str | None = None) -> None:
    current = registry.read_snapshot(client).routes.get(model)
    sticky = current.sticky if current is not None else "key"
    shadows = current.shadows if current is not None else []
    registry.set_route(client, RouteSpec(model=model, shares=shares, sticky=sticky, shadows=shadows, why=why),
                       stable=stable)


def _split(record: CanaryRecord, share: float) -> list[Share]:
    """Stable first, the canary last: a canary's users stay with it as its share grows."""
    if share >= 100:
        return [Share(version=record.version, percent=100.0)]
    return [Share(version=record.stable, percent=100.0 - share), Share(version=record.version, percent=share)]


# ---- operations -------------------------------------------------------------------------------------


def start(client: redis.Redis, model: str, version: str, steps: list[float], interval_s: float, slo_text: str,
          min_requests: int, window_s: float | None = None, now: float | None = None) -> CanaryRecord:
    """Start a canary of model@version against the model's stable version: its first step's share
    of the route at once. Raises CanaryError (or InvalidObjective) for anything a user can fix."""
    now = time.time() if now is None else now
    objectives = parse_slo(slo_text)
    for o in objectives:
        if o.metric == "itl":
            raise InvalidObjective(f"{o.text!r}: a canary's outcomes keep no inter-token gaps: use tpot instead")
    if not steps or any(not 0 < s <= 100 for s in steps) or any(b <= a for a, b in zip(steps, steps[1:])):
        raise CanaryError(f"steps {','.join(f'{s:g}' for s in steps)}: give increasing percents above 0, e.g. 5,25,50,100")
    if steps[-1] != 100:
        raise CanaryError(f"steps {','.join(f'{s:g}' for s in steps)} end at {steps[-1]:g}: the last step is 100")
    if interval_s <= 0 or (window_s is not None and window_s <= 0):
        raise CanaryError("the interval and the window are positive durations (10m, 30s)")
    if min_requests < 1:
        raise CanaryError("--min-requests is at least 1")
    snap = registry.read_snapshot(client)
    if snap.entry(model, version) is None:
        raise CanaryError(f"{redis_keys.served(model, version)} is not registered (brigade models list)")
    stable = snap.stable.get(model)
    if not stable or snap.entry(model, stable) is None:
        raise CanaryError(f"model {model!r} has no stable version to compare with (brigade models list)")
    if stable == version:
        raise CanaryError(f"{redis_keys.served(model, version)} is already the stable version of {model}: "
                          "register the new version and give it (--version)")
    current = read(client, model)
    if current is not None and current.state == "running":
        raise CanaryError(f"{model} already has a running canary ({current.version}): "
                          f"promote or abort it first (brigade canary abort {model})")
    record = CanaryRecord(model=model, version=version, stable=stable, steps=steps, interval_s=interval_s,
                          window_s=window_s or interval_s, slo=slo_text, min_requests=min_requests,
                          started_at=now, step_started_at=now)
    reason = f"canary step 1 of {len(steps)}"
    entry = _note(record, "started", reason, now)
    client.set(redis_keys.canary(model), record.model_dump_json())
    _route(client, model, _split(record, record.share), reason)
    _log(client, model, {"model": model, **entry})
    log.info("event=canary_started model=%s version=%s stable=%s share=%g slo=%r", model, version, stable,
             record.share, slo_text)
    return record


def measure(client: redis.Redis, record: CanaryRecord, now: float,
            reader: outcomes.WindowReader | None = None) -> tuple[VersionStats, VersionStats, list[Verdict]]:
    """Both versions over the record's window ending now, and every objective's verdict (read
    through `reader` when given: a controller's, which reads only what is new since its last tick)."""
    since = max(now - record.window_s, record.started_at)
    objectives = record.objectives
    wanted = tuple(o.name for o in objectives if o.is_latency)
    window = reader.window if reader is not None else outcomes.window
    canary = VersionStats.of(window(client, record.model, record.version, since, now), wanted)
    stable = VersionStats.of(window(client, record.model, record.stable, since, now), wanted)
    return canary, stable, judge(objectives, canary, stable, record.min_requests)


def _evidence(canary: VersionStats, stable: VersionStats, verdicts: list[Verdict], now: float) -> dict:
    return {"at": round(now, 3), "canary": canary.to_json(), "stable": stable.to_json(),
            "verdicts": [asdict(v) for v in verdicts]}


def decide(client: redis.Redis, record: CanaryRecord, now: float,
           reader: outcomes.WindowReader | None = None) -> Decision | None:
    """One running canary's tick: roll back, step, promote, or nothing (None)."""
    canary, stable, verdicts = measure(client, record, now, reader)
    started_at = record.started_at
    breached = [v for v in verdicts if v.state == "breached"]
    if breached:
        reason = breach_reason(breached[0], canary.fresh)
        record.evidence = _evidence(canary, stable, verdicts, now)
        _route(client, record.model, _split(record, 0), f"canary {reason}")
        return _end(client, record, "rolled_back", reason, now, started_at, share=0.0)
    if any(v.state == "waiting" for v in verdicts) or canary.fresh < record.min_requests:
        return None
    if now - record.step_started_at < record.interval_s:
        return None
    record.evidence = _evidence(canary, stable, verdicts, now)
    nxt = min(record.step_index + 1, len(record.steps) - 1)
    if record.step_index == len(record.steps) - 1 or record.steps[nxt] >= 100:
        reason = f"promoted: every objective held over {canary.fresh} requests"
        return _promote(client, record, reason, now, started_at)
    record.step_index, record.step_started_at = nxt, now
    reason = f"canary step {nxt + 1} of {len(record.steps)}"
    entry = _note(record, "stepped", f"{reason}: every objective held over {canary.fresh} requests", now)
    if not _save_if_running(client, record, started_at):
        return None
    _route(client, record.model, _split(record, record.share), reason)
    _log(client, record.model, {"model": record.model, **entry})
    log.info("event=canary_stepped model=%s version=%s share=%g requests=%d", record.model, record.version,
             record.share, canary.fresh)
    return Decision(record.model, record.version, "stepped", entry["reason"], record.share)


def _promote(client: redis.Redis, record: CanaryRecord, reason: str, now: float, started_at: float) -> Decision | None:
    record.step_index = len(record.steps) - 1
    decision = _end(client, record, "promoted", reason, now, started_at, share=100.0)
    if decision is not None:  # recorded first: an abort meanwhile must not be overridden by this route
        _route(client, record.model, _split(record, 100), "canary promoted", stable=record.version)
    return decision


def _end(client: redis.Redis, record: CanaryRecord, state: str, reason: str, now: float, started_at: float,
         share: float) -> Decision | None:
    record.state, record.reason, record.ended_at = state, reason, now
    entry = _note(record, state, reason, now)
    entry["share"] = share
    if not _save_if_running(client, record, started_at):
        return None
    _log(client, record.model, {"model": record.model, **entry})
    log.info("event=canary_%s model=%s version=%s reason=%r", state, record.model, record.version, reason)
    return Decision(record.model, record.version, state, reason, share)


def _running(client: redis.Redis, model: str) -> CanaryRecord:
    record = read(client, model)
    if record is None or record.state != "running":
        said = "no canary" if record is None else f"its canary {record.state.replace('_', ' ')}"
        raise CanaryError(f"{model} has no running canary ({said}): brigade canary status {model}")
    return record


def promote(client: redis.Redis, model: str, now: float | None = None) -> Decision:
    """By hand: the canary takes all of the traffic and becomes the stable version, now."""
    now = time.time() if now is None else now
    record = _running(client, model)
    canary, stable, verdicts = measure(client, record, now)
    record.evidence = _evidence(canary, stable, verdicts, now)
    decision = _promote(client, record, "promoted by hand", now, record.started_at)
    if decision is None:
        raise CanaryError(f"{model}'s canary ended meanwhile: brigade canary status {model}")
    return decision


def abort(client: redis.Redis, model: str, reason: str = "aborted by hand", now: float | None = None) -> Decision:
    """By hand: all of the traffic back to the stable version; the canary stays registered."""
    now = time.time() if now is None else now
    record = _running(client, model)
    canary, stable, verdicts = measure(client, record, now)
    record.evidence = _evidence(canary, stable, verdicts, now)
    _route(client, model, _split(record, 0), f"canary {reason}")
    decision = _end(client, record, "aborted", reason, now, record.started_at, share=0.0)
    if decision is None:
        raise CanaryError(f"{model}'s canary ended meanwhile: brigade canary status {model}")
    return decision


def status(client: redis.Redis, model: str, now: float | None = None) -> dict:
    """The record, both versions' numbers over the current window (for an ended canary, the window
    that ended at its decision), every objective's verdict, the newest log entries."""
    now = time.time() if now is None else now
    record = read(client, model)
    if record is None:
        raise CanaryError(f"{model} has had no canary (brigade canary start {model} --version V ...)")
    if record.ended_at is not None:  # an ended canary is shown as it was decided, not as traffic goes on
        now = min(now, record.ended_at)
    route = registry.read_snapshot(client).routes.get(model)
    canary, stable, verdicts = measure(client, record, now)
    return {"record": record.model_dump(), "share": route.share_of(record.version) if route else None,
            "window": {"since": round(max(now - record.window_s, record.started_at), 3), "until": round(now, 3)},
            "canary": canary.to_json(), "stable": stable.to_json(), "verdicts": [asdict(v) for v in verdicts],
            "log": log_entries(client, model)}


# ---- the controller ---------------------------------------------------------------------------------


class Controller:
    """Steps every running canary while it holds redis_keys.CANARY_LEASE; any number may run (in each
    gateway, in the reaper), one acts. Call `tick()` every settings.canary_tick_s."""

    def __init__(self, client: redis.Redis, owner_id: str, settings: RolloutSettings):
        self.client, self.owner_id = client, owner_id
        self.lease_ms = max(1, int(settings.canary_lease_s * 1000))
        self.reader = outcomes.WindowReader()  # both versions' windows, read incrementally tick by tick

    def hold_lease(self) -> bool:
        """Take the lease if free, renew it if ours; False when another controller holds it."""
        if self.client.set(redis_keys.CANARY_LEASE, self.owner_id, nx=True, px=self.lease_ms):
            return True

        def renew(pipe) -> bool:
            if pipe.get(redis_keys.CANARY_LEASE) != self.owner_id:
                return False
            pipe.multi()
            pipe.pexpire(redis_keys.CANARY_LEASE, self.lease_ms)
            return True

        return self.client.transaction(renew, redis_keys.CANARY_LEASE, value_from_callable=True)

    def release(self) -> None:
        """Give the lease up (on shutdown), only if ours, so another controller takes over at once."""

        def drop(pipe) -> None:
            if pipe.get(redis_keys.CANARY_LEASE) == self.owner_id:
                pipe.multi()
                pipe.delete(redis_keys.CANARY_LEASE)

        self.client.transaction(drop, redis_keys.CANARY_LEASE)

    def running(self) -> list[CanaryRecord]:
        """Every model's running canary: one record per registered model, read in one round trip."""
        models = sorted(registry.read_snapshot(self.client).models)
        if not models:
            return []
        found = []
        for raw in self.client.mget([redis_keys.canary(m) for m in models]):
            if raw:
                record = CanaryRecord.model_validate_json(raw)
                if record.state == "running":
                    found.append(record)
        return found

    def tick(self, now: float | None = None) -> list[Decision]:
        """One round over every running canary; [] when another controller holds the lease."""
        if not self.hold_lease():
            return []
        now = time.time() if now is None else now
        decisions = []
        for record in self.running():
            try:
                decision = decide(self.client, record, now, self.reader)
            except (RegistryError, ValueError) as exc:  # a version removed meanwhile: said, and the others go on
                log.warning("event=canary_tick_failed model=%s version=%s error=%r", record.model, record.version,
                            str(exc))
                continue
            if decision is not None:
                decisions.append(decision)
        return decisions
