# Over 400 lines: one subcommand per benchmark target, each target's flags beside the function that runs it.
"""`brigade bench <target>`: one subcommand per benchmark, each with its own flags, and what runs it.

Building the parser imports no benchmark (and so neither torch nor numpy): each target's code is
imported when that target runs. Every target but serve prints its report as JSON on stdout (and
into --json's file); serve prints its own report, and its exit code says whether the SLOs held.
"""
from __future__ import annotations

import argparse
import json
import sys

from ops.commands.cli_options import add_connection_options
from ops.commands.load_flags import add_serve_arguments
from ops.core.settings import Settings


def _max_tokens(parser: argparse.ArgumentParser, default: int | None, what: str) -> None:
    parser.add_argument("--max-tokens", type=int, default=default, help=f"new tokens per request ({what})")


def add_bench_parser(sub) -> argparse.ArgumentParser:
    """`brigade bench` and its targets, on the `brigade` parser's subcommands."""
    report = argparse.ArgumentParser(add_help=False)  # what every target shares
    report.add_argument("--json", help="also write the report to this file")
    bench = sub.add_parser("bench", help="benchmarks that print JSON",
                           description="Benchmarks that print JSON; `brigade bench TARGET --help` gives each one's flags.")
    targets = bench.add_subparsers(dest="target", required=True)

    p = targets.add_parser("engine", parents=[report], help="this engine against Hugging Face generate, "
                           "on the same model in one process (prefix reuse, long prompts, a peer)")
    p.add_argument("--n", default="1,16,32", help="comma-separated request counts (the first run a user makes: "
                   "about 6 minutes on 2 cores; --n 1,16,32,64 --full for every row)")
    p.add_argument("--compare", help="modes timed beside the default, comma-separated: a BRIGADE_DTYPE, with "
                   "-invariant for deterministic mode or -unpadded without it, and -mkl for ordinary float32 products "
                   "instead of weights read from their grid (default float32-mkl-invariant,float32-mkl,bfloat16; "
                   "'' for none)")
    p.add_argument("--full", action="store_true", help="HF generate timed at every N (not once on 4 requests), "
                   "and the long-prompt rows (16 streams while a 1,500-token prompt loads)")
    p.add_argument("--peer", choices=["llama-cpp"], help="a peer's engine benchmark beside the rows (llama-cpp: "
                   "llama-bench's pp512 and tg128 at the same thread count; `make bench-peers` builds it, else it is "
                   "built first)")
    p.add_argument("--split", action="store_true", help="only where a one-stream decode step's milliseconds go "
                   "(the layers' products, attention and norms, the head, the rest of the pass, sampling and the "
                   "engine's Python; ops/bench/step_split.py), with --peer beside it; about a minute")
    _max_tokens(p, 128, "default 128")

    _add_cache_targets(targets, report)
    _add_rerank_target(targets, report)
    _add_guided_target(targets, report)
    p = targets.add_parser("soak", parents=[report], help="many WebSocket clients for minutes against a fleet of "
                           "its own, a worker SIGKILLed every --kill-every seconds")
    p.add_argument("--clients", type=int, default=200, help="concurrent WebSocket clients")
    p.add_argument("--seconds", type=float, default=120, help="how long to keep asking")
    p.add_argument("--kill-every", type=float, default=30, help="SIGKILL a worker this often (seconds; 0: never)")
    p.add_argument("--kill-redis-primary", type=int, default=0, metavar="N",
                   help="run on a Redis primary + 2 replicas + 3 sentinels and SIGKILL the primary N times, "
                        "evenly spaced (the sentinels fail over; the killed node rejoins as a replica)")
    _max_tokens(p, 16, "default 16")

    _add_chaos_target(targets, report)

    p = targets.add_parser("doors", parents=[report], help="the same requests through each door of a running "
                           "gateway (WebSocket, OpenAI HTTP streaming and not)")
    p.add_argument("--rounds", type=int, default=20, help="requests through each door")
    _max_tokens(p, 16, "default 16")
    add_connection_options(p, gateway="http", api_key=True)

    p = targets.add_parser("serve", parents=[report], help="a load test against a running server (Brigade, vLLM "
                           "or any OpenAI-compatible one); exit 1 when an --slo objective fails")
    _max_tokens(p, None, "default: each dataset line's")
    add_serve_arguments(p, "the load")
    add_connection_options(p, gateway="http", api_key=True)  # also a ws:// --url
    _add_versus_arguments(p)

    p = targets.add_parser("scale", parents=[report], help="output tokens/s as the fleet grows: a `brigade up` "
                           "of its own per size, each under the same serve load")
    p.add_argument("--workers", default="1,2", help="fleet sizes to start in turn, each under the same load "
                   "(bench serve's flags below)")
    p.add_argument("--threads-per-worker", type=int, default=1, help="BRIGADE_TORCH_THREADS of each worker")
    p.add_argument("--routing", help="routing modes, comma-separated (shared, prefix): each fleet size is started "
                   "once per mode, with BRIGADE_ROUTING set to it, one row each (default: the fleet's own routing, "
                   "no routing column)")
    _max_tokens(p, None, "default: each dataset line's")
    add_serve_arguments(p, "the load on each fleet (bench serve's flags)")

    p = targets.add_parser("quality", parents=[report], help="the shipped questions in every precision mode against "
                           "Hugging Face in float32: accuracy, flips, answers that depend on how they are asked")
    p.add_argument("--dtype", help="comma-separated precision modes (default: every mode but auto)")
    p.add_argument("--questions", type=int, help="ask this many of the shipped questions (spread over the set; "
                   "default all)")
    p.add_argument("--consistency-questions", type=int, default=32, help="questions also asked alone, in a batch "
                   "of 16, after a prefix hit, resumed and chunked, per mode (slow: one at a time; 0 skips)")
    _max_tokens(p, 32, "default 32")
    return bench


