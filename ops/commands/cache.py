"""`brigade cache ...`: warm, stats, clear, forget, eval, train-verifier."""
from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path

from ops.commands.cli_options import add_connection_options
from ops.core.jsonl import JsonLinesError, numbered_rows
from ops.core.settings import GatewaySettings, Settings
from ops.training.pair_model.bounds import Targets
from ops.training.pair_model.pairs import CHAT_TEST, CHAT_TUNE


def _store(settings: Settings):
    """The entries alone, for commands that need no embedding model."""
    from cache.store import EntryStore
    from ops.core.redis_clients import async_client

    return EntryStore(async_client(settings.cache_redis), settings)


async def stats(settings: Settings) -> dict:
    from ops.core import redis_keys
    from ops.core.redis_clients import async_client

    r = async_client(settings.cache_redis)
    counters = {k: int(v) for k, v in (await r.hgetall(redis_keys.CACHE_STATS)).items()}
    entries = await r.zcard(redis_keys.CACHE_LRU)
    namespaces = {}
    async for key in r.scan_iter(match=redis_keys.CACHE_NAMESPACE_PATTERN, count=1000):
        namespaces[key.rsplit(":", 1)[1]] = await r.scard(key)
    sample = [k async for k in r.scan_iter(match=redis_keys.CACHE_ENTRY_PATTERN, count=1000)][:500]
    sampled = [await r.memory_usage(k) or 0 for k in sample]
    memory = int(sum(sampled) / len(sampled) * entries) if sampled else 0
    hits = counters.get("exact_hits", 0) + counters.get("semantic_hits", 0)
    lookups = hits + counters.get("misses", 0) + counters.get("pool_fills", 0)
    evidence = await evidence_report(settings)
    await r.aclose()
    return {
        "entries": entries,
        "namespaces": namespaces,
        "hits": {"exact": counters.get("exact_hits", 0), "semantic": counters.get("semantic_hits", 0)},
        "misses": counters.get("misses", 0),
        "hit_rate": round(hits / lookups, 4) if lookups else 0.0,
        "pool_fills": counters.get("pool_fills", 0),
        "inserts": counters.get("inserts", 0),
        "samples": counters.get("samples", 0),
        "aliases": counters.get("aliases", 0),
        "evictions": counters.get("evictions", 0),
        "expirations": counters.get("expirations", 0),
        "memory_bytes_estimate": memory,
        "evidence": evidence,
    }


async def evidence_report(settings: Settings) -> dict:
    """What the cache has learned: observations by source, the thresholds they support against the
    trained ones, and the served hits' error rate with its interval (cache/evidence.py)."""
    from cache.evidence import SOURCES, Floor, learn, served_error
    from cache.hit_rule import point_from
    from cache.pair_model import PAIR_WEIGHTS, stored_info

    observations = await _store(settings).observations()
    report: dict = {"observations": {s: sum(o.source == s for o in observations) for s in SOURCES},
                    "max_error": settings.cache_max_error, "served_error": served_error(observations)}
    path = Path(settings.cache_pair_model) if settings.cache_pair_model else PAIR_WEIGHTS
    if settings.cache_verifier and path.exists():
        info = stored_info(path)
        trained, floor = point_from(info.get("operating_point", {}), settings), Floor.of(info)
        learned = learn(observations, trained, settings.cache_max_error, floor)
        report.update(trained=trained.__dict__, floor=floor.__dict__, serving=learned.point.__dict__, why=learned.why)
    return report


async def settled_evidence(settings: Settings, quiet_s: float = 6.0, timeout_s: float = 180.0) -> dict:
    """The evidence once no observation has arrived for `quiet_s` (audits run in the batch lane,
    after the hits they check), or at `timeout_s`."""
    import time

    deadline = time.monotonic() + timeout_s
    report = await evidence_report(settings)
    last, since = sum(report["observations"].values()), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        await asyncio.sleep(1.0)
        report = await evidence_report(settings)
        if (seen := sum(report["observations"].values())) != last:
            last, since = seen, time.monotonic()
    return report


