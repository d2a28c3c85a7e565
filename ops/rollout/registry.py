"""The model registry: which models and versions exist, which version is stable, and the routes.

An entry describes one prepared version (name, version, where its folder is, a checksum of the
weights, parameter count, context length, chat template, generation defaults, when it was added).
Entries, the stable version of each model, the default model and the routes live in Redis
(ops/core/redis_keys.py: MODELS, MODEL_STABLE, MODEL_DEFAULT, ROUTES), with the persistence of the
service's data; the weights live in the model store on disk (Settings.store_dir, one folder per
version: store/NAME/VERSION), which `brigade models pull` fills from a shared folder.

A route says what share of a model's requests each version gets, how assignment sticks (by API
key, OpenAI `user`, or conversation), and which versions get a shadow copy. Every change is one
transaction that also increments REGISTRY_REVISION, so a gateway polling that number reloads a
consistent snapshot (`read_snapshot`) and a route change is seen whole, never half.

Importing this module loads no torch: the checksum and parameter count are read from the
safetensors files' headers and bytes.
"""
from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, field_validator

from ops.core import redis_keys

STICKY_MODES = ("key", "user", "conversation", "none")
BUCKETS = 10_000  # a sticky hash lands in one of these; shares are percentages with two decimals
WEIGHT_SUFFIXES = (".safetensors",)


class RegistryError(ValueError):
    """A registry operation that cannot be done; the message says what to do instead."""


def split_ref(ref: str) -> tuple[str, str]:
    """`NAME[@VERSION]` -> (name, version or "")."""
    name, _, version = ref.strip().partition("@")
    if not name:
        raise RegistryError(f"{ref!r} names no model: give NAME or NAME@VERSION")
    for part, what in ((name, "name"), (version, "version")):
        if part and not all(c.isalnum() or c in "-_." for c in part):
            raise RegistryError(f"model {what} {part!r} may hold letters, digits, '-', '_' and '.' only")
        if part.startswith("."):  # "..", "." or a hidden name: a folder of the store (store/NAME/VERSION) it must not be
            raise RegistryError(f"model {what} {part!r} may not start with '.'")
    return name, version


