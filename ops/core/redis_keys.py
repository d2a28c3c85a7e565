# Over 400 lines: every Redis key shape Brigade uses is named in this one module, each with its bound beside it.
"""Every Redis key and channel Brigade uses, one function per shape, with its bound beside it.

Every key that can grow carries a TTL or a cap, and the function that says how long or how many
stands next to the key's own (`stream_ttl_s`, `stream_maxlen`, ...): a write site asks the key,
it never computes the bound itself. The values are Settings fields; these functions only say
which field bounds which key. Unbounded by design:
- CLAIMS: one field per request a live worker holds; removed when it ends or is reaped.
- WORKERS: one member per worker that beat in the last ops.core.roster.FORGET_S (pruned by every beat).
- UNCLAIMED: one member per queued request; removed at its claim, its cancel, or once its record expired.
- api_key(id), api_key_usage(id), API_KEYS: one hash each and one set member per API key. Keys
  are created by an operator only (`brigade keys create`), never by a request, so they are bounded
  by operator action; revoke keeps the record (revoked=1) so that the key's usage stays visible.
- MODELS, MODEL_STABLE, ROUTES: one field per registered version or model, written by an operator
  (`brigade models`, `brigade route`, `brigade canary`) only.
- BATCH_JOBS, BATCH_ACTIVE: lose a member when the job's hash is gone (pruned by `list`) or it ends.
Channels hold nothing, so they need no bound.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ops.core.settings import BatchSettings, CacheSettings, GatewaySettings, RolloutSettings, WorkerSettings

PREFIX = "brigade"


def reply_channel(gateway_id: str) -> str:
    """Pub/sub channel on which workers deliver a gateway's token events live."""
    return f"{PREFIX}:reply:{gateway_id}"


def stream(request_id: str) -> str:
    """A request's replay log: every event it produced, in order (capped, with TTL)."""
    return f"{PREFIX}:stream:{request_id}"


def stream_maxlen(settings: WorkerSettings) -> int:
    """Events a replay log keeps (approximately: XADD MAXLEN ~); above max_tokens_limit."""
    return settings.stream_maxlen


def stream_ttl_s(settings: WorkerSettings) -> int:
    """How long a request stays replayable and resumable after its last write."""
    return settings.stream_ttl_s


def request(request_id: str) -> str:
    """The request as enqueued (JSON), kept while it may still be replayed or resumed."""
    return f"{PREFIX}:request:{request_id}"


def request_ttl_s(settings: WorkerSettings) -> int:
    return settings.stream_ttl_s  # as long as its stream: a resume needs both


def cancelled(request_id: str) -> str:
    """Set when a request is cancelled, so a worker that takes it from the queue later skips it."""
    return f"{PREFIX}:cancelled:{request_id}"


def cancelled_ttl_s(settings: WorkerSettings) -> int:
    return settings.cancel_ttl_s


CANCEL_CHANNEL = f"{PREFIX}:cancels"  # request ids to stop, broadcast to every worker


def worker(instance: str) -> str:
    """A worker process's heartbeat and status (JSON, short TTL). `instance` is unique per process
    start, so a restarted worker with the same name is never taken for its dead predecessor."""
    return f"{PREFIX}:worker:{instance}"


def worker_ttl_ms(settings: WorkerSettings) -> int:
    """A heartbeat's life: the worker refreshes it while it lives; its expiry is the worker's death."""
    return int(settings.heartbeat_ttl_s * 1000)


# sorted set: worker instance -> time of its last heartbeat; the registry readers use instead of
# scanning for worker keys (ops/core/roster.py).
WORKERS = f"{PREFIX}:workers"


def claim(request_id: str) -> str:
    """Who runs a request (hash: epoch, owner instance, state, attempts): the fencing record."""
    return f"{PREFIX}:claim:{request_id}"


def claim_ttl_s(settings: WorkerSettings) -> int:
    return settings.stream_ttl_s  # the fencing record lives as long as what it fences


