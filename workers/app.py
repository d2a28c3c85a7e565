"""The Celery app: Redis broker, JSON only, late acks, one message prefetched at a time.

Importing this module loads no model and no torch, so the gateway can send tasks with it.
The model is loaded once per worker process by the worker_init hook in workers/tasks.py.
"""
from __future__ import annotations

from celery import Celery

from ops.keys import interactive_queue
from ops.settings import get_settings

GENERATE_TASK = "brigade.generate"


def make_app(redis_url: str | None = None) -> Celery:
    settings = get_settings()
    app = Celery("brigade", broker=redis_url or settings.redis_url, include=["workers.tasks"])
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],  # never pickle
        result_serializer="json",
        task_ignore_result=True,  # answers travel as token events, not as task results
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=interactive_queue(settings.model_name),
        task_send_sent_event=True,
        worker_send_task_events=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": 3600},
    )
    return app


app = make_app()
