"""The sending side of the queue: task names, queues, priorities, and `QueueSender`.

The gateway, the reaper and a draining worker put requests on a model's queue through here, so
none of them imports workers/ to send: each holds a `QueueSender` built from its own settings. The Celery configuration lives here too, once: the worker
app (workers/app.py) is this configuration plus its tasks and its broker transport.
Importing this module loads no model and no torch.
"""
from __future__ import annotations

import threading
import time
import uuid

from celery import Celery
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from ops.core import redis_keys
from ops.core.redis_keys import BATCH_STEP, interactive_queue
from ops.core.messages import QueuedRequest
from ops.core.redis_address import (
    is_sentinel,
    is_tls,
    kombu_broker,
    kombu_ssl,
    parse_sentinel,
    tls_options,
    without_tls_options,
)
from ops.core.settings import Settings

GENERATE_TASK = "brigade.generate"
BATCH_TASK = "brigade.generate.batch"  # the same work under its own name, so Flower shows batch lines apart

# Redis priorities (kombu): lower is served first. A request continued after a crash or a drain
# has a client mid-answer, so it goes ahead of new work instead of behind the whole queue. Batch
# lines wait behind all interactive work (kombu pops the lower steps' lists first).
SENTINEL_TRANSPORT = "ops.core.sentinel_transport:SentinelTransport"

# What a send raises while the broker is away (kombu wraps redis-py's errors once its own publish
# retries are spent): the errors worth waiting out.
SEND_ERRORS = (RedisError, OSError, OperationalError)

# Headers every message carries beside Celery's own (QueueSender.send says why).
RID_HEADER = "brigade_rid"
SENT_HEADER = "brigade_sent"

NEW_PRIORITY = 6
CONTINUED_PRIORITY = 0
BATCH_PRIORITY = BATCH_STEP


def make_app(redis_url: str | None = None, include: list[str] | None = None, transport: str | None = None,
             set_as_current: bool = True, settings: Settings | None = None) -> Celery:
    """A Celery app on Brigade's broker: JSON only, late acks, one message prefetched at a time.
    `settings`: the caller's; without them, the environment's (a test's, a one-off's)."""
    settings = settings if settings is not None else Settings()
    url = redis_url or settings.redis_url
    tls = tls_options(url)  # the URL's (the settings' BRIGADE_REDIS_TLS_* are in it), its files checked
    broker = without_tls_options(url)  # TLS goes to kombu once, as broker_use_ssl (below)
    transport_options: dict = {}
    sentinel = parse_sentinel(url) if is_sentinel(url) else None
    if sentinel is not None:
        # kombu's form of the same primary: a `sentinel://` URL per sentinel, the master's name
        # and the sentinels' own password (and TLS) as transport options (kombu's SentinelChannel)
        broker, transport_options = kombu_broker(sentinel)
    app = Celery("brigade", broker=broker, include=include or [], set_as_current=set_as_current)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],  # never pickle
        result_serializer="json",
        task_ignore_result=True,  # answers travel as token events, not as task results: no result backend
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=interactive_queue(settings.model_name, settings.model_version),
        task_send_sent_event=True,
        worker_send_task_events=True,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        # The reaper continues a dead worker's requests within seconds; Celery's redelivery after
        # the visibility timeout is the second line, and its duplicates are skipped by the claim.
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s, **transport_options},
    )
    if is_tls(url):
        # TLS for the broker as every other client has it, from the URL's options: kombu reads a
        # bare rediss:// as TLS without a certificate check, and only when the URL's scheme picks the
        # transport (a transport named below would connect in the clear); Flower's broker page
        # reads TLS from broker_use_ssl alone, never from the URL.
        app.conf.broker_use_ssl = kombu_ssl(tls)
    if sentinel is not None and not transport:
        transport = SENTINEL_TRANSPORT  # every sentinel, after any failover (the module says why)
    if transport:
        app.conf.broker_transport = transport
    return app


class QueueSender:
    """Puts requests on their model's queue, through an app built on first use from these
    settings, never the process's current app: in a worker process the worker's own app (with its
    tasks) stays the one Celery resolves."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self._app: Celery | None = None
        self._building = threading.Lock()  # sends come from several threads (asyncio.to_thread)

    @property
    def app(self) -> Celery:
        with self._building:
            if self._app is None:
                self._app = make_app(settings=self.settings, set_as_current=False)
            return self._app

    def send(self, queued: QueuedRequest, first: bool = False, worker: str | None = None,
             sent_at: float | None = None) -> None:
        """Put a request on its model's queue: first by the gateway, again by a reaper or a drain;
        on one worker's own queue when `worker` (an instance) is named: the routing chose it.
        Each send gets its own task id (the request id plus a suffix) so Flower tells them apart.
        Every message carries the request id and when it was sent (`SENT_HEADER`): the reaper
        reads the time at the tail of a queue to tell a lost message from one still waiting, and a
        worker's transport marks the request taken the moment its message arrives. `sent_at`: the
        time its unclaimed mark holds (redis_keys.UNCLAIMED), so that the reaper compares one reading of
        one clock (a send that waits out a failover, or an admission that took seconds, must not
        make its own message look younger than the request)."""
        rid = queued.request_id
        shown = {} if self.settings.flower_show_prompts else {"argsrepr": task_summary(queued), "kwargsrepr": "{}"}
        batch = queued.lane == "batch"
        queue = (redis_keys.worker_queue(queued.model, queued.version, worker) if worker
                 else interactive_queue(queued.model, queued.version))
        self.app.send_task(BATCH_TASK if batch else GENERATE_TASK, args=[queued.model_dump(mode="json")],
                           queue=queue, task_id=rid if first else f"{rid}-{uuid.uuid4().hex[:6]}",
                           headers={RID_HEADER: rid, SENT_HEADER: time.time() if sent_at is None else sent_at},
                           priority=BATCH_PRIORITY if batch else NEW_PRIORITY if first else CONTINUED_PRIORITY, **shown)


def task_summary(queued: QueuedRequest) -> str:
    """What task events (and so Flower) show of a request instead of its arguments: its shape,
    never its text. Prompts are the users' words; whoever watches the workers need not read them."""
    shape = {"request_id": queued.request_id, "model": redis_keys.served(queued.model, queued.version), "lane": queued.lane,
             "max_tokens": queued.params.max_tokens}
    if queued.prompt is not None:
        shape["prompt_chars"] = len(queued.prompt)
    if queued.messages is not None:
        shape["messages"] = len(queued.messages)
        shape["message_chars"] = sum(len(m.content) for m in queued.messages)
    return repr([shape])
