"""`brigade worker`: one Celery worker holding one model, the version it serves in its settings.

The version is the registered one named by `--model` (NAME alone: its stable version), else the
registry's default model; with an empty registry, or BRIGADE_MODEL set, the settings' folder
unversioned, as before the registry. Its settings say which, and reach the Celery app, the tasks
and the engine through their constructors.
"""
from __future__ import annotations

import os
import socket
import sys
import warnings

from ops.core.redaction import redact_url
from ops.core.settings import Settings


def served_settings(model: str | None, settings: Settings) -> Settings | str:
    """The settings of the registered version this worker serves (the same settings when it
    serves BRIGADE_MODEL unversioned), or an error line when it cannot serve it."""
    import redis

    from ops.rollout.registry import RegistryError
    from ops.rollout.model_store import ModelNotHere, resolve_served

    try:
        served = resolve_served(model, settings)
    except (RegistryError, ModelNotHere) as exc:
        return str(exc)
    except redis.RedisError as exc:
        return f"the registry's Redis at {redact_url(settings.redis_url)} did not answer ({exc}); cannot serve {model}"
    if served is None:
        return settings
    update = {"model_name": served.name, "model_version": served.version}
    # The default model's own folder keeps BRIGADE_MODEL unset, so that it keeps its recommended
    # sampling defaults (ops/core/sampling_defaults.py), as it does unregistered.
    if settings.model or served.folder.resolve() != settings.model_dir.resolve():
        update["model"] = str(served.folder)
    return settings.model_copy(update=update)


def cmd_worker(args, settings: Settings) -> int:
    settings = served_settings(args.model, settings)
    if isinstance(settings, str):
        print(f"brigade worker: {settings}", file=sys.stderr)
        return 1
    from ops.core.redis_keys import interactive_queue, worker_queue
    from workers import tasks
    from workers.app import worker_app
    from workers.engine_loading import EngineUnavailable

    name = args.name or f"brigade-{os.getpid()}@{socket.gethostname()}"
    # The model first: a worker that cannot hold it (a device this machine lacks, missing files,
    # too little memory) says why in one line and exits before it takes anything from the queue.
    try:
        tasks.load_model(settings)
    except EngineUnavailable as exc:
        print(f"brigade worker: {exc}", file=sys.stderr)
        return 1
    # Celery warns at every start of a worker run as root (as in many containers and these
    # machines). Brigade's workers accept JSON only, never pickle, which is what makes root
    # dangerous for a Celery worker (Celery itself refuses root with pickle); the compose image
    # runs as an unprivileged user.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser privileges")
    # Its own queue beside the shared one: requests routed to it because its prefix cache holds
    # their prompt's start (docs/scaling.md).
    instance = tasks.new_instance(name)
    queues = [interactive_queue(settings.model_name, settings.model_version),
              worker_queue(settings.model_name, settings.model_version, instance)]
    argv = [
        "--quiet",  # no 20-line banner: event=worker_ready says what matters, in one line
        "worker", "--pool", "threads", "--concurrency", str(settings.task_threads),
        "--queues", ",".join(queues), "--hostname", name,
        "--task-events", "--without-gossip", "--without-mingle", "--loglevel", args.loglevel,
    ]
    worker_app(settings, instance).worker_main(argv)
    return 0
