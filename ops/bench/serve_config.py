"""What a `brigade bench serve` run is aimed at and how hard: the load's configuration, the endpoint
found from --url (or the settings' gateway), and the flags checked into a LoadConfig. Two workloads:
the dataset's questions, each request on its own (the default), and chat-turns (conversations.py).

Pure: flags in, a frozen configuration out; nothing here opens a socket.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from urllib.parse import urlparse, urlunparse

from ops.bench.conversations import ChatTurns
from ops.core.redaction import redact_url
from ops.core.settings import GatewaySettings, Settings

DEFAULT_NUM_REQUESTS = 100
CHAT_TURNS_FLAGS = ("conversations", "turns", "tenants", "system_tokens")  # conversations.py's ChatTurns


@dataclass(frozen=True)
class LoadConfig:
    backend: str  # ws | openai
    url: str  # the endpoint requests go to
    http_base: str  # http(s)://host:port, for /v1/models and /readyz
    model: str | None
    rate: float  # requests per second; inf: all at once (or as slots free, with max_concurrency)
    burstiness: float
    max_concurrency: int | None
    num_requests: int | None
    duration_s: float | None
    max_tokens: int | None
    dataset: str | None
    repeat_ratio: float
    seed: int
    temperature: float
    cache: str | None  # sent as Brigade's `cache` field when set
    timeout_s: float
    ignore_eos: bool = False  # sent as `ignore_eos: true` on every request (vLLM's field; Brigade's too)
    logit_bias: dict[int, float] | None = None  # sent as the OpenAI API's `logit_bias` on every request
    api_key: str | None = None
    redis_url: str | None = None  # count this Redis's commands during the run (INFO commandstats)
    chat_turns: ChatTurns | None = None  # the chat-turns workload; None: the dataset's questions
    workers_redis_url: str | None = None  # chat-turns: the workers' heartbeats, for their prefix-cache counters

    def to_json(self) -> dict:
        if self.max_concurrency and math.isinf(self.rate):
            arrivals = "closed loop"
        elif math.isinf(self.rate):
            arrivals = "all at once"
        else:
            arrivals = "poisson" if self.burstiness == 1 else "gamma"
        out = {"backend": self.backend, "url": redact_url(self.url), "model": self.model,
               "rate": None if math.isinf(self.rate) else self.rate, "arrivals": arrivals,
               "burstiness": self.burstiness, "max_concurrency": self.max_concurrency,
               "num_requests": self.num_requests, "duration_s": self.duration_s, "max_tokens": self.max_tokens,
               "dataset": self.dataset or "shipped:chat_questions.jsonl", "repeat_ratio": self.repeat_ratio,
               "seed": self.seed, "temperature": self.temperature, "cache": self.cache, "timeout_s": self.timeout_s,
               "ignore_eos": self.ignore_eos, "logit_bias": self.logit_bias}
        if self.chat_turns is not None:  # conversations, not the dataset's questions
            del out["dataset"], out["repeat_ratio"]
            out["workload"] = self.chat_turns.to_json()
        return out


def target_urls(backend: str, url: str | None, settings: GatewaySettings) -> tuple[str, str]:
    """(the endpoint, the HTTP base) from --url (a base such as http://host:port, with or without /v1,
    or a ws:// URL) or the settings' gateway."""
    if not url:
        base = settings.http_url
    else:
        parts = urlparse(url if "://" in url else f"http://{url}")
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        path = parts.path.rstrip("/")
        for suffix in ("/v1/ws", "/v1/chat/completions", "/v1"):
            if path.endswith(suffix):
                path = path[: -len(suffix)]
                break
        base = urlunparse((scheme, parts.netloc, path, "", "", ""))
    if backend == "ws":
        return base.replace("http", "ws", 1) + "/v1/ws", base
    return base + "/v1/chat/completions", base

def config_from_args(args, settings: Settings) -> LoadConfig:
    """Checks the flags; raises ValueError with a message for the user."""
    if args.rate <= 0 or args.burstiness <= 0:
        raise ValueError("--rate and --burstiness must be positive")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be at least 1")
    if args.num_requests is not None and args.num_requests < 1:
        raise ValueError("--num-requests must be at least 1")
    if args.duration is not None and args.duration <= 0:
        raise ValueError("--duration must be positive")
    if not 0 <= args.repeat_ratio <= 1:
        raise ValueError("--repeat-ratio is between 0 and 1")
    if args.timeout <= 0:
        raise ValueError("--timeout must be positive")
    if args.duration is not None and math.isinf(args.rate) and not args.max_concurrency:
        raise ValueError("--duration needs --rate or --max-concurrency (at an unbounded rate it would never stop sending)")
    chat_turns = chat_turns_from_args(args)
    if chat_turns is not None:
        num_requests = chat_turns.requests
    else:
        num_requests = args.num_requests if args.num_requests or args.duration else DEFAULT_NUM_REQUESTS
    url, http_base = target_urls(args.backend, args.url, settings)
    return LoadConfig(
        backend=args.backend, url=url, http_base=http_base, model=args.model, rate=args.rate,
        burstiness=args.burstiness, max_concurrency=args.max_concurrency, num_requests=num_requests,
        duration_s=args.duration, max_tokens=args.max_tokens, dataset=args.dataset, repeat_ratio=args.repeat_ratio,
        seed=args.seed, temperature=args.temperature, cache=args.cache, timeout_s=args.timeout,
        ignore_eos=args.ignore_eos, api_key=args.api_key,
        redis_url=args.redis_url, chat_turns=chat_turns,
        # The heartbeats are where `brigade status` reads them: --redis-url, else the settings' Redis.
        workers_redis_url=(args.redis_url or settings.redis_url) if chat_turns else None)


def chat_turns_from_args(args) -> ChatTurns | None:
    """The chat-turns workload of --workload chat-turns (its flags' defaults are ChatTurns's); None
    for the questions workload. Refuses the flags of the workload not chosen."""
    given = {name: getattr(args, name) for name in CHAT_TURNS_FLAGS if getattr(args, name) is not None}
    if args.workload != "chat-turns":
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags}: only with --workload chat-turns")
        return None
    theirs = [flag for flag, set_ in (("--rate", not math.isinf(args.rate)), ("--burstiness", args.burstiness != 1),
                                      ("--num-requests", args.num_requests is not None),
                                      ("--duration", args.duration is not None),
                                      ("--dataset", args.dataset is not None),
                                      ("--repeat-ratio", args.repeat_ratio != 0)) if set_]
    if theirs:
        raise ValueError(f"{', '.join(theirs)}: not with --workload chat-turns, which sends --conversations x "
                         "--turns requests, each conversation's turns one after another, --max-concurrency "
                         "conversations at a time")
    return ChatTurns(**given, seed=args.seed)
