# Over 400 lines: every BRIGADE_ variable with its comment, here because this is the one place the environment is read.
"""The one settings object: every knob Brigade has, read from BRIGADE_* variables, in sections by part.

Each section is a class of its own (host, Redis, gateway, engine, worker, cache, batch, rollout),
in the manner of vLLM's ModelConfig, CacheConfig and SchedulerConfig; `Settings` is all of them,
read from the environment once, where a process starts. A part's constructor names the section it
reads where it reads one alone. Each field documents its default; the settings table in
docs/settings.md is written from here.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ops.core.redis_address import is_sentinel, with_tls_defaults

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _default_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "brigade"


def _default_data_dir() -> Path:
    # Data, not cache: ~/.cache is what users, cleaners and CI images empty to reclaim space, and
    # what is there must cost only the time to rebuild it (prepared models). API keys, cached
    # answers, batch jobs and dead letters cannot be rebuilt, so they go where the XDG base
    # directory spec puts a user's data ($XDG_DATA_HOME, default ~/.local/share).
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "brigade"


class HostSettings(BaseModel):
    """Where this machine keeps what Brigade builds and what must outlive a restart, and how much it
    logs: every part's."""

    # Where prepared model folders and other build products live (not in git: too large).
    home: Path = Field(default_factory=_default_home)
    # Where what must survive a restart lives: the append-only file of the Redis that `brigade up`
    # starts (unless --ephemeral) and batch jobs' files.
    data_dir: Path = Field(default_factory=_default_data_dir)
    # The level of every command's and part's log lines (ops/core/logs.py).
    log_level: str = "INFO"
    # llama.cpp built beside Brigade for the benchmarks (ops/bench/llama_cpp_build.py). Empty:
    # ~/.cache/brigade/peers (under XDG_CACHE_HOME when set).
    peer_dir: str = ""

    @property
    def peers_dir(self) -> Path:
        if self.peer_dir:
            return Path(self.peer_dir)
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "brigade" / "peers"


