"""Celery tasks and the worker's start/stop hooks.

The worker runs the threads pool: there is no fork, so the model is loaded once in the main
process, before Celery starts (load_model; or in `worker_init`, before the consumer, when Celery is
started some other way), and shared by every task thread through one EngineHost.

The settings are the worker's, given once by the command that starts it (`load_model`): the
version it serves is in them. Started some other way (`celery -A workers.app worker`), the
worker reads them from the environment.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from celery import Celery
from celery.signals import task_received, worker_init, worker_shutdown, worker_shutting_down

from engine import Engine
from ops.core.messages import QueuedRequest
from ops.core.queue import BATCH_TASK, GENERATE_TASK
from ops.core.settings import Settings
from workers.engine_host import EngineHost
from workers.engine_loading import EngineUnavailable, load_engine

log = logging.getLogger("brigade.worker")
_host: EngineHost | None = None
_engine: Engine | None = None  # loaded by load_model() before Celery starts
_settings: Settings | None = None  # the worker's, from load_model()
_instance: str | None = None  # chosen by the command before Celery starts (new_instance)


def new_instance(worker_name: str) -> str:
    """This process's worker instance, chosen before its Celery app is built: the app's transport
    marks messages taken by it and consumes its own queue (keys.worker_queue)."""
    global _instance
    _instance = f"{worker_name}#{uuid.uuid4().hex[:8]}"
    return _instance


def load_model(settings: Settings) -> None:
    """Load the engine before Celery starts the worker; raises EngineUnavailable. `brigade worker`
    calls it first, so a worker that cannot hold its model exits before it joins the queue."""
    global _engine, _settings
    _settings = settings
    _engine = load_engine(settings)


def _worker_settings() -> Settings:
    global _settings
    if _settings is None:  # started by Celery's own command: the environment's
        _settings = Settings()
    return _settings


def register(app: Celery) -> None:
    """The worker's tasks, on the app that runs them (workers/app.py builds it)."""
    app.task(name=BATCH_TASK)(generate_batch_line)
    app.task(name=GENERATE_TASK)(generate)


@worker_init.connect
def _load_engine(sender=None, **_):
    global _host
    name = getattr(sender, "hostname", None) or f"brigade-{os.getpid()}@{socket.gethostname()}"
    try:
        _host = EngineHost.start(_worker_settings(), name, _engine, instance=_instance)
    except EngineUnavailable as exc:
        # Celery logs and ignores an Exception from a signal handler, and would then consume with
        # no engine; SystemExit ends the worker before its consumer starts.
        raise SystemExit(f"brigade worker: {exc}") from None


@task_received.connect
def _note_taken(request=None, **_):
    # The message has left the queue for this worker, which may hold it in its prefetch for a
    # while before a task thread claims it. If this worker dies in between, the reaper learns
    # from this mark, not from reading the whole queue, that the request must be sent again.
    if _host is None or request is None or request.name not in (GENERATE_TASK, BATCH_TASK):
        return
    try:
        _host.note_taken(request.args[0]["request_id"])
    except (LookupError, TypeError):
        log.warning("event=unreadable_task task_id=%s", request.id)


@worker_shutting_down.connect
def _drain(sig=None, how=None, **_):
    # Sent on SIGTERM/SIGINT before Celery's warm shutdown waits for running tasks: the drain
    # ends every task within drain_seconds (finished, or handed back), so that wait is bounded.
    if _host is not None and how == "Warm":
        threading.Thread(target=_host.drain, args=(_worker_settings().drain_seconds,), name="brigade-drain", daemon=True).start()


@worker_shutdown.connect
def _close_engine(**_):
    if _host is not None:
        _host.close()


def generate_batch_line(payload: dict) -> dict:
    return generate(payload)


def generate(payload: dict) -> dict:
    queued = QueuedRequest.model_validate(payload)
    if _host is None:
        raise RuntimeError("the engine is not loaded: this task runs only inside `brigade worker`")
    reason = _host.serve(queued)
    return {"request_id": queued.request_id, "finish_reason": reason}
