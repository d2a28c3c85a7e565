"""`brigade models ...`: register prepared model versions, list and show them, pull their weights.

The registry itself (entries, stable versions, the default model) is ops/core/registry.py, in Redis;
this module is its command line and the disk work around it: `add` copies a prepared folder into
the model store (store/NAME/VERSION, hard links where the file system allows) or converts a GGUF
file into it once, and `pull` fills this machine's store from a shared folder, checking the weights
against the registry's checksum. A copy is written to a hidden temporary folder and renamed into
place, so a half copy is never registered nor served.

`resolve_served` is what `brigade worker --model NAME[@VERSION]` (and `brigade up`) serve.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import redis
from pydantic import ValidationError

from ops.cli_options import add_connection_options
from ops.core import keys, redis_clients, registry
from ops.core.redaction import redact, redact_url
from ops.core.registry import ModelEntry, RegistryError, Snapshot
from ops.core.sampling_defaults import DEFAULT_MODEL_GENERATION, FILE_FIELDS
from ops.core.settings import Settings

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
DEFAULT_VERSION = "v1"  # what `brigade up` registers the default model as


class ModelNotHere(RuntimeError):
    """A registered version whose weights this machine does not have (`brigade models pull`)."""


# ---- disk -------------------------------------------------------------------------------------------


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or one without hard links
        shutil.copy2(src, dst)


def _partial(final: Path) -> Path:
    return final.with_name(f".{final.name}.partial-{os.getpid()}")


def _install(tmp: Path, final: Path) -> None:
    """Put a finished temporary folder in place (replacing an unregistered leftover there)."""
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)


def _check_prepared(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise RegistryError(f"{folder} has no config.json: give a prepared model folder or a .gguf file")
    registry.weight_files(folder)  # raises when there is no .safetensors file
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise RegistryError(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}): a worker could not serve it")


def generation_defaults(folder: Path, default_model: bool) -> dict:
    """The sampling fields of the folder's generation_config.json, in request names; for the
    default model, its recommendations (ops/core/sampling_defaults.py says why)."""
    config = DEFAULT_MODEL_GENERATION
    if not default_model:
        path = folder / "generation_config.json"
        if not path.is_file():
            return {}
        try:
            config = json.loads(path.read_text())
        except ValueError as exc:
            raise RegistryError(f"{path} is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise RegistryError(f"{path} must hold a JSON object")
    return {FILE_FIELDS[k]: v for k, v in config.items()
            if k in FILE_FIELDS and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _is_default_model(source: Path, settings: Settings) -> bool:
    """The default prepared model (BRIGADE_MODEL unset), or the packaged GGUF it is made from."""
    if settings.model:
        return False
    if source.resolve() == settings.model_dir.resolve():
        return True
    from engine.model_files import ModelNotFound, default_gguf_path

    try:
        return source.resolve() == default_gguf_path().resolve()
    except ModelNotFound:
        return False


def next_version(snap: Snapshot, name: str) -> str:
    """v1, v2, ...: one above the highest vN of the model."""
    numbers = [int(e.version[1:]) for e in snap.versions(name) if e.version[:1] == "v" and e.version[1:].isdigit()]
    return f"v{max(numbers, default=0) + 1}"


def add_model(client: redis.Redis, settings: Settings, ref: str, source: Path, in_place: bool = False,
              replace: bool = False, if_missing: bool = False) -> tuple[ModelEntry | None, str]:
    """Register `source` as NAME@VERSION; returns the entry (None: --if-missing found it) and what was done."""
    name, version = registry.split_ref(ref)
    snap = registry.read_snapshot(client)
    if if_missing:
        present = snap.entry(name, version) if version else (snap.versions(name) or [None])[-1]
        if present is not None:
            return None, f"{present.ref} is already registered; nothing to do"
    version = version or next_version(snap, name)
    if snap.entry(name, version) is not None and not replace:
        raise RegistryError(f"{name}@{version} is already registered: give another version, --replace, "
                            f"or remove it first (brigade models remove {name}@{version})")
    if not source.exists():
        raise RegistryError(f"{source} does not exist: give a prepared model folder or a .gguf file")
    source = source.resolve()
    gguf = source.is_file() and source.suffix == ".gguf"
    if not gguf and not source.is_dir():
        raise RegistryError(f"{source} is neither a model folder nor a .gguf file")
    if gguf and in_place:
        raise RegistryError("--in-place registers a prepared folder where it is; a .gguf file is converted into the store")
    default_model = _is_default_model(source, settings)
    if not gguf:
        _check_prepared(source)
        generation = generation_defaults(source, default_model)
    final = registry.store_folder(settings.store_dir, name, version)
    if in_place or (not gguf and source == final.resolve()):
        entry = registry.describe_folder(source, name, version, str(source), generation)
        registry.register(client, entry, replace=replace)
        return entry, f"registered {entry.ref} in place at {source}"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if gguf:
            from engine.model_files import convert_gguf

            convert_gguf(source, tmp)
            generation = generation_defaults(tmp, default_model)  # the converted folder's config
        else:
            shutil.copytree(source, tmp, copy_function=_link_or_copy)
        entry = registry.describe_folder(tmp, name, version, str(source), generation)
        entry = entry.model_copy(update={"path": str(final.resolve())})
        _install(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        registry.register(client, entry, replace=replace)
    except BaseException:
        shutil.rmtree(final, ignore_errors=True)  # registered by someone else meanwhile: leave nothing behind
        raise
    how = "converted" if gguf else "copied"
    return entry, f"registered {entry.ref}: {how} into {final}"


def pull_model(client: redis.Redis, settings: Settings, ref: str, shared: Path) -> str:
    """Copy NAME@VERSION from a shared folder into this machine's store, checked against the registry."""
    name, version = registry.split_ref(ref)
    if not version:
        raise RegistryError(f"give the version to pull: {name}@VERSION (brigade models list)")
    entry = registry.read_snapshot(client).entry(name, version)
    if entry is None:
        raise RegistryError(f"{name}@{version} is not registered (brigade models list)")
    candidates = [registry.store_folder(shared, name, version), shared]
    source = next((c for c in candidates if (c / "config.json").is_file()), None)
    if source is None:
        raise RegistryError(f"{shared} holds neither {name}/{version}/ nor a model folder (config.json)")
    final = registry.store_folder(settings.store_dir, name, version)
    if (final / "config.json").is_file() and registry.weights_checksum(final) == entry.checksum:
        return f"{entry.ref} is already in {final} (checksum verified)"
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _partial(final)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(source, tmp, copy_function=_link_or_copy)
        got = registry.weights_checksum(tmp)
        if got != entry.checksum:
            raise RegistryError(f"the weights in {source} are not {entry.ref}'s: checksum {got}, the registry's "
                                f"{entry.checksum}; nothing was copied")
        _install(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return f"pulled {entry.ref} into {final} (checksum verified)"


def remove_model(client: redis.Redis, settings: Settings, ref: str) -> str:
    name, version = registry.split_ref(ref)
    if not version:
        raise RegistryError(f"give the version to remove: {name}@VERSION (brigade models list)")
    entry = registry.read_snapshot(client).entry(name, version)
    registry.remove(client, name, version)  # refuses an unknown version, a routed one, a stable one
    copy = registry.store_folder(settings.store_dir, name, version)
    # This machine's store copy (added or pulled) goes with the entry; a folder registered in place stays.
    if entry is not None and copy.is_dir() and copy.resolve() != Path(entry.source).resolve():
        shutil.rmtree(copy)
        return f"removed {name}@{version} and its copy in {copy}"
    return f"removed {name}@{version}"


# ---- what a worker serves ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """The model a worker serves: its folder here, its name, its version ("" when unversioned)."""

    folder: Path
    name: str
    version: str


def resolve_served(ref: str | None, settings: Settings) -> Served | None:
    """What `brigade worker [--model NAME[@VERSION]]` serves. NAME alone: its stable version; no
    --model: the default model's stable version, or None (serve BRIGADE_MODEL unversioned, as before
    the registry) when BRIGADE_MODEL is set or the registry is empty. Raises RegistryError for an
    unknown model or version, ModelNotHere when its weights are not on this machine, and a Redis
    error when --model is given and Redis does not answer."""
    try:
        snap = registry.read_snapshot(redis_clients.client(settings.redis_url))
    except redis.RedisError:
        if ref:
            raise
        return None  # no registry to read: the folder of the settings, as ever
    if not ref:
        if settings.model or not snap.entries or not snap.default:
            return None
        ref = snap.default
    name, version = registry.split_ref(ref)
    if not snap.versions(name):
        known = ", ".join(sorted(snap.models)) or "none"
        raise RegistryError(f"model {name!r} is not registered (registered: {known}); brigade models add {name} --from PATH")
    version = version or snap.stable.get(name, "")
    entry = snap.entry(name, version)
    if entry is None:
        versions = ", ".join(e.version for e in snap.versions(name))
        raise RegistryError(f"{name}@{version} is not registered (versions of {name}: {versions})")
    folder = registry.local_folder(entry, settings.store_dir)
    if folder is None:
        raise ModelNotHere(f"{entry.ref} is not on this machine: run brigade models pull {entry.ref} --from SHARED_FOLDER")
    return Served(folder, name, version)


def register_default_model(client: redis.Redis, settings: Settings) -> str | None:
    """`brigade up`'s first start: the default model, prepared once, as NAME@v1 in place, when the
    registry is empty and BRIGADE_MODEL unset. None when there was nothing to do."""
    if settings.model or registry.read_snapshot(client).entries:
        return None
    from engine.model_files import prepare_default_model

    folder = prepare_default_model(settings.model_dir)
    entry, _ = add_model(client, settings, keys.served(settings.model_name, DEFAULT_VERSION), folder,
                         in_place=True, if_missing=True)
    return None if entry is None else f"registered the default model as {entry.ref} ({folder})"


# ---- the command line -------------------------------------------------------------------------------


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
