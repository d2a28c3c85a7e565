"""`brigade keys ...`: create, list, revoke API keys of the gateway and show what each has used."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from datetime import datetime, timezone

from ops.commands.cli_options import add_connection_options
from ops.core.redaction import redact
from ops.core.redis_address import describe
from ops.core.redis_clients import one_line
from ops.core.settings import RedisSettings, Settings


def _where(url: str) -> str:
    """The Redis address for a message, without a password."""
    return describe(url)


def _one_line(exc: Exception) -> str:
    return redact(one_line(exc))


def _limit(value: int) -> str:
    return str(value) if value else "unlimited"


def _when(created: int) -> str:
    return datetime.fromtimestamp(created, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


async def _create(store, args) -> int:
    plain, key = await store.create(args.name, rpm=args.rpm, tpm=args.tpm, max_concurrent=args.max_concurrent)
    print(plain)
    print(f"created key {key.id} ({key.name}): rpm {_limit(key.rpm)}, tpm {_limit(key.tpm)}, "
          f"max_concurrent {_limit(key.max_concurrent)}. The key above will not be shown again: store it now.",
          file=sys.stderr)
    return 0


async def _list(store, args) -> int:
    found = await store.list()
    if args.json:
        for key in found:
            print(json.dumps(asdict(key)))
        return 0
    rows = [["ID", "NAME", "RPM", "TPM", "MAX_CONCURRENT", "REVOKED", "CREATED"]]
    rows += [[k.id, k.name, _limit(k.rpm), _limit(k.tpm), _limit(k.max_concurrent), "yes" if k.revoked else "no",
              _when(k.created)] for k in found]
    print(_table(rows))
    print(f"{len(found)} key(s)", file=sys.stderr)
    return 0


async def _revoke(store, args) -> int:
    from gateway.admission.api_keys import key_id_of

    key_id = key_id_of(args.key)  # never echo a whole key back
    if not await store.revoke(key_id):
        print(f"brigade keys revoke: no API key {key_id}; `brigade keys list` shows them all", file=sys.stderr)
        return 1
    print(f"revoked {key_id}: requests with it are refused from now on (its usage stays visible)")
    return 0


async def _usage(store, args) -> int:
    chosen = [await store.get(args.key)] if args.key else await store.list()
    if chosen == [None]:
        print("brigade keys usage: no such API key; `brigade keys list` shows them all", file=sys.stderr)
        return 1
    report = [{"id": k.id, "name": k.name, "revoked": k.revoked, **await store.usage(k.id)} for k in chosen]
    if args.json:
        for line in report:
            print(json.dumps(line))
        return 0
    rows = [["ID", "NAME", "REQUESTS", "PROMPT_TOKENS", "COMPLETION_TOKENS", "CACHE_HITS", "REVOKED"]]
    rows += [[u["id"], u["name"], str(u["requests"]), str(u["prompt_tokens"]), str(u["completion_tokens"]),
              str(u["cache_hits"]), "yes" if u["revoked"] else "no"] for u in report]
    print(_table(rows))
    return 0


_COMMANDS = {"create": _create, "list": _list, "revoke": _revoke, "usage": _usage}


async def _run(args, settings: RedisSettings) -> int:
    from gateway.admission.api_keys import KeyStore
    from ops.core.redis_clients import async_client

    client = async_client(settings.redis_url)
    try:
        return await _COMMANDS[args.keys_command](KeyStore(client), args)
    finally:
        await client.aclose()


def run(args, settings: Settings) -> int:
    import redis

    try:
        return asyncio.run(_run(args, settings))
    except ValueError as exc:  # a name or a key id the user typed
        print(f"brigade keys {args.keys_command}: {redact(str(exc))}", file=sys.stderr)  # it may quote a key
        return 2
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"brigade keys: Redis at {_where(settings.redis_url)} did not answer ({_one_line(exc)}); "
              "start it (`brigade up`), or give --redis-url or set BRIGADE_REDIS_URL", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"brigade keys: Redis at {_where(settings.redis_url)} refused: {_one_line(exc)}", file=sys.stderr)
        return 1


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: unlimited), not {value}")
    return value


def add_parser(sub) -> None:
    p = sub.add_parser("keys", help="API keys of the gateway: create, list, revoke, usage")
    add_connection_options(p, redis="redis_url")  # before the subcommand too, as `brigade batch` takes them
    ks = p.add_subparsers(dest="keys_command", required=True)
    c = ks.add_parser("create", help="a new key (printed once: store it)")
    c.add_argument("--name", required=True, help="who or what the key is for")
    c.add_argument("--rpm", type=_count, default=0, help="requests per minute (default 0: unlimited)")
    c.add_argument("--tpm", type=_count, default=0, help="prompt + completion tokens per minute (default 0: unlimited)")
    c.add_argument("--max-concurrent", type=_count, default=0,
                   help="requests running at once (default 0: unlimited)")
    ls = ks.add_parser("list", help="every key: id, name, limits, revoked, created")
    ls.add_argument("--json", action="store_true", help="one JSON object a line")
    r = ks.add_parser("revoke", help="refuse a key from the next request on (its record and usage stay)")
    r.add_argument("key", help="the key's id (or the whole key)")
    u = ks.add_parser("usage", help="requests, tokens and cache hits per key")
    u.add_argument("key", nargs="?", help="one key's id (default: every key)")
    u.add_argument("--json", action="store_true", help="one JSON object a line")
    for leaf in (c, ls, r, u):
        add_connection_options(leaf, redis="redis_url")
