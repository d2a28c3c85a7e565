"""The worker's Celery app: the queue's configuration (ops/core/queue.py) plus its tasks and its
broker transport (workers/transport.py, kombu's Redis transport kept alive across a broker restart;
its Sentinel variant when BRIGADE_REDIS_URL is a `redis+sentinel://` URL).

Importing this module loads no model and no torch. The model is loaded once per worker process
by the worker_init hook in workers/tasks.py.
"""
from __future__ import annotations

from ops.core.queue import make_app
from ops.core.redis_address import is_sentinel
from ops.core.settings import get_settings

TRANSPORT = "workers.transport:Transport"
SENTINEL_TRANSPORT = "workers.transport:SentinelTransport"

app = make_app(include=["workers.tasks"],
               transport=SENTINEL_TRANSPORT if is_sentinel(get_settings().redis_url) else TRANSPORT)
