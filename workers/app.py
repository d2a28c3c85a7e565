"""The worker's Celery app: the queue's configuration (ops/core/queue.py) plus its tasks and its
broker transport (workers/transport.py, kombu's Redis transport kept alive across a broker restart).

Importing this module loads no model and no torch. The model is loaded once per worker process
by the worker_init hook in workers/tasks.py.
"""
from __future__ import annotations

from ops.core.queue import make_app

TRANSPORT = "workers.transport:Transport"

app = make_app(include=["workers.tasks"], transport=TRANSPORT)