def _add_versus_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("side by side (ops/bench/versus.py)")
    g.add_argument("--versus", choices=["llama-server"], help="start a Brigade of its own (one worker, the answer "
                   "cache off) and llama.cpp's server, and run the same streamed load against each: every "
                   "--prompt-lengths at every --concurrency with every --endings, 128 tokens per answer unless "
                   "--max-tokens, the setups taking turns row by row, --runs times; --num-requests per row "
                   "(default 2 x concurrency, at least 8)")
    g.add_argument("--concurrency", default="1,4,16,32", help="with --versus: requests in flight, one row each "
                   "(llama-server gets as many slots)")
    g.add_argument("--prompt-lengths", default="short,long", help="with --versus: short (about 64 tokens) and/or "
                   "long (about 1,000)")
    g.add_argument("--threads", type=int, help="with --versus: Brigade's worker's torch threads and llama-server's "
                   "-t (default: every core)")
    g.add_argument("--endings", default="ignore-eos,natural", help="with --versus: ignore-eos (exactly --max-tokens, "
                   "end tokens banned in both programs) and/or natural (up to twice --max-tokens, answers ending "
                   "where the model ends them)")
    g.add_argument("--brigade-speculation", default="on,off", help="with --versus: Brigade with its prompt-lookup "
                   "speculation (on) and/or without it (off), each a Brigade of its own")
    g.add_argument("--llama-spec", default="none,ngram-mod", help="with --versus: llama-server plain (none) and "
                   "with each of these --spec-type values (its draftless speculation); Brigade is compared with the "
                   "best of them in each run")
    g.add_argument("--runs", type=int, default=3, help="with --versus: each row this many times, the setups' order "
                   "reversed every other run (default 3); medians and spreads reported")


def _add_chaos_target(targets, report: argparse.ArgumentParser) -> None:
    p = targets.add_parser("chaos", parents=[report], help="WebSocket, SSE and batch load on a fleet of its own "
                           "(2 gateways, 2 workers, Redis primary + replica + 3 sentinels) while workers, the Redis "
                           "primary and a gateway are SIGKILLed and a worker is cut from Redis")
    p.add_argument("--seconds", type=float, default=600, help="how long to keep asking (default 600)")
    p.add_argument("--clients", type=int, default=200, help="WebSocket clients, round-robin over the gateways")
    p.add_argument("--sse-clients", type=int, default=20, help="OpenAI streaming chat clients (default 20)")
    p.add_argument("--batch-lines", type=int, default=1000, help="lines of the batch job submitted at the start")
    p.add_argument("--kill-worker-every", type=float, default=60, help="SIGKILL a worker this often and start it "
                   "again (seconds; 0: never)")
    p.add_argument("--kill-redis-primary", type=int, default=2, metavar="N", help="SIGKILL the Redis primary N times")
    p.add_argument("--kill-gateway", type=int, default=1, metavar="N", help="SIGKILL a gateway N times (the one "
                   "running the batch job), each started again")
    p.add_argument("--cut-seconds", type=float, default=30, help="cut one worker from Redis this long, its process "
                   "running on (a network namespace: needs root; 0: no cut)")
    p.add_argument("--model", help="the fleet's model folder (default: BRIGADE_MODEL, else "
                   "the default model); a small model's folder makes a quick run")
    p.add_argument("--batch-wait", type=float, default=600, help="after the load, how long the batch job may take "
                   "to finish (seconds)")
    _max_tokens(p, 16, "default 16")