CLAIMS = f"{PREFIX}:claims"  # hash: request id -> owner instance, for every running claim (the reaper's list)
# sorted set: request id -> when it was queued (or sent again), until a worker claims it. A
# worker killed after taking a message off the queue but before claiming it leaves no claim for
# the reaper to find; this is how the reaper finds such requests.
UNCLAIMED = f"{PREFIX}:unclaimed"


# hash: request id -> the worker instance that received its message and has not claimed it yet
# (it waits in that worker's prefetch). Written in the same transaction as kombu's own record of
# the delivery (workers/transport.py), deleted at the claim (claim.lua), by the reaper when it sends
# the request again (retake.lua, take_unclaimed.lua) or finds its record expired: one field per
# message in some worker's prefetch. The reaper reads it whole each pass, so a receiver that died
# before its claim is found within a heartbeat's TTL, not after unclaimed_after_s.
TAKEN = f"{PREFIX}:taken"


DEAD_LETTERS = f"{PREFIX}:dlq"  # list of JSON entries: requests that crashed max_attempts workers


def dead_letters_max(settings: WorkerSettings) -> int:
    """Entries the dead-letter list keeps (the newest)."""
    return settings.dlq_max


def settled(request_id: str) -> str:
    """Set (NX) by the gateway that counts a request's usage against its API key: once, whichever sees its end."""
    return f"{PREFIX}:settled:{request_id}"


def settled_ttl_s(settings: WorkerSettings) -> int:
    return settings.stream_ttl_s


def resumed(request_id: str) -> str:
    """Set when a client resumed a request on a new connection: its old connection's exit must not cancel it."""
    return f"{PREFIX}:resumed:{request_id}"


def resumed_ttl_s(settings: WorkerSettings) -> int:
    return settings.stream_ttl_s


def served(model_name: str, version: str = "") -> str:
    """What one worker serves: a model's version (name@version), or the model alone when unversioned
    (a worker started on a folder with an empty registry)."""
    return f"{model_name}@{version}" if version else model_name


def interactive_queue(model_name: str, version: str = "") -> str:
    """The Celery queue of a model version's requests (a version's workers take only its own)."""
    return f"{PREFIX}.{served(model_name, version)}.interactive"


# kombu's Redis transport keeps one list per priority step (0, 3, 6, 9), the step after this
# separator, and step 0 under the plain queue name; workers pop lower steps first.
KOMBU_PRIORITY_SEP = "\x06\x16"
PRIORITY_STEPS = (0, 3, 6, 9)
BATCH_STEP = 9  # batch jobs' lines (ops/core/queue.BATCH_PRIORITY): popped only when the others are empty