async def warm(settings: GatewaySettings, path: str, concurrency: int, url: str | None = None,
               api_key: str | None = None) -> dict:
    """Ask every question of a JSONL file through the gateway, so the answers land in the cache."""
    from websockets.asyncio.client import connect

    items = []
    for n, d in numbered_rows(path):
        if isinstance(d, str):
            d = {"question": d}
        if "question" in d:
            d["messages"] = [{"role": "user", "content": d.pop("question")}]
        d.update(type="generate", id=f"warm-{n - 1}")  # counted from 0, as before
        # Only deterministic answers are stored, and the model's default may sample: a line
        # without a temperature is warmed greedily (the answer later greedy requests hit).
        d.setdefault("temperature", 0)
        items.append(d)
    result = {"questions": len(items), "answered": 0, "already_cached": 0, "errors": 0}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with connect(url or settings.ws_url, additional_headers=headers, max_size=None) as ws:
        pending: set[str] = set()
        queue = list(items)

        async def fill():
            while queue and len(pending) < concurrency:
                item = queue.pop(0)
                pending.add(item["id"])
                await ws.send(json.dumps(item))

        await fill()
        while pending:
            event = json.loads(await ws.recv())
            if event.get("type") == "done" and event.get("id") in pending:
                pending.discard(event["id"])
                result["already_cached" if event.get("cached") else "answered"] += 1
            elif event.get("type") == "error":
                pending.discard(event.get("id"))
                result["errors"] += 1
                print(f"error for {event.get('id')}: {event.get('code')} {event.get('message')}", file=sys.stderr)
            await fill()
    return result


PAIR_WEIGHTS_DEFAULT = Path(__file__).resolve().parents[2] / "cache" / "pair_model.safetensors"


async def forget(settings: Settings, entries: list[str], asked: str | None) -> int:
    """Evict entries through the same path as a user's feedback (no embedding model needed)."""
    store = _store(settings)
    out = {}
    for entry_id in entries:
        out[entry_id] = await store.forget(entry_id, asked)
    print(json.dumps({"forgotten": out}))
    return 0 if all(out.values()) else 1


def evaluate(settings: Settings, args) -> int:
    from cache.answer_cache import AnswerCache
    from ops.training.pair_model.evaluation import evaluate as run_eval, read_verdicts
    from ops.training.pair_model.pairs import read_pairs, split_for

    files = {k: getattr(args, k) for k in ("duplicates", "lookalikes", "paraphrases") if getattr(args, k)}
    if args.judge:
        return evaluate_judge(settings, args)
    if not files:
        print("brigade cache eval needs at least one labelled file: --duplicates, --lookalikes, --paraphrases "
              'or --judge (JSONL lines {"q1": ..., "q2": ..., "duplicate": true|false})', file=sys.stderr)
        return 2
    pairs, labels = {}, {}
    for kind, path in files.items():
        labels[kind] = read_pairs(path)  # every split's labels group the questions (precision by labels)
        chosen = [p for p in labels[kind] if args.split == "all" or split_for(kind)(p) == args.split]
        pairs[kind] = chosen[:args.limit] if args.limit else chosen
    try:
        verdicts = read_verdicts(args.verdicts) if args.verdicts else None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"brigade cache eval --verdicts {args.verdicts}: {exc!r}; each line is "
              '{"key": ..., "same": true|false} (ops/data/README.md)', file=sys.stderr)
        return 2
    report = run_eval(AnswerCache(settings, connect=False), pairs, labels, verdicts)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"semantic layer: {report['semantic']}  operating point: {report['operating_point']}")
    for kind in pairs:
        section = report[kind]
        print(f"{kind}: {json.dumps(section['default'])}  decision p50 {section['decision_ms_p50']} ms")
    return 0


