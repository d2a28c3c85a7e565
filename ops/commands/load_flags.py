"""The flags of `brigade bench serve` and `brigade capacity`, kept apart from the load test itself so
that building the command line imports neither httpx nor numpy."""
from __future__ import annotations

import argparse
import math

from ops.bench.conversations import CHARS_PER_TOKEN, ChatTurns
from ops.bench.serve_config import DEFAULT_NUM_REQUESTS

DEFAULT_TIMEOUT_S = 900.0
WORKLOADS = ("questions", "chat-turns")

CAPACITY_DESCRIPTION = """\
Workers needed for a traffic level, from `brigade bench serve --json` runs at several --rate values
against ONE worker. Each run is judged again against --slo from its per-request timings; the fastest
run that meets every objective gives a worker's good rate and its mean end-to-end latency T, and
K = ceil(QPS x T / concurrency per worker) = ceil(QPS / good rate per worker), shown step by step.
Exit 0 with a plan, 1 when no run meets the objectives, 2 for bad flags or files."""


def add_serve_arguments(p: argparse.ArgumentParser, title: str) -> None:
    """The flags of bench serve's load, on `bench serve` and `bench scale` (--url, --api-key,
    --max-tokens and --json are theirs: ops/commands/bench.py)."""
    g = p.add_argument_group(title)
    g.add_argument("--backend", choices=["ws", "openai"], default="ws",
                   help="Brigade's WebSocket, or the OpenAI streaming API (also vLLM's)")
    g.add_argument("--rate", type=float, default=math.inf,
                   help="requests per second, open loop (default: all at once, or closed loop with "
                        "--max-concurrency)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the gaps between arrivals (1 = Poisson, <1 burstier)")
    g.add_argument("--max-concurrency", type=int, help="requests in flight at most (closed loop without --rate)")
    g.add_argument("--num-requests", type=int, help=f"requests to send (default {DEFAULT_NUM_REQUESTS}, "
                                                    "unless --duration)")
    g.add_argument("--duration", type=float, help="send for this many seconds instead")
    g.add_argument("--dataset", help="JSONL of {\"messages\": [...], \"max_tokens\": N} (default: the shipped "
                                     "chat questions)")
    g.add_argument("--repeat-ratio", type=float, default=0.0,
                   help="share of requests that repeat an earlier one, word for word or reworded (0..1)")
    g.add_argument("--seed", type=int, default=0, help="seeds the question order and the arrivals")
    g.add_argument("--slo", help='objectives, e.g. "ttft_p95<=2s,tpot_p50<=0.2s,error_rate<=0.01"; '
                                 "exit 1 when one fails")
    g.add_argument("--plot", help="draw latency CDFs, latency and throughput over time into this PNG")
    g.add_argument("--model", help="the model asked (default: the server's first in /v1/models for openai, "
                                   "the gateway's for ws)")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0, greedy)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="ask every request to go on past its end-of-sequence token, so that each generates "
                        "exactly its max_tokens (vLLM's ignore_eos; a fixed output length for throughput runs)")
    g.add_argument("--cache", choices=["auto", "exact", "off"],
                   help="Brigade's cache field on every request (default: not sent; the server's default)")
    g.add_argument("--redis-url", help="also count this Redis's commands per request and per output token "
                                       "(INFO commandstats; every client's commands during the run count)")
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"hard limit on the whole run in seconds (default {DEFAULT_TIMEOUT_S:.0f}); requests "
                        "still running then count as client_timeout")
    g.add_argument("--workload", choices=WORKLOADS, default="questions",
                   help="questions: the dataset's requests, each on its own (default); chat-turns: conversations "
                        "that send their turns one after another with the growing history (the flags below)")
    _add_chat_turns_arguments(p)


def _add_chat_turns_arguments(p: argparse.ArgumentParser) -> None:
    """The chat-turns workload's size; its defaults are ChatTurns's (ops/bench/conversations.py)."""
    g = p.add_argument_group("--workload chat-turns (conversations; --max-concurrency counts conversations)")
    g.add_argument("--conversations", type=int, help="conversations, each asked its turns in order "
                                                     f"(default {ChatTurns.conversations})")
    g.add_argument("--turns", type=int, help="turns per conversation; turn k sends the system prompt, the earlier "
                                             "user turns with the answers the server gave, and user turn k: 2k "
                                             f"messages (default {ChatTurns.turns})")
    g.add_argument("--tenants", type=int, help="tenants, each with one system prompt its conversations share "
                                               "(conversation i is tenant i mod K's; default: one per conversation)")
    g.add_argument("--system-tokens", type=int, help="each tenant's system prompt, in tokens (about: sized at "
                                                     f"{CHARS_PER_TOKEN:g} characters a token, SmolLM2's reading of "
                                                     f"it; default {ChatTurns.system_tokens})")


def add_capacity_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("capacity", help="workers needed for a traffic level, from bench serve runs against one worker",
                       description=CAPACITY_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qps", type=float, required=True, help="the requests per second to serve")
    p.add_argument("--slo", required=True, help='objectives every run is judged by, e.g. "ttft_p95<=2s"')
    p.add_argument("--from", dest="runs", nargs="+", required=True, metavar="RUN.json",
                   help="bench serve --json reports of a sweep over --rate against one worker")
    p.add_argument("--json", help="also write the plan (JSON) to this file; - prints it instead of the text")
    return p