def _add_rerank_target(targets, report: argparse.ArgumentParser) -> None:
    p = targets.add_parser("rerank", parents=[report], help="the embedding model's cosine against the pair model "
                           "as rerankers on held-out labelled duplicates (QQP and the chat pairs): top-1, MRR, time "
                           "per query (offline)")
    p.add_argument("pairs", help='JSONL question pairs ({"q1", "q2", "duplicate"}; QQP): each held-out duplicate\'s '
                   "q1 is a query, its q2 the true match")
    p.add_argument("--queries", type=int, default=600, help="queries drawn from the held-out QQP duplicates "
                   "(default 600; the chat pairs are used whole)")
    p.add_argument("--distractors", type=int, default=9, help="nearest other questions per query (default 9)")
    p.add_argument("--pool", type=int, default=8000, help="held-out QQP questions the distractors are chosen "
                   "from (default 8000)")
    p.add_argument("--seed", type=int, default=0, help="which queries and pool questions are drawn")
    p.add_argument("--threads", type=int, help="torch threads (default BRIGADE_EMBEDDING_THREADS, as the gateway)")
    p.add_argument("--timed", type=int, default=100, help="queries per pool embedded again whole, as a request "
                   "would be, for the embedding model's time (default 100)")


def _add_guided_target(targets, report: argparse.ArgumentParser) -> None:
    p = targets.add_parser("guided", parents=[report], help="guided decoding's token mask cost per token and "
                           "compile time, per spec kind, at batch 1 and 32 (offline: the tokenizer only)")
    p.add_argument("--libraries", default="xgrammar", help="comma-separated: xgrammar (Brigade's path, "
                   "engine/guided.py), xgrammar_own_apply, llguidance, outlines_core; or all")
    p.add_argument("--repeats", type=int, default=5, help="walks of each answer per batch size (default 5)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for the apply (default 1: steadier on "
                   "a shared host)")
    p.add_argument("--engine", action="store_true", help="also time the engine's decode step with and without a "
                   "guide, at batch 1 and 32 (loads the default model; about a minute)")


