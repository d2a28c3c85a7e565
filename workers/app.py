"""The worker's Celery app: the queue's configuration (ops/core/queue.py) plus its tasks and its
broker transport (workers/transport.py, kombu's Redis transport kept alive across a broker restart;
its Sentinel variant when the Redis URL is a `redis+sentinel://` URL).

`brigade worker` builds its app from the settings of the version it serves (`worker_app`). The
module's `app` is the same built from the environment, on first use: what `celery -A workers.app`
and whoever imports it for its app (Flower's task names, tests) find.

Importing this module loads no model and no torch. The model is loaded once per worker process
by `workers.tasks.load_model`, or by its worker_init hook.
"""
from __future__ import annotations

import functools

from celery import Celery

from ops.core.queue import make_app
from ops.core.redis_address import is_sentinel
from ops.core.settings import Settings
from workers import tasks
from workers.transport import TAKER_OPTION

TRANSPORT = "workers.transport:Transport"
SENTINEL_TRANSPORT = "workers.transport:SentinelTransport"


def worker_app(settings: Settings, instance: str | None = None) -> Celery:
    """`instance`: the worker instance that will receive this app's messages; its transport marks
    each request taken by it as the message arrives (workers/transport.py)."""
    app = make_app(include=["workers.tasks"], settings=settings,
                   transport=SENTINEL_TRANSPORT if is_sentinel(settings.redis_url) else TRANSPORT)
    if instance:
        app.conf.broker_transport_options = {**app.conf.broker_transport_options, TAKER_OPTION: instance}
    tasks.register(app)
    return app


@functools.cache
def _environment_app() -> Celery:
    return worker_app(Settings())


def __getattr__(name: str):
    if name == "app":  # built on first use, so that `brigade worker` builds only its own
        return _environment_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
