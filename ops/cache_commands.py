"""`brigade cache ...`: warm, stats, clear, eval, train-verifier."""
from __future__ import annotations

import asyncio
import json
import sys

from ops.settings import Settings


def _cache(settings: Settings):
    from cache.answer_cache import AnswerCache

    return AnswerCache(settings)


def _store(settings: Settings):
    """The entries alone, for commands that need no embedding model."""
    import redis.asyncio as aioredis

    from cache.store import EntryStore

    client = aioredis.Redis.from_url(settings.cache_redis, decode_responses=True)
    return EntryStore(client, settings.cache_ttl_s, settings.cache_max_entries, settings.cache_log_maxlen)


async def stats(settings: Settings) -> dict:
    import redis.asyncio as aioredis

    from ops import keys

    r = aioredis.Redis.from_url(settings.cache_redis, decode_responses=True)
    counters = {k: int(v) for k, v in (await r.hgetall(keys.CACHE_STATS)).items()}
    entries = await r.zcard(keys.CACHE_LRU)
    namespaces = {}
    async for key in r.scan_iter(match=keys.CACHE_NAMESPACE_PATTERN, count=1000):
        namespaces[key.rsplit(":", 1)[1]] = await r.scard(key)
    sample = [k async for k in r.scan_iter(match=keys.CACHE_ENTRY_PATTERN, count=1000)][:500]
    sampled = [await r.memory_usage(k) or 0 for k in sample]
    memory = int(sum(sampled) / len(sampled) * entries) if sampled else 0
    hits = counters.get("exact_hits", 0) + counters.get("semantic_hits", 0)
    lookups = hits + counters.get("misses", 0)
    await r.aclose()
    return {
        "entries": entries,
        "namespaces": namespaces,
        "hits": {"exact": counters.get("exact_hits", 0), "semantic": counters.get("semantic_hits", 0)},
        "misses": counters.get("misses", 0),
        "hit_rate": round(hits / lookups, 4) if lookups else 0.0,
        "inserts": counters.get("inserts", 0),
        "evictions": counters.get("evictions", 0),
        "expirations": counters.get("expirations", 0),
        "memory_bytes_estimate": memory,
    }


async def warm(settings: Settings, path: str, concurrency: int) -> dict:
    """Ask every question of a JSONL file through the gateway, so the answers land in the cache."""
    from websockets.asyncio.client import connect

    items = []
    with open(path) as fh:
        for n, line in enumerate(fh):
            if line.strip():
                d = json.loads(line)
                if isinstance(d, str):
                    d = {"question": d}
                if "question" in d:
                    d["messages"] = [{"role": "user", "content": d.pop("question")}]
                d.update(type="generate", id=f"warm-{n}")
                items.append(d)
    result = {"questions": len(items), "answered": 0, "already_cached": 0, "errors": 0}
    async with connect(settings.ws_url, max_size=None) as ws:
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


def run(args, settings: Settings) -> int:
    if args.cache_command == "stats":
        print(json.dumps(asyncio.run(stats(settings)), indent=2))
    elif args.cache_command == "clear":
        store = _store(settings)
        removed = asyncio.run(store.clear(args.namespace))
        print(json.dumps({"removed": removed, "namespace": args.namespace}))
    elif args.cache_command == "warm":
        print(json.dumps(asyncio.run(warm(settings, args.file, args.concurrency))))
    elif args.cache_command == "eval":
        from cache.evaluation import evaluate
        from cache.pairs import read_pairs

        cache = _cache(settings)
        report = asyncio.run(evaluate(cache, read_pairs(args.pairs, args.limit)))
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            print(f"{'threshold':>9} {'precision':>9} {'recall':>7} {'f1':>6} {'false_hit_rate':>14} {'hits':>6}")
            for row in report["sweep"] + [dict(report["default"], threshold=f"{report['default']['threshold']}*")]:
                print(f"{row['threshold']!s:>9} {row['precision']:>9} {row['recall']:>7} {row['f1']:>6} "
                      f"{row['false_hit_rate']:>14} {row['hits']:>6}")
            print("* the default settings")
    elif args.cache_command == "train-verifier":
        from cache.training import train_and_save

        cache = _cache(settings)
        cache.verifier = None
        report = train_and_save(cache, args.data, args.limit, args.min_recall, args.epochs, args.out)
        print(json.dumps(report, indent=2))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("cache", help="the answer cache: warm, stats, clear, eval, train-verifier")
    cs = p.add_subparsers(dest="cache_command", required=True)
    w = cs.add_parser("warm", help="answer a JSONL list of questions through the workers ahead of traffic")
    w.add_argument("file", help='lines of {"question": ...} or {"messages": [...]} (+ optional sampling fields)')
    w.add_argument("--concurrency", type=int, default=8)
    cs.add_parser("stats", help="entries, hits by layer, hit rate, memory")
    c = cs.add_parser("clear", help="remove every entry, or one namespace's")
    c.add_argument("--namespace")
    e = cs.add_parser("eval", help="precision/recall of semantic hits on labelled pairs")
    e.add_argument("pairs", help='JSONL lines {"q1": ..., "q2": ..., "duplicate": true|false}')
    e.add_argument("--json", action="store_true")
    e.add_argument("--limit", type=int)
    t = cs.add_parser("train-verifier", help="fit the hit verifier on labelled pairs")
    t.add_argument("--data", default="../shared/data/qqp_train.jsonl")
    t.add_argument("--limit", type=int)
    t.add_argument("--min-recall", type=float, default=0.52, help="recall the chosen operating point keeps")
    t.add_argument("--epochs", type=int, default=15)
    t.add_argument("--out")