def _add_cache_targets(targets, report: argparse.ArgumentParser) -> None:
    """The answer cache's benchmarks: lookup cost (`cache`), live hits (`cache-replay`), vetoes."""
    p = targets.add_parser("cache", parents=[report], help="cache hit latency over a running gateway's WebSocket, "
                           "and lookup cost by index size")
    p.add_argument("--pairs", help="(required) JSONL question pairs whose duplicates are asked as rewordings")
    p.add_argument("--repeats", type=int, default=200, help="exact hits to time")
    p.add_argument("--semantic-pairs", type=int, default=200, help="duplicate pairs to ask")
    p.add_argument("--sizes", default="1000,10000,100000", help="index sizes for lookup cost")
    add_connection_options(p, gateway="http", api_key=True)

    p = targets.add_parser("cache-replay", parents=[report], help="the answer cache measured live: labelled "
                           "pairs replayed through a running gateway (exact repeats, rewordings, look-alikes); hit "
                           "rate, wrong hits, compute saved")
    p.add_argument("--pairs", help="JSONL {q1, q2, duplicate}: duplicate q2s are asked as rewordings, the others as "
                   "look-alikes (default: ops/data/chat_paraphrases.jsonl)")
    p.add_argument("--limit", type=int, help="read only the first N pairs")
    p.add_argument("--repeat-ratio", type=float, default=0.3, help="the share of the replay that repeats a q1 word "
                   "for word (default 0.3)")
    p.add_argument("--seed", type=int, default=0, help="the replay's order and which q1s repeat")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    p.add_argument("--temperature", type=float, default=0.0, help="default 0: greedy answers, which the cache stores")
    p.add_argument("--cache-threshold", type=float, help="sent as each replayed request's cache_threshold (the hit "
                   "rule's threshold for that request; default: the gateway's)")
    p.add_argument("--store-timeout", type=float, default=60, help="seconds to wait for the answers of the fill "
                   "to be stored (default 60)")
    p.add_argument("--rounds", type=int, default=1, help="deal the sources into N rounds and read the cache's "
                   "evidence (audited wrong hits, learned thresholds) after each; needs the cache's Redis "
                   "(--redis-url) and the gateway's BRIGADE_CACHE_MAX_ERROR")
    p.add_argument("--settle", type=float, default=6.0, help="with --rounds: seconds without new evidence before "
                   "it is read (audits run after the hits they check; default 6)")
    _max_tokens(p, 48, "default 48, as the shipped pairs' answers")
    add_connection_options(p, gateway="http", api_key=True, redis="cache_redis_url")  # also a ws:// --url
    # `guards`: its name before the cache's vetoes were told apart from the content guards.
    p = targets.add_parser("vetoes", aliases=["guards"], parents=[report], help="how often the cache's lexical "
                           "vetoes refuse a hit, on labelled question pairs: rewordings refused, look-alikes caught "
                           "(offline)")
    p.add_argument("pairs", nargs="+", help='JSONL question pairs ({"q1", "q2", "duplicate"}), each file '
                   "reported on its own")
    p.add_argument("--limit", type=int, help="at most this many pairs of each label from each file")
    p.add_argument("--generated", type=int, default=0, help="also this many look-alikes generated from the first "
                   "file's questions (ops/training/pair_model/lookalikes.py), by the kind of "
                   "change")


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Run the target `args` names; its report printed as JSON (and written to --json)."""
    if args.target == "serve" and args.versus:
        from ops.bench.versus import main as bench_versus

        return bench_versus(args, settings)
    if args.target == "serve":  # prints its own report, and its exit code says whether the SLOs held
        from ops.bench.serve import main as bench_serve

        return bench_serve(args, settings)
    bench = {"engine": _engine, "cache": _cache, "cache-replay": _cache_replay, "vetoes": _vetoes,
             "guards": _vetoes, "soak": _soak,
             "chaos": _chaos, "doors": _doors, "scale": _scale,
             "quality": _quality, "guided": _guided, "rerank": _rerank}[args.target]
    report = bench(args, settings)
    if isinstance(report, int):  # an exit code: the flags were wrong, and it said why
        return report
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    return 0


def _engine(args, settings: Settings) -> dict | int:
    from engine import Engine
    from ops.bench.engine import DEFAULT_COMPARE, run
    from workers.engine_loading import engine_config

    llama_bench = None
    if args.peer == "llama-cpp":  # built (minutes) before anything is timed, or the command stops here
        from ops.bench.llama_cpp_build import PeerUnavailable, ensure_built

        try:
            llama_bench = ensure_built(settings.peers_dir)["llama-bench"]
        except PeerUnavailable as exc:
            print(f"brigade bench engine --peer llama-cpp: {exc}", file=sys.stderr)
            return 2
    engine = Engine.load(engine_config(settings))
    if args.split:
        from ops.bench import step_split
        from ops.bench.versus import cpu_kind

        report = {"target": "engine-split", "cpu": cpu_kind(), "brigade": step_split.split(engine, args.max_tokens)}
        if llama_bench is not None:
            from ops.bench.peer_llama_cpp import run as peer_run

            import torch

            peer = peer_run(llama_bench, torch.get_num_threads())
            report["llama_cpp"] = {**peer, "step_ms": round(1000 / peer["generation_tok_s"], 3)}
        return report
    compare = tuple(m for m in (args.compare or "").split(",") if m) if args.compare is not None else DEFAULT_COMPARE
    return run(engine, [int(n) for n in args.n.split(",")], args.max_tokens, llama_bench, compare,
               full_baseline=args.full, long_rows=args.full)


def _cache(args, settings: Settings) -> dict | int:
    if not args.pairs:
        print("brigade bench cache needs --pairs FILE: labelled question pairs, one JSON object a line "
              '({"q1": ..., "q2": ..., "duplicate": true|false}); its duplicates are asked as rewordings',
              file=sys.stderr)
        return 2
    from ops.bench.cache import run
    from ops.bench.serve_config import target_urls

    ws_url = target_urls("ws", args.url, settings)[0] if args.url else None  # any form of the gateway's URL
    return run(settings, args.repeats, args.pairs, args.semantic_pairs, [int(n) for n in args.sizes.split(",") if n],
               ws_url, args.api_key)


def _cache_replay(args, settings: Settings) -> dict | int:
    from ops.bench.cache_replay import ReplayConfig, default_pairs_path, run
    from ops.bench.serve_backends import CannotReach
    from ops.bench.serve_config import target_urls
    from ops.training.pair_model.pairs import read_pairs

    if not 0 <= args.repeat_ratio < 1 or min(args.concurrency, args.rounds) < 1 or (args.limit is not None
                                                                                   and args.limit < 1):
        print("brigade bench cache-replay: --repeat-ratio is from 0 up to (not including) 1, --concurrency, "
              "--rounds and --limit at least 1", file=sys.stderr)
        return 2
    path = args.pairs or str(default_pairs_path())
    try:
        pairs = read_pairs(path, args.limit)
    except (OSError, ValueError, KeyError) as exc:
        print(f"brigade bench cache-replay: {path} is not a pair file (one {{q1, q2, duplicate}} a line): {exc!r}",
              file=sys.stderr)
        return 2
    if not pairs:
        print(f"brigade bench cache-replay: {path} holds no pairs", file=sys.stderr)
        return 2
    config = ReplayConfig(target_urls("ws", args.url, settings)[0], args.pairs, args.limit, args.repeat_ratio, args.seed,
                          args.concurrency, args.max_tokens, args.temperature, args.cache_threshold,
                          args.store_timeout, args.api_key, args.rounds)
    from ops.commands.cache import settled_evidence

    evidence = (lambda: settled_evidence(settings, quiet_s=args.settle)) if args.rounds > 1 else None
    try:
        return run(config, pairs, evidence)
    except CannotReach as exc:
        print(f"brigade bench cache-replay: {exc}", file=sys.stderr)
        return 2


def _soak(args, settings: Settings) -> dict:
    from ops.bench.soak import run

    return run(args.clients, args.seconds, args.kill_every, args.max_tokens, redis_primary_kills=args.kill_redis_primary)


def _chaos(args, settings: Settings) -> dict:
    from ops.bench.chaos import ChaosConfig, run

    return run(ChaosConfig(args.seconds, args.clients, args.sse_clients, args.batch_lines, args.kill_worker_every,
                           args.kill_redis_primary, args.kill_gateway, args.cut_seconds, args.max_tokens, args.model,
                           args.batch_wait))


def _doors(args, settings: Settings) -> dict:
    from ops.bench.doors import run

    return run(settings, args.url, args.rounds, args.max_tokens, args.api_key)


def _scale(args, settings: Settings) -> dict | int:
    from ops.bench.scale import parse_routings, parse_sizes, run
    from ops.bench.serve_config import config_from_args

    try:
        sizes, routings, load = parse_sizes(args.workers), parse_routings(args.routing), config_from_args(args, settings)
    except ValueError as exc:
        print(f"brigade bench scale: {exc}", file=sys.stderr)
        return 2
    return run(sizes, load, settings, args.threads_per_worker, routings=routings)


def _vetoes(args, settings: Settings) -> dict:
    from ops.bench.vetoes import run

    return run(args.pairs, args.limit, args.generated)


def _rerank(args, settings: Settings) -> dict:
    from ops.bench.rerank import RerankBench, run

    bench = RerankBench(args.pairs, args.queries, args.distractors, args.pool, args.seed,
                        args.threads or settings.embedding_threads, args.timed)
    return run(bench, settings, progress=lambda line: print(f"brigade bench rerank: {line}", file=sys.stderr))


def _guided(args, settings: Settings) -> dict:
    from ops.bench.guided import run_on_model

    report = run_on_model(settings.model_dir, args.libraries, args.repeats, args.threads)
    if args.engine:
        from ops.bench import guided_engine
        from workers.engine_loading import load_engine

        report["engine"] = guided_engine.run(load_engine(settings))
    return report


def _quality(args, settings: Settings) -> dict | int:
    import dataclasses

    from engine import Engine
    from engine.placement import PlacementError, resolve
    from ops.bench.quality import QualityConfig, default_modes, run
    from workers.engine_loading import engine_config

    # Loaded in float32: the same model object is Hugging Face's reference and every mode's source.
    config = dataclasses.replace(engine_config(settings), dtype="float32", max_batch=32)
    modes = tuple(m.strip() for m in args.dtype.split(",") if m.strip()) if args.dtype else default_modes()
    try:
        for mode in modes:  # a typo fails now, not after the reference run
            resolve(config.device, mode)
    except PlacementError as exc:
        print(f"brigade bench quality: {exc}", file=sys.stderr)
        return 2

    def checkpoint(partial: dict) -> None:  # --json holds what was measured so far
        if args.json:
            with open(args.json, "w") as fh:
                fh.write(json.dumps(partial, indent=2) + "\n")

    return run(Engine.load(config), QualityConfig(modes, args.max_tokens, args.questions, args.consistency_questions),
               checkpoint=checkpoint)