class ModelEntry(BaseModel):
    """One registered version of a model."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())
    name: str
    version: str
    source: str  # what `models add --from` was given (a folder or a GGUF file)
    path: str  # the prepared safetensors folder in the model store (on the machine that added it)
    checksum: str  # sha256 over the weight files, in name order (`weights_checksum`)
    parameters: int
    context_length: int | None = None
    chat_template: str | None = None
    # The sampling fields the model's generation config names, in request names (max_tokens, ...).
    generation: dict[str, float | int] = Field(default_factory=dict)
    added_at: float

    @property
    def ref(self) -> str:
        return redis_keys.served(self.name, self.version)


class Share(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str
    percent: float = Field(ge=0.0, le=100.0)


class RouteSpec(BaseModel):
    """The shares of one model's versions, in order (assignment walks them cumulatively, so a
    version listed last keeps the users it has when its share grows: a canary goes last)."""

    model_config = ConfigDict(extra="forbid")
    model: str
    shares: list[Share]
    sticky: Literal["key", "user", "conversation", "none"] = "key"
    shadows: list[Share] = Field(default_factory=list)
    updated_at: float = 0.0
    why: str = ""  # who set it last: "brigade route set", "canary step 2 of 4", "canary rolled back: ..."

    @field_validator("shares")
    @classmethod
    def _sums_to_100(cls, shares: list[Share]) -> list[Share]:
        total = sum(s.percent for s in shares)
        if shares and abs(total - 100.0) > 1e-6:
            raise ValueError(f"the shares add up to {total:g}, not 100")
        if len({s.version for s in shares}) != len(shares):
            raise ValueError("a version is named twice")
        return shares

    def share_of(self, version: str) -> float:
        return next((s.percent for s in self.shares if s.version == version), 0.0)


def parse_shares(items: list[str]) -> list[Share]:
    """`v1=95 v2=5` -> shares, in the order given."""
    shares = []
    for item in items:
        version, sep, percent = item.partition("=")
        if not sep or not version:
            raise RegistryError(f"{item!r}: give VERSION=PERCENT, e.g. v1=95 v2=5")
        try:
            value = float(percent.rstrip("%"))
        except ValueError:
            raise RegistryError(f"{item!r}: {percent!r} is not a number") from None
        if not 0 <= value <= 100:
            raise RegistryError(f"{item!r}: a share is 0 to 100")
        shares.append(Share(version=version, percent=value))
    return shares


# ---- assignment -------------------------------------------------------------------------------------


def bucket(model: str, value: str) -> int:
    """Where a sticky value lands, the same on every gateway (not Python's salted hash)."""
    digest = hashlib.sha256(f"{model}\x00{value}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def pick(shares: list[Share], at: int) -> str | None:
    """The version whose cumulative range holds bucket `at`; None when every share is 0."""
    edge = 0.0
    live = [s for s in shares if s.percent > 0]
    for share in live:
        edge += share.percent * BUCKETS / 100.0
        if at < edge:
            return share.version
    return live[-1].version if live else None  # rounding at the very top


def sticky_value(mode: str, key_id: str | None, user: str | None, conversation: str | None) -> str | None:
    """What assignment hashes for a route's sticky mode; None: nothing to stick to (random)."""
    if mode == "key":
        return key_id or user or conversation
    if mode == "user":
        return user or key_id or conversation
    if mode == "conversation":
        return conversation
    return None


def conversation_of(prompt: str | None, messages: list[dict] | None) -> str:
    """A conversation's identity: its first turns (system prompt and first user message), which
    every later turn repeats; a raw prompt is its own conversation."""
    if messages:
        first = [m for m in messages if m["role"] == "system"][:1]
        first += [m for m in messages if m["role"] == "user"][:1]
        return json.dumps(first, sort_keys=True, ensure_ascii=False)
    return prompt or ""


# ---- weights on disk --------------------------------------------------------------------------------


def weight_files(folder: Path) -> list[Path]:
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise RegistryError(f"{folder} holds no .safetensors file: give a prepared model folder or a .gguf file")
    return files


def weights_checksum(folder: Path) -> str:
    """sha256 over every weight file's name and bytes, in name order."""
    digest = hashlib.sha256()
    for path in weight_files(folder):
        digest.update(path.name.encode() + b"\x00")
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def parameter_count(folder: Path) -> int:
    """Parameters, read from the safetensors headers (8-byte length, then JSON of shapes)."""
    total = 0
    for path in weight_files(folder):
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            total += count
    return total


def describe_folder(folder: Path, name: str, version: str, source: str, generation: dict) -> ModelEntry:
    """The registry entry of a prepared folder (reads its weights once, for the checksum)."""
    folder = folder.resolve()
    if not (folder / "config.json").is_file():
        raise RegistryError(f"{folder} has no config.json: give a prepared model folder or a .gguf file")
    config = json.loads((folder / "config.json").read_text())
    template = None
    tokenizer_config = folder / "tokenizer_config.json"
    if tokenizer_config.is_file():
        template = json.loads(tokenizer_config.read_text()).get("chat_template")
    if template is None and (folder / "chat_template.jinja").is_file():  # where transformers saves it now
        template = (folder / "chat_template.jinja").read_text()
    return ModelEntry(name=name, version=version, source=source, path=str(folder), checksum=weights_checksum(folder),
                      parameters=parameter_count(folder), context_length=config.get("max_position_embeddings"),
                      chat_template=template if isinstance(template, str) else None, generation=generation,
                      added_at=time.time())


def store_folder(store: Path, name: str, version: str) -> Path:
    return store / name / version


def local_folder(entry: ModelEntry, store: Path) -> Path | None:
    """Where this machine has the version's weights: the folder it was added from, or the store's
    copy (`models pull`); None when neither is here."""
    for folder in (Path(entry.path), store_folder(store, entry.name, entry.version)):
        if (folder / "config.json").is_file():
            return folder
    return None


# ---- Redis ------------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """The whole registry at one revision, as a gateway holds it."""

    revision: int = 0
    entries: dict[str, ModelEntry] = field(default_factory=dict)  # "name@version" -> entry
    stable: dict[str, str] = field(default_factory=dict)  # model -> version
    default: str | None = None
    routes: dict[str, RouteSpec] = field(default_factory=dict)

    def versions(self, model: str) -> list[ModelEntry]:
        return sorted((e for e in self.entries.values() if e.name == model), key=lambda e: e.added_at)

    def entry(self, model: str, version: str) -> ModelEntry | None:
        return self.entries.get(redis_keys.served(model, version)) if version else None

    @property
    def models(self) -> set[str]:
        return {e.name for e in self.entries.values()}


def _snapshot(replies: list) -> Snapshot:
    revision, raw_entries, stable, default, raw_routes = replies
    entries = {}
    for ref, raw in (raw_entries or {}).items():
        try:
            entries[ref] = ModelEntry.model_validate_json(raw)
        except ValueError:
            continue  # a foreign value names no model
    routes = {}
    for model, raw in (raw_routes or {}).items():
        try:
            routes[model] = RouteSpec.model_validate_json(raw)
        except ValueError:
            continue
    return Snapshot(int(revision or 0), entries, dict(stable or {}), default, routes)


def _read(pipe) -> None:
    pipe.get(redis_keys.REGISTRY_REVISION)
    pipe.hgetall(redis_keys.MODELS)
    pipe.hgetall(redis_keys.MODEL_STABLE)
    pipe.get(redis_keys.MODEL_DEFAULT)
    pipe.hgetall(redis_keys.ROUTES)


def read_snapshot(client: redis.Redis) -> Snapshot:
    pipe = client.pipeline(transaction=True)  # one MULTI: entries and routes of one revision
    _read(pipe)
    return _snapshot(pipe.execute())


async def read_snapshot_async(client) -> Snapshot:
    pipe = client.pipeline(transaction=True)
    _read(pipe)
    return _snapshot(await pipe.execute())


async def revision_async(client) -> int:
    return int(await client.get(redis_keys.REGISTRY_REVISION) or 0)


def register(client: redis.Redis, entry: ModelEntry, replace: bool = False) -> None:
    """Add a version. The first version of a model becomes its stable one; the first model, the default."""
    ref = entry.ref

    def add(pipe) -> None:
        if pipe.hexists(redis_keys.MODELS, ref) and not replace:
            raise RegistryError(f"{ref} is already registered: give another version, or remove it first")
        first_of_model = not pipe.hexists(redis_keys.MODEL_STABLE, entry.name)
        no_default = not pipe.exists(redis_keys.MODEL_DEFAULT)
        pipe.multi()
        pipe.hset(redis_keys.MODELS, ref, entry.model_dump_json())
        if first_of_model:
            pipe.hset(redis_keys.MODEL_STABLE, entry.name, entry.version)
        if no_default:
            pipe.set(redis_keys.MODEL_DEFAULT, entry.name)
        pipe.incr(redis_keys.REGISTRY_REVISION)

    client.transaction(add, redis_keys.MODELS, redis_keys.MODEL_STABLE, redis_keys.MODEL_DEFAULT)


def remove(client: redis.Redis, name: str, version: str) -> None:
    """Remove a version; refused while a route gives it traffic or it is the stable one of others."""
    snap = read_snapshot(client)
    ref = redis_keys.served(name, version)
    if ref not in snap.entries:
        raise RegistryError(f"{ref} is not registered (brigade models list)")
    route = snap.routes.get(name)
    if route is not None and (route.share_of(version) > 0 or any(s.version == version for s in route.shadows)):
        raise RegistryError(f"the route of {name} still sends traffic to {version}: change it first (brigade route set)")
    others = [e for e in snap.versions(name) if e.version != version]
    if snap.stable.get(name) == version and others:
        raise RegistryError(f"{ref} is the stable version of {name}: promote another first (brigade models stable "
                            f"{name}@{others[-1].version})")
    pipe = client.pipeline(transaction=True)
    pipe.hdel(redis_keys.MODELS, ref)
    if not others:
        pipe.hdel(redis_keys.MODEL_STABLE, name)
        pipe.hdel(redis_keys.ROUTES, name)
        if snap.default == name:
            pipe.delete(redis_keys.MODEL_DEFAULT)
    pipe.incr(redis_keys.REGISTRY_REVISION)
    pipe.execute()


def set_default(client: redis.Redis, name: str) -> None:
    snap = read_snapshot(client)
    if name not in snap.models:
        raise RegistryError(f"model {name!r} is not registered (brigade models list)")
    pipe = client.pipeline(transaction=True)
    pipe.set(redis_keys.MODEL_DEFAULT, name)
    pipe.incr(redis_keys.REGISTRY_REVISION)
    pipe.execute()


def set_stable(client: redis.Redis, name: str, version: str) -> None:
    snap = read_snapshot(client)
    if redis_keys.served(name, version) not in snap.entries:
        raise RegistryError(f"{redis_keys.served(name, version)} is not registered (brigade models list)")
    pipe = client.pipeline(transaction=True)
    pipe.hset(redis_keys.MODEL_STABLE, name, version)
    pipe.incr(redis_keys.REGISTRY_REVISION)
    pipe.execute()


def set_route(client: redis.Redis, route: RouteSpec, stable: str | None = None) -> RouteSpec:
    """Replace a model's route (and, when given, its stable version) in one transaction."""
    snap = read_snapshot(client)
    known = {e.version for e in snap.versions(route.model)}
    if not known:
        raise RegistryError(f"model {route.model!r} is not registered (brigade models list)")
    for share in [*route.shares, *route.shadows]:
        if share.version not in known:
            raise RegistryError(f"{route.model}@{share.version} is not registered; registered: {', '.join(sorted(known))}")
    route = route.model_copy(update={"updated_at": time.time()})
    pipe = client.pipeline(transaction=True)
    pipe.hset(redis_keys.ROUTES, route.model, route.model_dump_json())
    if stable is not None:
        pipe.hset(redis_keys.MODEL_STABLE, route.model, stable)
    pipe.incr(redis_keys.REGISTRY_REVISION)
    pipe.execute()
    return route


def clear_route(client: redis.Redis, name: str) -> bool:
    pipe = client.pipeline(transaction=True)
    pipe.hdel(redis_keys.ROUTES, name)
    pipe.incr(redis_keys.REGISTRY_REVISION)
    return bool(pipe.execute()[0])
