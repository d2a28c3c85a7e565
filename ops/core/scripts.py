"""Every Lua script Brigade runs, read from ops/core/lua/ and registered on a client.

Each script stands alone (no text is spliced into another) and touches only keys passed in
KEYS, so that ops/core/redis_keys.py sees every key and Redis Cluster could route every script.
`register_script` sends a script by EVALSHA, and its text only the first time a Redis lacks it.
"""
from __future__ import annotations

from importlib import resources

from redis.commands.core import AsyncScript, Script

NAMES = ("claim", "publish", "release", "reap", "bury", "take_unclaimed", "engage", "admit", "renew_lease", "drop_lease",
         "write_held", "record_hit", "retake", "steal")


def source(name: str) -> str:
    """The text of ops/core/lua/<name>.lua (shipped in the wheel as package data)."""
    if name not in NAMES:
        raise KeyError(f"no Lua script named {name!r}; known: {', '.join(NAMES)}")
    return resources.files("ops.core").joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def register(client, name: str) -> Script | AsyncScript:
    """The script `name` bound to `client` (sync or asyncio): call it with keys=[...], args=[...]."""
    return client.register_script(source(name))