class RedisSettings(BaseModel):
    """The Redis every part talks to: its URL, TLS, and what a failover must not lose. Handed to
    every client factory (ops/core/redis_clients.py)."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    # TLS to Redis, for a rediss:// or rediss+sentinel:// URL (docs/operations.md, "Redis over TLS"):
    # the default for each of redis-py's ssl_* options that the URL's query leaves out (a URL's own
    # option wins: a cache Redis with another CA names it in BRIGADE_CACHE_REDIS_URL). The CA that
    # signed the server's certificate (PEM, ssl_ca_certs); empty: the system's trust store, enough
    # for a managed Redis whose certificate a public CA signed.
    redis_tls_ca_file: str = ""
    # The certificate and key Brigade presents (ssl_certfile, ssl_keyfile), for a Redis that asks
    # clients for one (`tls-auth-clients yes`, redis-server's default on a TLS port); empty: none.
    redis_tls_cert_file: str = ""
    redis_tls_key_file: str = ""
    # Whether the server's certificate is checked (ssl_cert_reqs): required or none (none still
    # encrypts, but anyone on the path can pose as Redis: a throwaway test bench at most). redis-py's
    # third value, optional, is the same as required for a client (Python's ssl module).
    redis_tls_verify: str = Field(default="required", pattern="^(required|none)$")
    # Whether the certificate must name the URL's host (ssl_check_hostname; so must a sentinel's).
    redis_tls_check_hostname: bool = True
    # The writes whose loss a failover must not cause (a worker's claim before it acts on it, a
    # request's record before its message is sent) are confirmed on this many replicas (Redis
    # WAIT), so a failover cannot promote a replica that lacks them (Sentinel promotes the most
    # up-to-date one). -1: one with a redis+sentinel:// URL, none otherwise (a lone Redis has none).
    confirm_replicas: int = -1
    # How long such a write waits for them; past it the writer goes on (a lost claim fences its
    # worker, which queues the request again; refusing would stop all work whenever a replica is
    # away), and a worker logs event=claim_unconfirmed.
    confirm_ms: int = 500
    # A gateway asked to queue a request while a Sentinel failover leaves no primary tries again
    # for this long before answering `unavailable` (a failover takes 2-3 s with down-after 1 s).
    # -1: 10 s with a redis+sentinel:// URL, 0 otherwise (a lone Redis that does not answer is down).
    failover_wait_s: float = -1
    # Redis unreachable this long: the gateway fails the requests it is waiting on.
    redis_outage_grace_s: float = 30.0

    @property
    def sentinel(self) -> bool:
        return is_sentinel(self.redis_url)

    @property
    def confirmations(self) -> int:
        if self.confirm_replicas >= 0:
            return self.confirm_replicas
        return 1 if self.sentinel else 0

    @property
    def failover_budget_s(self) -> float:
        if self.failover_wait_s >= 0:
            return self.failover_wait_s
        return 10.0 if self.sentinel else 0.0


class GatewaySettings(BaseModel):
    """The gateway's doors: where it listens, what a request may hold, keys and guards, the defaults
    it fills in, admission and routing (gateway/)."""

    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8765
    # The key the command line sends (`brigade chat`, `batch`, `bench doors`/`serve`, `cache warm`)
    # when no --api-key is given. A SecretStr: printing the settings shows ********** instead.
    api_key: SecretStr = SecretStr("")
    # Largest WebSocket frame accepted; larger frames close the connection (1009), so this sits
    # well above max_prompt_chars so that an oversized prompt still gets a polite error event.
    max_message_bytes: int = 16 * 1024 * 1024
    max_prompt_chars: int = 65_536
    max_messages: int = 256
    max_stop_strings: int = 8
    max_stop_chars: int = 128
    max_id_chars: int = 128
    max_tokens_limit: int = 4096  # must stay below stream_maxlen: the replay log holds every token
    max_requests_per_connection: int = 64
    # Keepalive pings of every WebSocket: a peer that does not answer within the timeout is gone.
    ws_ping_interval_s: float = 20.0
    ws_ping_timeout_s: float = 20.0
    # SIGTERM: WebSocket clients get a close frame (1012) at once and may `resume` elsewhere; HTTP
    # answers still streaming get this long to finish before the gateway exits.
    gateway_shutdown_grace_s: float = 10.0
    # API keys: "off", "required", or empty for the default: required whenever the gateway binds to
    # an address other than loopback, so nothing listens unprotected on a network.
    auth: str = Field(default="", pattern="^(|off|required)$")
    # Content guards run before enqueue (prompt) and on the output stream: module:callable, comma
    # separated (gateway/admission/content_guards.py). Empty: none.
    guards: str = ""
    # The shipped pattern guard's list: one regular expression a line ('#' starts a comment);
    # empty: the built-in list of known prompt-injection phrases.
    guard_patterns_file: str = ""
    # The shipped sanitizer's limit on a prompt's characters (all messages together).
    guard_max_chars: int = 32_768
    # Sampling fields a request leaves unset (every door: WebSocket, OpenAI, batch lines), as vLLM's
    # --generation-config: "auto" reads the model's generation_config.json (for the default model,
    # the publisher's recommendations shipped in ops/core/sampling_defaults.py), "brigade" ignores the
    # model's file (neutral values), a folder path reads that folder's generation_config.json.
    generation_config: str = "auto"
    # Each wins over the generation config (vLLM's --override-generation-config); empty: the model's.
    # A request's own field wins over both.
    default_max_tokens: int | None = None
    default_temperature: float | None = None
    default_top_p: float | None = None
    default_top_k: int | None = None
    default_repetition_penalty: float | None = None
    # The gateway's GET /metrics: open (as vLLM's) or behind an API key like the API ("required").
    metrics_auth: str = Field(default="off", pattern="^(off|required)$")
    # Seconds a client is told to wait (Retry-After) when the service is overloaded or has no worker.
    retry_after_s: int = 2
    # Stored responses of POST /v1/responses (`store`, `previous_response_id`, GET by id): how long
    # each is kept, and how many at most (the oldest go first).
    responses_ttl_s: float = Field(default=86_400.0, gt=0)
    responses_max: int = Field(default=10_000, ge=1)
    # Prefix-aware routing (docs/scaling.md): `prefix` sends a request whose prompt begins with
    # blocks a worker's prefix cache holds to that worker's own queue, weighed against its load;
    # `shared`: every request on the version's one shared queue, taken by whichever worker is free.
    routing: Literal["prefix", "shared"] = "prefix"
    # Prompt tokens a worker's cache must hold beyond another's for each request more of load
    # (queued, running, waiting in its engine) it carries: the price of load in prefill tokens.
    route_load_tokens: int = 128
    # Past this many requests more than the least loaded worker, a worker gets no routed request
    # whatever it holds: the request goes to the least loaded (a load fallback).
    route_imbalance: int = 8
    # Overload: refuse new work past this queue depth (messages waiting for a worker).
    max_queue_depth: int = 1000
    # Prompts in one /v1/completions request (an evaluation harness's batch): each is a request of
    # its own through admission, so this bounds what one body fans out to (vLLM's bound is 1024).
    max_prompts_per_request: int = 128
    # A client that disconnects may resume on a new connection within this time; after it, the
    # gateway cancels the abandoned requests.
    resume_grace_s: float = 15.0
    # POST /v1/embeddings (served by the cache's embedder): inputs in one request (OpenAI's limit)
    # and characters in one input (the model reads its first 256 word pieces; more is cut).
    embedding_max_inputs: int = Field(default=2048, ge=1)
    embedding_max_input_chars: int = Field(default=16_384, ge=1)
    # POST /v1/rerank and /v1/score (the pair model, or the embedding model's cosine): documents or
    # pairs in one request, characters in one text (the pair model reads 128 word pieces of a pair,
    # the embedding model 256 of a text; more is cut), and pairs per forward pass: each pass holds
    # the model that the cache's lookups use too, so they get in between a large request's passes.
    rerank_max_documents: int = Field(default=1000, ge=1)
    rerank_max_text_chars: int = Field(default=16_384, ge=1)
    rerank_batch_pairs: int = Field(default=32, ge=1)

    @property
    def auth_required(self) -> bool:
        if self.auth:
            return self.auth == "required"
        return self.gateway_host not in LOOPBACK_HOSTS

    @property
    def http_url(self) -> str:
        return f"http://{self.gateway_host}:{self.gateway_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.gateway_host}:{self.gateway_port}/v1/ws"


class EngineSettings(BaseModel):
    """The engine a worker holds: the model, its batch and KV memory, precision, kernels and threads
    (engine/, through workers/engine_loading.py)."""

    # A Hugging Face causal-LM folder; empty means the prepared SmolLM2-135M-Instruct.
    model: str = ""
    model_name: str = "smollm2-135m-instruct"
    # Sequences one engine runs at once; the KV budget bounds it too (engine/scheduler.py).
    max_batch: int = 32
    # KV memory budget in tokens; kv_budget_bytes, when set, wins and is converted per model.
    kv_budget_tokens: int = 32_768
    kv_budget_bytes: int | None = None
    max_prefill_tokens: int = 4096  # prompt tokens in one forward pass while nothing decodes
    # Prompt tokens in one pass beside decoding streams (chunked prefill): bounds how long a long
    # prompt stalls the streams already running.
    prefill_chunk_tokens: int = 64
    # Reuse the KV of shared prompt prefixes (a system prompt, earlier turns): engine/prefix_cache.py.
    prefix_cache: bool = True
    # Deterministic mode: greedy answers that do not depend on what shares the engine's passes
    # (batch, chunks, prefix hits, resumption): each pass's rows padded to the kernels' row
    # quantum, found at start (1 for weights read from their grid), and attention one query at a
    # time (engine/batch_invariance.py). On by default: part of the exact default
    # (docs/architecture.md, "Precision: measured"); false trades that guarantee for prefill speed.
    batch_invariant: bool = True
    # float32 weights that lie exactly on a GGUF grid (the default model's) are read from the grid
    # by a kernel compiled for this CPU (engine/grid_linear.py): the same numbers, a fifth of the
    # bytes. false: ordinary float32 products (for comparison).
    grid_weights: bool = True
    # Where the kernels are built for this CPU (engine/kernels.py) and where the packed grids are
    # kept (engine/grid_store.py); each a build cache, handed to the engine. Empty: the engine's
    # own, ~/.cache/brigade/kernels and ~/.cache/brigade/grids (the grids under XDG_CACHE_HOME
    # when set).
    kernel_dir: str = ""
    grid_dir: str = ""
    # Prompt-lookup speculation (engine/speculation.py): draft tokens an answer may have verified
    # per step, taken from its own context; the text is the model's token for token. It turns itself
    # off when many answers decode or a sequence's drafts are refused, and drafts fewer as fewer
    # hold. 0: off. 2: on an AVX2 CPU a 3-row verify pass costs about 1.4 steps and a 5-row one 2.2,
    # so 2 tokens give more tokens a second than 4 below 95% acceptance (at most 6% fewer above),
    # and a longest gap between tokens two thirds as long (docs/benchmarks.md; AVX-512 CPUs not
    # measured for this choice).
    speculative_tokens: int = Field(default=2, ge=0, le=16)
    # An answer whose last this many tokens repeat one unit of up to 32 tokens, at least 3 times
    # round, ends with finish_reason "repetition" (OpenAI's API: "length") instead of looping on to
    # max_tokens (engine/repetition.py); 0: never cut (an answer asked to repeat something).
    repetition_stop_tokens: int = Field(default=64, ge=0)
    # Where and in what precision the engine runs (engine/placement.py): auto | cpu | cuda | cuda:N,
    # and auto | float32 | mixed | bfloat16 | float16. auto: float32 everywhere (the exact default;
    # half precision changed answers on every CPU kind measured). bfloat16, float16 and mixed are
    # opt-in speed modes with their measured accuracy (docs/architecture.md).
    device: str = "auto"
    dtype: str = "auto"
    # 0 means: the cores this process may run on.
    torch_threads: int = 0
    # How long OpenMP threads spin at a barrier before they sleep (libgomp's GOMP_SPINCOUNT, in
    # spins; 0: libgomp's own, 300,000, several milliseconds of a core). Short, so that a process
    # sharing its cores (a worker beside its gateway and Redis, other workers, a test suite) hands
    # them back instead of spinning while the thread it waits for is put aside: two engines on
    # two cores made about 10 tok/s each with libgomp's own and about 42 with 1,000, one alone
    # about 95 and 85, a served stream the same (docs/architecture.md). Every brigade command sets
    # it before torch loads; a GOMP_SPINCOUNT already in the environment wins.
    openmp_spin_count: int = 1000


class WorkerSettings(BaseModel):
    """A worker's life beside its engine: Celery, heartbeats and the reaper, claims, stealing,
    draining, the reply streams, metrics and Flower (workers/)."""

    # The autoscaling signal's requests per worker (ops/core/fleet.ScaleSignal); 0: max_batch.
    scale_target_per_worker: int = 0
    max_wait_ms: float = 10.0
    # Celery: concurrency bounds the requests one worker holds (running + waiting in its engine).
    # 0: twice max_batch, so that finished rows refill at once from requests already held.
    worker_concurrency: int = 0
    # Each worker serves its Prometheus metrics on http://host:port/metrics (workers/metrics.py) and
    # publishes that address in its heartbeat (metrics_url). Port 0: any free port, so several
    # workers on one host never clash. A port that cannot be bound is logged once
    # (event=metrics_unavailable) and the worker serves on without metrics (metrics_url null).
    # Bind 0.0.0.0 for a Prometheus on another host.
    worker_metrics_host: str = "127.0.0.1"
    worker_metrics_port: int = 0
    # The host written into metrics_url; empty: the bound host, or this machine's name when bound to
    # every interface (0.0.0.0 or ::).
    worker_metrics_advertise_host: str = ""
    # Heartbeat: each worker refreshes its key this often; the reaper takes over a worker's
    # requests once the key has been silent for the TTL.
    heartbeat_interval_s: float = 1.0
    heartbeat_ttl_s: float = 3.0
    reaper_interval_s: float = 0.5
    # A heartbeat vouches for progress, not just a live process: once the engine thread has not
    # come round its loop for this long (a wedged forward pass, a stuck callback), the worker stops
    # beating and its requests move on. Longer than any one step: a full prefill on a slow CPU.
    engine_stall_s: float = 30.0
    # Claims of one request before it is a poison request and goes to the dead-letter list.
    max_attempts: int = 3
    # A queued request that no worker received (docs/reliability.md) and no worker claimed after
    # this long is looked at by the reaper: sent again when no list of its version's queues holds a
    # message as old as it (its message was lost between a pop and the receipt: a SIGKILL, or a
    # BRPOP answered while its connection was being torn down in a failover). One a worker received
    # is sent again as soon as that worker's heartbeat expires, whatever its age.
    unclaimed_after_s: float = 5.0
    # How far the clocks of the hosts that send requests (gateways, reapers) may disagree: a message
    # stamped up to this much later than a lost request is still taken for one that may wait
    # behind it. Clocks further apart cost a duplicate message (skipped at its claim), never a loss.
    queue_clock_skew_s: float = 2.0
    # An idle worker takes a request routed to a busy one that has not taken it after this long.
    steal_after_s: float = 0.25
    # Entries of the prefix-cache log (keys.PREFIX_LOG) Redis keeps for the gateways' indexes.
    prefix_log_maxlen: int = 50_000
    dlq_max: int = 10_000
    # SIGTERM: running requests get this long to finish, then continue on another worker.
    drain_seconds: float = 10.0
    # Celery's own redelivery of an unacked message (the second line behind the reaper). Healthy
    # requests that run longer are delivered again, and the duplicate is skipped by its claim.
    visibility_timeout_s: int = 300
    # The per-request replay stream: capped length and a TTL so that it can never grow unbounded.
    stream_maxlen: int = 8192
    stream_ttl_s: int = 3600
    cancel_ttl_s: int = 3600
    flower_host: str = "127.0.0.1"
    flower_port: int = 5555
    flower_user: str = "brigade"
    flower_password: str = "brigade"
    # Flower shows each task's arguments; by default without the prompt text (debugging opt-in).
    flower_show_prompts: bool = False


class CacheSettings(BaseModel):
    """The answer cache: its Redis, bounds, the semantic rule and its evidence, the embedding model
    (cache/)."""

    # Empty: the same Redis as everything else. A separate instance keeps cache load apart.
    cache_redis_url: str = ""
    cache_enabled: bool = True
    cache_ttl_s: int = 86_400
    cache_max_entries: int = 100_000
    # Semantic layer: candidates from FAISS above a cosine floor; the embedding proposes, the
    # guards and the pair model (a cross-encoder, cache/pair_model.safetensors) veto (cache/hit_rule.py).
    cache_candidates: int = 4
    cache_min_similarity: float = 0.55
    # The pair model checks semantic hits. Off, or when its weights are missing or fail to load
    # (logged as event=pair_model_unavailable), `cache_fallback` decides instead.
    cache_verifier: bool = True
    cache_pair_model: str = ""  # a trained pair-model file; empty: the one shipped in cache/
    # Without a pair model: "off" (exact hits only) or "cosine" (guards and a cosine of
    # cache_cosine_threshold, no band). "off" by default: no cosine alone kept look-alikes out.
    cache_fallback: str = Field(default="off", pattern="^(off|cosine)$")
    # The rule's numbers (hit_rule.OperatingPoint). Empty: the values tuned with the pair model
    # (stored in its file), then moved by evidence within cache_max_error (cache/evidence.py).
    cache_serve_cosine: float | None = None
    cache_band_cosine: float | None = None
    cache_agree: float | None = None
    cache_objection: float | None = None
    cache_cosine_threshold: float = 0.95
    # The wrong-answer rate the learned thresholds keep under (delta; the bound's upper end at 95%).
    cache_max_error: float = Field(default=0.01, gt=0, lt=1)
    # Sampled requests (temperature > 0, no seed): up to this many different answers per question
    # are generated and kept; a full pool serves one of them at random.
    cache_samples: int = Field(default=4, ge=1)
    # The share of semantic hits asked again of the model in the batch lane, to measure them.
    cache_audit_share: float = Field(default=0.05, ge=0, le=1)
    # The evidence's judge (cache/evidence.judge): a stored answer fits an asked question when
    # its embedding's cosine with it is at most this below its cosine with the stored question.
    cache_judge_margin: float = Field(default=0.15, ge=0, le=2)
    # The model's own answer agrees with a stored one when equal, or when their embeddings' cosine
    # reaches this (reported beside the verdict as same_as_model; not a judge of right and wrong).
    cache_answer_agreement: float = 0.9
    cache_evidence_max: int = 5_000
    # Pairs reported wrong (feedback, `brigade cache forget --asked`) kept for train-verifier.
    cache_hard_negatives_max: int = 10_000
    cache_hnsw_from: int = 10_000
    cache_sweep_interval_s: float = 5.0
    cache_log_maxlen: int = 200_000
    embedding_model: str = ""  # a sentence-transformers folder; empty: all-MiniLM-L6-v2 (packaged)
    embedding_threads: int = 1
    embedding_int8: bool = False


class BatchSettings(BaseModel):
    """Batch jobs (gateway/batch/): their files, window, retention and the runner's lease."""

    # Batch jobs (gateway/batch/runner.py): where their files live (every gateway must see the same
    # folder), lines in flight per job (see batch_window below), how long a job's records outlive its completion window,
    # the runner's lease and how often gateways look for jobs to run.
    # Under the data dir, not BRIGADE_HOME (a cache): a job's records survive in Redis now, and
    # they must not point at result files that a cache clean-up removed.
    batch_files_dir: str = ""  # empty: BRIGADE_DATA_DIR/batches
    batch_window: int = 0  # 0: the live workers' batch width, shared among this gateway's jobs
    batch_max_file_bytes: int = 200 * 1024 * 1024  # OpenAI's limit for a batch input file
    batch_retention_s: float = 86_400.0
    batch_completion_window_s: float = 86_400.0
    batch_lease_s: float = 10.0
    batch_poll_s: float = 1.0


