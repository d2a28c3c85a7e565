"""The model store on this machine: prepared model versions copied or converted into it, pulled
from a shared folder, removed, and which version a worker serves.

`add` copies a prepared folder into the store (store/NAME/VERSION, hard links where the file
system allows) or converts a GGUF file into it once, and `pull` fills this machine's store from a
shared folder, checking the weights against the registry's checksum. A copy is written to a hidden
temporary folder and renamed into place, so a half copy is never registered nor served. The
registry itself (entries, stable versions, the default model) is ops/rollout/registry.py, in Redis.

`resolve_served` is what `brigade worker --model NAME[@VERSION]` (and `brigade up`) serve.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import redis

from ops.core import redis_clients, redis_keys
from ops.rollout import registry
from ops.rollout.registry import ModelEntry, RegistryError, Snapshot
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
    entry, _ = add_model(client, settings, redis_keys.served(settings.model_name, DEFAULT_VERSION), folder,
                         in_place=True, if_missing=True)
    return None if entry is None else f"registered the default model as {entry.ref} ({folder})"