def evaluate_judge(settings: Settings, args) -> int:
    from cache.embedder import Embedder
    from ops.training.pair_model.judging import report
    from ops.training.pair_model.pairs import read_pairs

    embedder = Embedder.for_settings(settings)  # the gateway's, as it judges live
    out = {}
    for path in args.judge:
        pairs = read_pairs(path, args.limit)
        try:
            out[path] = report(pairs, embedder, settings.cache_judge_margin)
        except ValueError as exc:
            print(f"brigade cache eval --judge {path}: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(out, indent=2))
    return 0


def run(args, settings: Settings) -> int:
    if args.cache_command == "stats":
        print(json.dumps(asyncio.run(stats(settings)), indent=2))
    elif args.cache_command == "clear":
        store = _store(settings)
        removed = asyncio.run(store.clear(args.namespace))
        print(json.dumps({"removed": removed, "namespace": args.namespace}))
    elif args.cache_command == "warm":
        try:
            print(json.dumps(asyncio.run(warm(settings, args.file, args.concurrency, args.url, args.api_key))))
        except JsonLinesError as exc:  # the user's file: say where, not a traceback
            print(f"brigade cache warm: {exc}", file=sys.stderr)
            return 2
    elif args.cache_command == "forget":
        return asyncio.run(forget(settings, args.entries, args.asked))
    elif args.cache_command == "eval":
        return evaluate(settings, args)
    elif args.cache_command == "train-verifier":
        from ops.training.pair_model.training import Targets, train_verifier

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        targets = Targets(args.max_lookalikes_bound, args.max_kind_bound, args.max_paws_bound,
                          args.max_paraphrase_wrong_bound, args.min_long_recall, args.max_lookalikes_rate)
        report = train_verifier(settings, args.duplicates, args.lookalikes, args.steps, Path(args.out),
                                args.paraphrases, args.hard_negatives, targets, skip_training=args.tune_only,
                                chat_tune_files=args.chat_tune, chat_test_files=args.chat_test,
                                init=Path(args.init) if args.init else None, lr=args.lr,
                                chat_pairs_files=args.chat_pairs or [], resume=Path(args.resume) if args.resume else None,
                                checkpoint_every=args.checkpoint_every, max_duplicates=args.max_duplicates,
                                train_only=args.train_only, chat_repeats=args.chat_repeats,
                                calibrate=not args.no_length_calibration, base=args.base, threads=args.threads,
                                report_test=not args.no_test_report)
        print(json.dumps(report, indent=2))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="the answer cache: warm, stats, clear, forget, eval, train-verifier")
    cs = p.add_subparsers(dest="cache_command", required=True)
    w = cs.add_parser("warm", help="answer a JSONL list of questions through the workers ahead of traffic")
    w.add_argument("file", help='lines of {"question": ...} or {"messages": [...]} (+ optional sampling fields)')
    w.add_argument("--concurrency", type=int, default=8)
    add_connection_options(w, gateway="ws", api_key=True)
    s = cs.add_parser("stats", help="entries, hits by layer, hit rate, memory")
    c = cs.add_parser("clear", help="remove every entry, or one namespace's")
    c.add_argument("--namespace")
    f = cs.add_parser("forget", help="evict entries whose answers were wrong (and learn from it)")
    f.add_argument("entries", nargs="+", help="entry ids (a cached answer's `done` event names its `entry`)")
    f.add_argument("--asked", help="the question that got the wrong answer: kept as a hard negative for "
                                   "the next train-verifier")
    e = cs.add_parser("eval", help="how often semantic hits answer the question asked (offline; no Redis)")
    e.add_argument("--duplicates", help='JSONL {"q1","q2","duplicate"}: duplicate questions (precision, recall)')
    e.add_argument("--lookalikes", help="JSONL pairs of look-alike texts (share served when they differ)")
    e.add_argument("--paraphrases", help="pairs that all mean the same, JSONL or GPTCache's mock_data.json "
                                         "(recall, share served another entry)")
    e.add_argument("--split", choices=["all", "test", "tune"], default="all",
                   help="evaluate every pair, or only the held-out split train-verifier never trained on")
    e.add_argument("--judge", nargs="+", help="pair files whose q1s carry the model's answers (python -m "
                   "ops.training.pair_model.answer_pairs): how the evidence's judge reads each kind at BRIGADE_CACHE_JUDGE_MARGIN "
                   "(rewordings read as not fitting, look-alikes caught)")
    e.add_argument("--limit", type=int, help="at most this many pairs per file")
    e.add_argument("--verdicts", help="a person's verdicts on the --duplicates hits (JSONL, e.g. "
                                      "ops/data/qqp_test_verdicts.jsonl): adds the precision by reading")
    e.add_argument("--json", action="store_true")
    t = cs.add_parser("train-verifier", help="fine-tune the pair model and tune the hit rule (offline; hours on CPU)")
    t.add_argument("--duplicates", required=True, help="JSONL duplicate-question pairs (e.g. QQP)")
    t.add_argument("--lookalikes", required=True, help="JSONL look-alike pairs (e.g. PAWS)")
    t.add_argument("--paraphrases", help="paraphrase pairs (JSONL, or GPTCache's mock_data.json): never trained "
                                         "on; half tunes the operating point, half is reported")
    t.add_argument("--hard-negatives", help='JSONL {"q1","q2","duplicate": false}; default: those users '
                                            "reported, read from Redis when it answers")
    t.add_argument("--steps", type=int, default=6500, help="optimizer steps of 32 pairs")
    t.add_argument("--lr", type=float, default=5e-5, help="peak learning rate")
    t.add_argument("--init", help="start from this trained pair-model file instead of the base model "
                                  "(a second round)")
    t.add_argument("--chat-pairs", nargs="+", help="JSONL pair files trained on whole (already split by source: "
                                                   "give train files, e.g. ops/data/chat_pairs_train.jsonl "
                                                   "ops/data/chat_adversaries_train.jsonl)")
    t.add_argument("--base", help="a local Hugging Face BERT folder to start from instead of the installed "
                                  "all-MiniLM-L6-v2 (to measure the choice of base model; the file records it)")
    t.add_argument("--threads", type=int, default=2, help="torch threads for training")
    t.add_argument("--chat-repeats", type=int, default=4, help="times each --chat-pairs pair is in the examples")
    t.add_argument("--max-duplicates", type=int, help="train on at most this many duplicate-file pairs")
    t.add_argument("--resume", help="checkpoint folder: saved to every --checkpoint-every steps, and "
                                    "continued from when it holds a checkpoint")
    t.add_argument("--checkpoint-every", type=int, default=500)
    t.add_argument("--train-only", action="store_true", help="train and save; leave the operating point alone")
    t.add_argument("--chat-tune", nargs="+", default=list(CHAT_TUNE), help="chat rewordings and look-alikes the "
                   "operating point is tuned on (split from --chat-test by source question)")
    t.add_argument("--chat-test", nargs="+", default=list(CHAT_TEST), help="chat rewordings and look-alikes reported")
    targets = Targets()
    t.add_argument("--max-lookalikes-bound", type=float, default=targets.max_lookalikes_bound,
                   help="95%% upper bound the chat look-alikes served may reach (all kinds, tune files)")
    t.add_argument("--max-lookalikes-rate", type=float, default=targets.max_lookalikes_rate,
                   help="share of the chat look-alikes (all kinds, tune files) a point may serve, beside its bound")
    t.add_argument("--max-kind-bound", type=float, default=targets.max_kind_bound,
                   help="95%% upper bound each kind of chat look-alike served may reach on its own")
    t.add_argument("--max-paws-bound", type=float, default=targets.max_paws_bound,
                   help="95%% upper bound the PAWS pairs that mean something else served may reach (tune split)")
    t.add_argument("--max-paraphrase-wrong-bound", type=float, default=targets.max_paraphrase_wrong_bound)
    t.add_argument("--min-long-recall", type=float, default=targets.min_long_recall,
                   help="share of the chat tune files' long reworded statements (15+ words) a point must serve "
                   "their own answer (0: no such goal)")
    t.add_argument("--no-length-calibration", action="store_true", help="keep the pair model's scores as they are "
                   "(default: fit its length calibration on the tune sets before choosing the point)")
    t.add_argument("--tune-only", action="store_true", help="keep --out's weights; choose the operating point again")
    t.add_argument("--no-test-report", action="store_true", help="choose the operating point and leave the "
                   "test files unread (to choose among several trained files on tune alone)")
    t.add_argument("--out", default=str(PAIR_WEIGHTS_DEFAULT))
    for leaf in (s, c, f, t):  # t: the hard negatives users reported, when the cache's Redis answers
        add_connection_options(leaf, redis="cache_redis_url")