class RolloutSettings(BaseModel):
    """Model versions and canaries (ops/rollout/): the version a worker serves, the store, outcomes,
    the registry's poll and the canary's lease."""

    # The registered version this worker serves (set by `brigade worker --model NAME@VERSION`);
    # empty: unversioned, the folder above under model_name (an empty registry).
    model_version: str = ""
    # The model store: each registered version's prepared folder, store/NAME/VERSION. Workers on
    # other machines fill theirs with `brigade models pull`. Empty: BRIGADE_HOME/store.
    model_store: str = ""
    # A version's finished requests kept for canaries (a capped stream per version, with a TTL).
    outcomes_maxlen: int = 20_000
    outcomes_ttl_s: int = 7 * 86_400
    # How often a gateway looks for registry and route changes (one GET of a revision number).
    registry_poll_s: float = 0.25
    # The canary controller's lease (whoever holds it steps every canary) and its tick.
    canary_lease_s: float = 5.0
    canary_tick_s: float = 1.0


class Settings(BaseSettings, HostSettings, RedisSettings, GatewaySettings, EngineSettings, WorkerSettings,
               CacheSettings, BatchSettings, RolloutSettings):
    """Every BRIGADE_* variable: the sections above, read from the environment in one place
    (tests/test_floors.py holds every other module to that). What is drawn from two sections is
    here."""

    model_config = SettingsConfigDict(env_prefix="BRIGADE_", extra="ignore")

    @model_validator(mode="after")
    def _tls_in_redis_urls(self) -> "Settings":
        # The TLS settings travel inside the URLs: every client is built from a URL alone
        # (ops/core/redis_clients.py), and so are Celery's broker and Flower (ops/core/queue.py).
        tls = {"ssl_ca_certs": self.redis_tls_ca_file, "ssl_certfile": self.redis_tls_cert_file,
               "ssl_keyfile": self.redis_tls_key_file,
               "ssl_cert_reqs": "" if self.redis_tls_verify == "required" else self.redis_tls_verify,
               "ssl_check_hostname": "" if self.redis_tls_check_hostname else "false"}
        self.redis_url = with_tls_defaults(self.redis_url, tls)
        self.cache_redis_url = with_tls_defaults(self.cache_redis_url, tls)
        return self

    def model_copy(self, *, update=None, deep: bool = False) -> "Settings":
        # A copy with another URL (--redis-url, `up --redis-ha`) gets the TLS settings in it too:
        # model_copy runs no validator.
        return super().model_copy(update=update, deep=deep)._tls_in_redis_urls()

    @property
    def batch_dir(self) -> Path:
        return Path(self.batch_files_dir).expanduser() if self.batch_files_dir else self.data_dir / "batches"

    @property
    def model_dir(self) -> Path:
        if self.model:
            return Path(self.model).expanduser()
        return self.home / "models" / "SmolLM2-135M-Instruct"

    @property
    def store_dir(self) -> Path:
        return Path(self.model_store).expanduser() if self.model_store else self.home / "store"

    @property
    def cache_redis(self) -> str:
        return self.cache_redis_url or self.redis_url

    @property
    def task_threads(self) -> int:
        return self.worker_concurrency or 2 * self.max_batch

    @property
    def per_worker_target(self) -> int:
        return self.scale_target_per_worker or self.max_batch


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def openmp_spin(settings: EngineSettings) -> None:
    """Put the settings' OpenMP spin count in this process's environment, where libgomp reads it
    once, as torch loads it: call before anything imports torch (a later call changes nothing)."""
    if settings.openmp_spin_count > 0:
        os.environ.setdefault("GOMP_SPINCOUNT", str(settings.openmp_spin_count))


def torch_threads(settings: EngineSettings) -> int:
    """Threads for torch: the cores this process may really use (FACTS: oversubscription is ruinous)."""
    if settings.torch_threads > 0:
        return settings.torch_threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
