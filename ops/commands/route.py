"""`brigade route ...`: the share of a model's requests each version gets, and its shadow copies.

A route is ops/rollout/registry.py's RouteSpec: shares that add up to 100, the sticky mode (what the
gateway hashes so that one key, user or conversation stays on one version) and shadows (versions
that also run a copy of some requests, measured, never delivered). Each change is one transaction
that the gateways see whole within their registry poll. A model without a route sends every request
to its stable version (gateway/admission/catalog.py).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

from ops.commands.cli_options import add_connection_options
from ops.commands.models import run_registry_command
from ops.rollout import registry
from ops.rollout.registry import RegistryError, RouteSpec, Share, Snapshot
from ops.core.settings import Settings


def _registered(snap: Snapshot, name: str) -> None:
    if not snap.versions(name):
        raise RegistryError(f"model {name!r} is not registered (brigade models list)")


def _model(ref: str) -> str:
    name, version = registry.split_ref(ref)
    if version:
        raise RegistryError(f"a route belongs to a model, not a version: give {name}, then VERSION=PERCENT")
    return name


def _set(client, settings, args) -> int:
    name = _model(args.name)
    snap = registry.read_snapshot(client)
    _registered(snap, name)
    old = snap.routes.get(name)
    sticky = args.sticky or (old.sticky if old else "key")
    route = RouteSpec(model=name, shares=registry.parse_shares(args.shares), sticky=sticky,
                      shadows=old.shadows if old else [], why="brigade route set")
    route = registry.set_route(client, route)
    print(f"route of {name}: {_shares(route.shares)} (sticky: {route.sticky})"
          + (f", shadows {_shares(route.shadows)}" if route.shadows else ""))
    return 0


def _shadow(client, settings, args) -> int:
    name = _model(args.name)
    if args.off == bool(args.shares):
        raise RegistryError("give VERSION=PERCENT shadow shares (e.g. v3=10), or --off")
    snap = registry.read_snapshot(client)
    _registered(snap, name)
    old = snap.routes.get(name)
    if old is None:
        if args.off:
            print(f"{name} has no route, so no shadows; nothing to do")
            return 0
        stable = snap.stable.get(name)
        if stable is None:
            raise RegistryError(f"{name} has no stable version to serve beside its shadows: brigade models stable {name}@VERSION")
        # What the gateway does without a route, written down, so that shadows have a route to live in.
        old = RouteSpec(model=name, shares=[Share(version=stable, percent=100.0)])
    shadows = [] if args.off else registry.parse_shares(args.shares)
    if len({s.version for s in shadows}) != len(shadows):
        raise RegistryError("a version is named twice")
    route = registry.set_route(client, old.model_copy(update={"shadows": shadows, "why": "brigade route shadow"}))
    print(f"shadows of {name}: {_shares(route.shadows) or 'none'} (served: {_shares(route.shares)})")
    return 0


def _show(client, settings, args) -> int:
    snap = registry.read_snapshot(client)
    if args.name:
        name = _model(args.name)
        _registered(snap, name)
        names = [name]
    else:
        names = sorted(snap.models)
    if args.json:
        for name in names:
            route = snap.routes.get(name)
            print(json.dumps({"model": name, "stable": snap.stable.get(name),
                              "route": route.model_dump() if route else None}))
        return 0
    rows = [["MODEL", "SHARES", "STICKY", "SHADOWS", "UPDATED", "WHY"]]
    for name in names:
        route = snap.routes.get(name)
        if route is None:
            rows.append([name, f"{snap.stable.get(name, '?')}=100 (stable, no route)", "", "", "", ""])
            continue
        rows.append([name, _shares(route.shares), route.sticky, _shares(route.shadows),
                     datetime.fromtimestamp(route.updated_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ"), route.why])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows))
    return 0


def _clear(client, settings, args) -> int:
    name = _model(args.name)
    _registered(registry.read_snapshot(client), name)
    had = registry.clear_route(client, name)
    print(f"cleared the route of {name}: every request goes to its stable version" if had
          else f"{name} had no route; nothing to do")
    return 0


def _shares(shares: list[Share]) -> str:
    return " ".join(f"{s.version}={s.percent:g}" for s in shares)


_COMMANDS = {"set": _set, "shadow": _shadow, "show": _show, "clear": _clear}


def run(args, settings: Settings) -> int:
    return run_registry_command(f"route {args.route_command}", _COMMANDS[args.route_command], args, settings)


def add_parser(sub) -> None:
    p = sub.add_parser("route", help="a model's traffic split between versions, and shadow copies")
    add_connection_options(p, redis="redis_url")
    rs = p.add_subparsers(dest="route_command", required=True)
    s = rs.add_parser("set", help="the share of NAME's requests each version gets (shares add up to 100)",
                      description="Replaces the shares (its shadows stay). List a canary last: it keeps the users "
                      "it has as its share grows.")
    s.add_argument("name", metavar="NAME")
    s.add_argument("shares", nargs="+", metavar="VERSION=PERCENT", help="e.g. v1=95 v2=5")
    s.add_argument("--sticky", choices=registry.STICKY_MODES,
                   help="what keeps one client on one version: its API key (default), the OpenAI `user`, "
                   "the conversation (its first turns), or none (random); default: the route's current mode")
    sh = rs.add_parser("shadow", help="versions that also run a copy of some of NAME's requests (never delivered)")
    sh.add_argument("name", metavar="NAME")
    sh.add_argument("shares", nargs="*", metavar="VERSION=PERCENT", help="e.g. v3=10: a copy of 10%% of requests")
    sh.add_argument("--off", action="store_true", help="no shadows")
    sw = rs.add_parser("show", help="every model's route, or one")
    sw.add_argument("name", nargs="?", metavar="NAME")
    sw.add_argument("--json", action="store_true", help="one JSON object a line")
    c = rs.add_parser("clear", help="remove NAME's route: every request goes to its stable version")
    c.add_argument("name", metavar="NAME")
    for leaf in (s, sh, sw, c):
        add_connection_options(leaf, redis="redis_url")