def queue_lists(model_name: str, version: str = "") -> list[str]:
    """Every Redis list holding a model version's queued requests, one per priority step (batch lines last)."""
    q = interactive_queue(model_name, version)
    return [q if step == 0 else f"{q}{KOMBU_PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def interactive_lists(model_name: str, version: str = "") -> list[str]:
    """The lists of interactive requests only (every step but the batch one)."""
    return [name for step, name in zip(PRIORITY_STEPS, queue_lists(model_name, version)) if step != BATCH_STEP]


# ---- prefix-aware routing (docs/scaling.md) ------------------------------------------------------
# Each worker also consumes a queue of its own, for requests routed to it because its prefix cache
# holds the start of their prompt; an idle worker takes such a request from a busy one after
# steal_after_s (workers/stealing.py), and the reaper moves a dead worker's queue back to the shared one.


def worker_queue(model_name: str, version: str, instance: str) -> str:
    """One worker instance's own queue, beside its version's shared one."""
    return f"{interactive_queue(model_name, version)}.{instance}"


def worker_queue_lists(model_name: str, version: str, instance: str) -> list[str]:
    """Every list of one worker's own queue, a list per priority step as kombu keeps them."""
    q = worker_queue(model_name, version, instance)
    return [q if step == 0 else f"{q}{KOMBU_PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def kombu_bindings(queue: str) -> list[str]:
    """kombu's Redis transport keeps each queue's exchange binding in sets of these names, with no
    TTL: the reaper deletes a dead worker's once it forgets the worker's queue."""
    return [f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}"]


# hash: worker instance -> JSON {"model", "version"}: whose own queue exists. Written by every
# heartbeat; the reaper moves a dead worker's queue back to its version's shared queue on every
# pass while the worker is in the registry (WORKERS), then deletes the field, the queue and its
# binding: one field per worker seen in the registry's last FORGET_S.
WORKER_QUEUES = f"{PREFIX}:worker_queues"


def prefix_blocks(instance: str) -> str:
    """Set: the keys of the prefix-cache blocks one worker holds (engine/prefix_index.py's chained
    hash, 16 hex digits each), its snapshot for gateways that start or lost the log. Capped by the
    worker's own prefix cache (it removes what its cache evicts); TTL prefix_ttl_s, renewed by
    every heartbeat, so a dead worker's goes with it."""
    return f"{PREFIX}:prefix:{instance}"


def prefix_ttl_s(settings: WorkerSettings) -> int:
    return max(int(settings.heartbeat_ttl_s * 10), 30)


# stream: every worker's prefix-cache changes (instance, blocks stored, blocks evicted, a reset),
# which every gateway's routing index follows. Capped at prefix_log_maxlen entries; a gateway that
# fell behind the cap rebuilds from the snapshots.
PREFIX_LOG = f"{PREFIX}:prefix:log"


def prefix_log_maxlen(settings: WorkerSettings) -> int:
    return settings.prefix_log_maxlen


# ---- the answer cache (cache/) ------------------------------------------------------------------
# Entries and exact keys expire; the sorted sets, the namespace sets and the entry-namespace hash
# hold at most cache_max_entries members (LRU eviction, and the sweep removes expired ids from all
# of them); the log stream and hard negatives are capped.


def cache_entry(entry_id: str) -> str:
    """One cached answer (hash: question, answer chunks, namespace, embedding, hits, ...)."""
    return f"{PREFIX}:cache:entry:{entry_id}"


def cache_entry_ttl_s(settings: CacheSettings) -> int:
    """An entry's life, and its exact key's: they expire together (the sweep tidies the rest)."""
    return settings.cache_ttl_s


def cache_max_entries(settings: CacheSettings) -> int:
    """Entries in CACHE_LRU, and so in the expiry set, namespaces and entry-namespace hash (LRU eviction)."""
    return settings.cache_max_entries


def cache_log_maxlen(settings: CacheSettings) -> int:
    """Events CACHE_LOG keeps (approximately): a gateway further behind rebuilds its index."""
    return settings.cache_log_maxlen


def cache_hard_negatives_max(settings: CacheSettings) -> int:
    return settings.cache_hard_negatives_max


CACHE_ENTRY_PATTERN = f"{PREFIX}:cache:entry:*"


def cache_samples(entry_id: str) -> str:
    """A sampled question's pool of answers (list of JSON {chunks, finish_reason, completion_tokens}):
    at most cache_samples_max, expiring with its entry."""
    return f"{PREFIX}:cache:samples:{entry_id}"


def cache_samples_max(settings: CacheSettings) -> int:
    return settings.cache_samples


def cache_evidence_max(settings: CacheSettings) -> int:
    """Observations CACHE_EVIDENCE keeps (the newest); the list also expires when nothing is added."""
    return settings.cache_evidence_max


def cache_evidence_ttl_s(settings: CacheSettings) -> int:
    return settings.cache_ttl_s


def cache_exact(digest: str) -> str:
    """Exact-layer key: digest of (model, rendered prompt, output-changing params) -> entry id."""
    return f"{PREFIX}:cache:exact:{digest}"


def cache_namespace(namespace: str) -> str:
    """The entry ids of one namespace (set)."""
    return f"{PREFIX}:cache:ns:{namespace}"


CACHE_NAMESPACE_PATTERN = f"{PREFIX}:cache:ns:*"
CACHE_LRU = f"{PREFIX}:cache:lru"  # sorted set: entry id -> last use (unix seconds)
CACHE_EXPIRY = f"{PREFIX}:cache:expiry"  # sorted set: entry id -> expiry (unix seconds)
CACHE_LOG = f"{PREFIX}:cache:log"  # stream of adds and deletes that every gateway's index follows
CACHE_STATS = f"{PREFIX}:cache:stats"  # hash of counters
# hash: entry id -> namespace, written with the entry and removed when it is purged. The entry hash
# itself expires at the same moment as its expiry score, so the sweep finds the namespace here.
CACHE_ENTRY_NAMESPACE = f"{PREFIX}:cache:entry_namespace"
# list of JSON {asked, stored, entry, at}: answers users reported wrong, capped at
# cache_hard_negatives_max (below); read by `brigade cache train-verifier`.
CACHE_HARD_NEGATIVES = f"{PREFIX}:cache:hard_negatives"
# list of JSON {cosine, score, agreed, source, entry, at}: pairs whose answers were compared (near
# misses answered anyway, audited hits, feedback), newest first, capped at cache_evidence_max and
# expiring cache_evidence_ttl_s after the last one; cache/evidence.py learns the thresholds from it.
CACHE_EVIDENCE = f"{PREFIX}:cache:evidence"


# ---- API keys (gateway/admission/api_keys.py, gateway/admission/limits.py) ---------------------------------
# The records live as long as the operator keeps them (see the docstring above); the limiter's
# state is short-lived: trimmed to its window by each admission and expiring when a key goes idle.
API_KEYS = f"{PREFIX}:apikeys"  # set of every API key id ever created (for `brigade keys list`)


def api_key(key_id: str) -> str:
    """One API key (hash: name, digest of the whole key, rpm, tpm, max_concurrent, created, revoked)."""
    return f"{PREFIX}:apikey:{key_id}"


def api_key_usage(key_id: str) -> str:
    """An API key's counters (hash: requests, prompt_tokens, completion_tokens, cache_hits)."""
    return f"{PREFIX}:apikey:{key_id}:usage"


def key_requests(key_id: str) -> str:
    """Sorted set: request id -> admission time, the key's admissions in the last window (rpm)."""
    return f"{PREFIX}:limit:{key_id}:requests"


def key_tokens(key_id: str) -> str:
    """Sorted set: "tokens:nonce" -> time charged, the key's answers in the last window (tpm)."""
    return f"{PREFIX}:limit:{key_id}:tokens"


def key_tokens_total(key_id: str) -> str:
    """The sum of the tokens in key_tokens(key_id), kept beside it so admission reads one number."""
    return f"{PREFIX}:limit:{key_id}:tokens_total"


def key_in_flight(key_id: str) -> str:
    """Sorted set: request id -> admission time, the key's requests still running (max_concurrent)."""
    return f"{PREFIX}:limit:{key_id}:in_flight"


def key_window_ttl_ms(window_s: float) -> int:
    """key_requests, key_tokens and key_tokens_total: they outlive the limiter's window by nothing."""
    return math.ceil(window_s * 1000)


def key_in_flight_ttl_ms(stale_s: float) -> int:
    """key_in_flight: an idle key's slots go once the oldest could only be a crashed gateway's."""
    return math.ceil(stale_s * 1000)


# ---- batch jobs (gateway/batch/jobs.py) -----------------------------------------------------------
# A job's keys live batch_ttl_s: its hash, its in-flight map (at most Settings.batch_window fields)
# and its files; its lease lives seconds. The job index and the active set lose a member when its
# hash is gone (pruned by `list`) or the job ends.


def batch_job(job_id: str) -> str:
    """One batch job (hash: state, counts, files, cursor, written, output offset, timestamps, errors)."""
    return f"{PREFIX}:batch:{job_id}"


def batch_in_flight(job_id: str) -> str:
    """Hash: input line number -> request id, for the lines queued and not yet written out."""
    return f"{PREFIX}:batch:{job_id}:inflight"


def batch_lease(job_id: str) -> str:
    """The gateway that runs the job now (string, a short TTL it renews while it runs it)."""
    return f"{PREFIX}:batch:{job_id}:lease"


def batch_lease_ttl_s(settings: BatchSettings) -> int:
    """The lease lapses this long after its holder stops renewing it (and another gateway takes over)."""
    return int(settings.batch_lease_s)


def batch_ttl_s(settings: BatchSettings, window_s: float) -> int:
    """batch_job, batch_in_flight and batch_file: the completion window, then the retention."""
    return int(window_s + settings.batch_retention_s)


BATCH_JOBS = f"{PREFIX}:batches"  # sorted set: job id -> created at (unix seconds), for `list`
BATCH_ACTIVE = f"{PREFIX}:batches:active"  # set: jobs not yet in a final state, for the runners to find


def batch_file(file_id: str) -> str:
    """An uploaded or produced file's record (hash: filename, bytes, purpose, created_at, path)."""
    return f"{PREFIX}:file:{file_id}"


# ---- stored responses (gateway/doors/response_store.py) ---------------------------------------------
# A stored response of /v1/responses lives responses_ttl_s; the index holds at most responses_max
# members, the oldest dropped (and their keys deleted) when a new one would pass it.


def response(response_id: str) -> str:
    """One stored response (JSON: the response object, its conversation, its request id)."""
    return f"{PREFIX}:response:{response_id}"


def response_ttl_s(settings: GatewaySettings) -> int:
    return int(settings.responses_ttl_s)


def responses_max(settings: GatewaySettings) -> int:
    """Responses kept in RESPONSES (and so stored): past it, the oldest go."""
    return settings.responses_max


RESPONSES = f"{PREFIX}:responses"  # sorted set: response id -> created at (unix seconds), capped


# ---- models, routes, canaries (ops/rollout/registry.py, ops/rollout/canary.py) --------------------------
# The registry's hashes hold one field per registered version, route or model: bounded by operator
# action, as API keys are. Outcome streams are capped and expire; a canary's record is one value
# per model, its decision log capped.
MODELS = f"{PREFIX}:models"  # hash: "name@version" -> registry entry (JSON)
MODEL_STABLE = f"{PREFIX}:models:stable"  # hash: model name -> the version that gets traffic without a route
MODEL_DEFAULT = f"{PREFIX}:models:default"  # string: the model a request without `model` gets
ROUTES = f"{PREFIX}:routes"  # hash: model name -> route (JSON: shares, sticky, shadows, revision)
# Incremented by every change to MODELS, MODEL_STABLE, MODEL_DEFAULT or ROUTES, in the same
# transaction: gateways poll this one number and reload the whole registry when it moves.
REGISTRY_REVISION = f"{PREFIX}:models:revision"


def outcomes(model: str, version: str) -> str:
    """Stream of one version's finished requests (latencies, error, cache, shadow), read by canaries."""
    return f"{PREFIX}:outcomes:{model}@{version}"


def outcomes_maxlen(settings: RolloutSettings) -> int:
    return settings.outcomes_maxlen


def outcomes_ttl_s(settings: RolloutSettings) -> int:
    """An idle version's outcomes expire; every write renews the TTL."""
    return settings.outcomes_ttl_s


def canary(model: str) -> str:
    """A model's canary (JSON: versions, steps, objectives, state, reason, evidence)."""
    return f"{PREFIX}:canary:{model}"


def canary_log(model: str) -> str:
    """A model's canary decisions, newest first (list of JSON), capped at CANARY_LOG_MAX."""
    return f"{PREFIX}:canary:{model}:log"


CANARY_LOG_MAX = 500
CANARY_LEASE = f"{PREFIX}:canary:lease"  # the one controller (gateway or reaper) stepping canaries, short TTL
