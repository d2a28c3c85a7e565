"""`brigade models ...`: register prepared model versions, list and show them, pull their weights.

The disk work (the store, copies, conversions, pulls, which version a worker serves) is
ops/rollout/model_store.py; the registry (entries, stable versions, the default model) is
ops/rollout/registry.py, in Redis. This module is their command line.
"""
from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

import redis
from pydantic import ValidationError

from ops.commands.cli_options import add_connection_options
from ops.core import redis_clients
from ops.rollout import registry
from ops.core.redaction import redact, redact_url
from ops.rollout.registry import ModelEntry, RegistryError, Snapshot
from ops.core.settings import Settings
from ops.rollout.model_store import add_model, pull_model, remove_model


def _when(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def effective_share(snap: Snapshot, name: str, version: str) -> float:
    """The percent of NAME's requests `version` gets, as the gateway chooses (gateway/admission/catalog.py):
    the route's share, or all of them for the stable version when no route gives any."""
    route = snap.routes.get(name)
    if route is not None and any(s.percent > 0 for s in route.shares):
        return route.share_of(version)
    return 100.0 if snap.stable.get(name) == version else 0.0


def _shadow_share(snap: Snapshot, name: str, version: str) -> float:
    route = snap.routes.get(name)
    return next((s.percent for s in route.shadows if s.version == version), 0.0) if route else 0.0


def _row(snap: Snapshot, entry: ModelEntry) -> dict:
    return {**entry.model_dump(), "stable": snap.stable.get(entry.name) == entry.version,
            "default": snap.default == entry.name, "share": effective_share(snap, entry.name, entry.version),
            "shadow": _shadow_share(snap, entry.name, entry.version)}


def _list(client, settings, args) -> int:
    snap = registry.read_snapshot(client)
    entries = sorted(snap.entries.values(), key=lambda e: (e.name, e.added_at))
    if args.json:
        for entry in entries:
            print(json.dumps(_row(snap, entry)))
        return 0
    rows = [["NAME", "VERSION", "STABLE", "DEFAULT", "SHARE", "SHADOW", "PARAMETERS", "CONTEXT", "CHECKSUM", "ADDED"]]
    for entry in entries:
        row = _row(snap, entry)
        rows.append([entry.name, entry.version, "yes" if row["stable"] else "", "yes" if row["default"] else "",
                     f"{row['share']:g}%", f"{row['shadow']:g}%" if row["shadow"] else "", f"{entry.parameters:,}",
                     str(entry.context_length or "?"), entry.checksum.removeprefix("sha256:")[:12],
                     _when(entry.added_at)])
    print(_table(rows))
    print(f"{len(entries)} version(s) of {len(snap.models)} model(s)", file=sys.stderr)
    return 0


def _show(client, settings, args) -> int:
    name, version = registry.split_ref(args.ref)
    snap = registry.read_snapshot(client)
    entries = [e for e in snap.versions(name) if not version or e.version == version]
    if not entries:
        raise RegistryError(f"{args.ref} is not registered (brigade models list)")
    route = snap.routes.get(name)
    print(json.dumps({"model": name, "default": snap.default == name, "stable": snap.stable.get(name),
                      "route": route.model_dump() if route else None,
                      "entries": [_row(snap, e) for e in entries]}, indent=2))
    return 0


def _add(client, settings, args) -> int:
    entry, said = add_model(client, settings, args.ref, Path(args.source).expanduser(), in_place=args.in_place,
                            replace=args.replace, if_missing=args.if_missing)
    print(said)
    if entry is not None:
        print(f"{entry.ref}: {entry.parameters:,} parameters, context {entry.context_length}, {entry.checksum}")
    return 0


def _remove(client, settings, args) -> int:
    print(remove_model(client, settings, args.ref))
    return 0


def _default(client, settings, args) -> int:
    name, version = registry.split_ref(args.name)
    if version:
        raise RegistryError(f"the default is a model, not a version: brigade models default {name}")
    registry.set_default(client, name)
    print(f"the default model is {name} (requests that name no model)")
    return 0


def _stable(client, settings, args) -> int:
    name, version = registry.split_ref(args.ref)
    if not version:
        raise RegistryError(f"give the version: brigade models stable {name}@VERSION")
    registry.set_stable(client, name, version)
    print(f"the stable version of {name} is {version}")
    return 0


def _pull(client, settings, args) -> int:
    print(pull_model(client, settings, args.ref, Path(args.source).expanduser()))
    return 0


_COMMANDS = {"add": _add, "list": _list, "show": _show, "remove": _remove, "default": _default,
             "stable": _stable, "pull": _pull}


def validation_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"])
    message = str(err["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def run_registry_command(command: str, fn, args, settings: Settings, user_errors: tuple = ()) -> int:
    """One `brigade models|route|canary ...` command: a user's mistake in one line (exit 2), Redis
    that does not answer in one line (exit 1). `user_errors`: more exceptions that are the user's to fix."""
    client = redis_clients.client(settings.redis_url)
    try:
        return fn(client, settings, args)
    except (RegistryError, ValidationError, *user_errors) as exc:
        text = validation_message(exc) if isinstance(exc, ValidationError) else str(exc)
        print(f"brigade {command}: {redact(text)}", file=sys.stderr)
        return 2
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"brigade {command}: Redis at {redact_url(settings.redis_url)} did not answer "
              f"({redact(redis_clients.one_line(exc))}); start it (`brigade up`), or give --redis-url or set "
              "BRIGADE_REDIS_URL", file=sys.stderr)
        return 1
    except redis.RedisError as exc:
        print(f"brigade {command}: Redis at {redact_url(settings.redis_url)} refused: {redact(redis_clients.one_line(exc))}",
              file=sys.stderr)
        return 1
    finally:
        client.close()


def run(args, settings: Settings) -> int:
    return run_registry_command(f"models {args.models_command}", _COMMANDS[args.models_command], args, settings)


def add_parser(sub) -> None:
    p = sub.add_parser("models", help="the model registry: add, list, show, remove, default, stable, pull")
    add_connection_options(p, redis="redis_url")
    ms = p.add_subparsers(dest="models_command", required=True)
    a = ms.add_parser("add", help="register a prepared folder or a .gguf file as NAME[@VERSION]",
                      description="Copies the folder into the model store (store/NAME/VERSION; hard links where "
                      "possible) or converts the .gguf file into it, and registers it. Without VERSION: the next vN.")
    a.add_argument("ref", metavar="NAME[@VERSION]")
    a.add_argument("--from", dest="source", required=True, metavar="PATH",
                   help="a prepared safetensors folder (config.json, *.safetensors, tokenizer) or a .gguf file")
    a.add_argument("--in-place", action="store_true", help="register the folder where it is (no copy)")
    a.add_argument("--replace", action="store_true", help="replace a registered NAME@VERSION")
    a.add_argument("--if-missing", action="store_true",
                   help="do nothing when NAME@VERSION (without VERSION: any version of NAME) is registered")
    ls = ms.add_parser("list", help="every version: stable, default, share of its route, size, checksum")
    ls.add_argument("--json", action="store_true", help="one JSON object a line")
    s = ms.add_parser("show", help="a model's entries, stable version and route, as JSON")
    s.add_argument("ref", metavar="NAME[@VERSION]")
    r = ms.add_parser("remove", help="unregister a version (refused while a route uses it or it is stable)")
    r.add_argument("ref", metavar="NAME@VERSION")
    d = ms.add_parser("default", help="the model of requests that name none")
    d.add_argument("name", metavar="NAME")
    st = ms.add_parser("stable", help="set a model's stable version by hand")
    st.add_argument("ref", metavar="NAME@VERSION")
    pl = ms.add_parser("pull", help="copy a registered version into this machine's store from a shared folder")
    pl.add_argument("ref", metavar="NAME@VERSION")
    pl.add_argument("--from", dest="source", required=True, metavar="SHARED",
                    help="another store's root (SHARED/NAME/VERSION) or the model folder itself")
    for leaf in (a, ls, s, r, d, st, pl):
        add_connection_options(leaf, redis="redis_url")
