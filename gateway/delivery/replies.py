"""Workers' events into the reply router: this gateway's pub/sub channel, and replay logs.

One subscription per gateway carries the live events of every request it queued. After a lost
subscription, each live route catches up from its request's replay log before listening again,
so nothing falls in the gap. Resumed requests (any gateway's) are followed through their replay
logs with XREAD. Every event goes through the router, which decides once what its client sees;
each resulting delivery is handed to `deliver`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import redis.asyncio as aioredis

from gateway.delivery.events import StreamError
from gateway.delivery.router import GAP, Delivery, ReplyRouter, Route
from ops.core import redis_keys
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.redis_clients import async_client, async_outage_retry, outage_pause_s
from ops.core.settings import Settings

log = logging.getLogger("brigade.gateway")

LOST_WITH_REDIS = "the request was lost while Redis was unavailable; resend it"
CATCH_UP_PAGE = 64  # replay-log entries read per round trip when reading back from the newest


class ReplyIntake:
    def __init__(self, settings: Settings, router: ReplyRouter, redis: aioredis.Redis, reply_channel: str,
                 deliver: Callable[[Delivery], None], spawn: Callable,
                 resend: Callable[[QueuedRequest], Awaitable[None]] | None = None):
        self.settings = settings
        # Puts a request on the queue again (RequestStore.put): for one Redis lost before it ran.
        self.resend = resend
        self.router = router
        self.redis = redis
        self.reply_channel = reply_channel
        self.deliver = deliver
        self.spawn = spawn
        # The subscriber has no read timeout (it idles between events) but checks its connection.
        self.subscriber = async_client(settings.redis_url, timeout_s=None, health_check_interval=30)
        # XREAD blocks for a while: this connection's read timeout must outlast the block.
        self.follower = async_client(settings.redis_url, timeout_s=10)
        self.subscribed = asyncio.Event()
        self.follow_changed = asyncio.Event()

    def _send(self, delivery: Delivery | None) -> None:
        if delivery is not None:
            self.deliver(delivery)

    async def listen(self) -> None:
        again = False
        while True:
            pubsub = await self._subscribe_through_outage(again)
            again = True
            self.subscribed.set()
            confirmations = 0
            try:
                async for message in pubsub.listen():
                    kind = message.get("type")
                    if kind == "subscribe":
                        confirmations += 1
                        if confirmations > 1:
                            # redis-py reconnected and subscribed again by itself (the connection's
                            # Retry), raising nothing: what was published while it was away is in
                            # the replay logs only. Without this, a request that finished in that
                            # gap (a Redis restart) waited for ever.
                            log.info("event=reply_router_resubscribed routes=%d", len(self.router.live))
                            self.spawn(self.catch_up(list(self.router.live)))
                        continue
                    if kind != "message":
                        continue
                    try:
                        event = ReplyEvent.model_validate_json(message["data"])
                    except ValueError:
                        log.error("event=bad_reply_event data=%r", message["data"][:200])
                        continue
                    outcome = self.router.accept(event)
                    if outcome is GAP:
                        # Something was missed. The replay log has it, in order.
                        self.spawn(self.catch_up([event.request_id]))
                    else:
                        self._send(outcome)
            except Exception as exc:  # Redis, or anything else: the router must outlive it
                log.warning("event=reply_router_reconnect error=%r retry_s=0", exc)

    async def _subscribe_through_outage(self, again: bool):
        """Subscribe (and after a lost subscription catch up), trying until it works: redis-py's
        Retry, a fresh run of it for each lost subscription. Past the outage grace every waiting
        client is told, rather than left waiting for a Redis that may not come back."""
        down_since = time.monotonic()

        async def lost(exc: Exception, failures: int) -> None:
            log.warning("event=reply_router_reconnect error=%r retry_s=%.2f", exc, outage_pause_s(failures))
            if time.monotonic() - down_since > self.settings.redis_outage_grace_s:
                self.fail_all("unavailable", "the service lost its connection to Redis; resend the request")

        return await async_outage_retry(errors=(Exception,)).call_with_retry(
            lambda: self._subscribe(again), lost, with_failure_count=True)

    async def _subscribe(self, again: bool):
        # Subscribe confirmations are kept: a second one on the same pubsub is a silent reconnect.
        pubsub = self.subscriber.pubsub()
        await pubsub.subscribe(self.reply_channel)
        if again:
            # Pub/sub lost whatever was published while we were away; the replay logs did not.
            await self.catch_up(list(self.router.live))
            log.info("event=reply_router_reconnected routes=%d", len(self.router.live))
        return pubsub

    async def catch_up(self, rids: list[str]) -> None:
        """Forward what each request's replay log holds beyond what its client has; a request
        whose records are gone (Redis lost its data) ends with an error instead of waiting forever."""
        for rid in rids:
            route = self.router.live.get(rid)
            if route is None:
                continue
            if route.stored is not None and not route.stored.is_set():
                # Admitted but not yet stored (its put may be waiting out the very failover that
                # brought this catch-up): its record is missing because it is not written *yet*,
                # and nothing of it can have been published. Ending it here told a request about
                # to be queued that it was lost. It is caught up once stored.
                route.catching_up = False
                self.spawn(self._catch_up_once_stored(route))
                continue
            try:
                entries = await self._unread_retrying(route)
            finally:
                # Live events that arrived meanwhile each started their own catch-up.
                route.catching_up = False
            for _, fields in entries:
                if self.router.live.get(rid) is not route:
                    break
                event = logged_event(fields)
                if event is not None:
                    self._send(self.router.forward(route, event))
            if (self.router.live.get(rid) is route and not entries
                    and not await self.redis.exists(redis_keys.stream(rid), redis_keys.request(rid))):
                log.warning("event=request_lost_with_redis request_id=%s", rid)
                await self._resend_or_end(route)

    async def _resend_or_end(self, route: Route) -> None:
        """Redis lost this request's records (a failover that lost the primary's last writes: seen
        when sentinels on a starved machine promoted two replicas in turn). One that never sent its
        client a token is put on the queue again, as it was stored: its client sees a later first
        token, not a lost request. One that had begun cannot be continued without its log: its
        client is told to resend it."""
        if route.next_index == 0 and route.queued is not None and self.resend is not None:
            try:
                await self.resend(route.queued)
                log.warning("event=request_resent_after_loss request_id=%s", route.request_id)
                return
            except Exception as exc:  # Redis still away: the error below stands
                log.warning("event=request_resend_failed request_id=%s error=%r", route.request_id, exc)
        self.end_with_error(route, "unavailable", LOST_WITH_REDIS)

    async def _catch_up_once_stored(self, route: Route) -> None:
        await route.stored.wait()
        if self.router.live.get(route.request_id) is route:
            await self.catch_up([route.request_id])

    async def _unread_retrying(self, route: Route) -> list:
        """_unread, tried again while Redis is coming back (a catch-up right after a restart meets
        refused connections): a catch-up that gave up would leave its route waiting for an event
        that only the replay log still holds. Past the outage grace the error stands."""
        deadline = time.monotonic() + self.settings.redis_outage_grace_s
        failures = 0
        while True:
            try:
                return await self._unread(route)
            except aioredis.RedisError as exc:
                failures += 1
                if time.monotonic() > deadline:
                    raise
                log.debug("event=catch_up_retry request_id=%s error=%r", route.request_id, exc)
                await asyncio.sleep(outage_pause_s(failures))  # the outage retries' own backoff

    async def _unread(self, route: Route) -> list:
        """The replay-log entries a live route has not been given, oldest first, without reading
        the whole log for every gap: after its first catch-up a route remembers where the log
        stood; the first one reads back from the newest entry only to the token its client has."""
        key = redis_keys.stream(route.request_id)
        if route.stream_id != "0-0":
            entries = await self.redis.xrange(key, min=f"({route.stream_id}")
        else:
            entries, newest = [], "+"
            while True:
                page = await self.redis.xrevrange(key, max=newest, count=CATCH_UP_PAGE)
                known = next((i for i, (_, fields) in enumerate(page) if _delivered(fields, route.next_index)), None)
                entries += page if known is None else page[:known]
                if known is not None or len(page) < CATCH_UP_PAGE:
                    break
                newest = f"({page[-1][0]}"
            entries.reverse()
        if entries:
            route.stream_id = entries[-1][0]
        return entries

    def follow(self, route: Route) -> None:
        displaced = self.router.followed.get(route.request_id)
        if displaced is not None and displaced.sink is not route.sink:
            # One follower per request on a gateway: the newest resume wins, the older one is told.
            self.router.remove(route.request_id, displaced.sink)
            displaced.sink.send(StreamError(displaced.client_id, "resumed_elsewhere",
                                            "this request was resumed on another connection"))
            displaced.sink.ended(displaced.client_id)
        self.router.add(route, followed=True)
        self.follow_changed.set()

    async def follow_streams(self) -> None:
        """Resumed requests: read their replay logs from where each client stands, then live."""
        followed = self.router.followed
        while True:
            if not followed:
                self.follow_changed.clear()
                await self.follow_changed.wait()
                continue
            self.follow_changed.clear()
            rid_of = {redis_keys.stream(rid): rid for rid in followed}
            reading = dict(followed)  # the routes this read is for; a route replaced meanwhile starts anew
            streams = {redis_keys.stream(rid): route.stream_id for rid, route in followed.items()}
            replies = await self._read_through_outage(streams)
            for stream_key, entries in replies or []:
                rid = rid_of[stream_key]
                for entry_id, fields in entries:
                    route = followed.get(rid)
                    if route is None or route is not reading.get(rid):
                        break
                    route.stream_id = entry_id
                    event = logged_event(fields)
                    if event is not None:
                        self._send(self.router.forward(route, event))

    async def _read_through_outage(self, streams: dict[str, str]) -> list:
        """XREAD the followed logs, trying until Redis answers (redis-py's Retry). Back from an
        error, a log that vanished (Redis lost its data) ends its follow before the next read."""
        failed = False

        async def read() -> list:
            if failed:
                await self._end_vanished_follows()
            return await self.follower.xread(streams, count=1000, block=250)

        async def lost(exc: Exception, failures: int) -> None:
            nonlocal failed
            failed = True
            log.warning("event=stream_follower_error error=%r retry_s=%.2f", exc, outage_pause_s(failures))

        retry = async_outage_retry(errors=(aioredis.RedisError, OSError))
        return await retry.call_with_retry(read, lost, with_failure_count=True)

    async def _end_vanished_follows(self) -> None:
        for rid, route in list(self.router.followed.items()):
            if not await self.follower.exists(redis_keys.stream(rid), redis_keys.request(rid)):
                self.end_with_error(route, "unavailable", LOST_WITH_REDIS)

    def fail_all(self, code: str, message: str) -> None:
        for route in self.router.routes():
            self.end_with_error(route, code, message)

    def end_with_error(self, route: Route, code: str, message: str) -> None:
        self._send(self.router.forward(route, ReplyEvent(type="error", request_id=route.request_id, code=code,
                                                         message=message)))

    async def close(self) -> None:
        for client in (self.subscriber, self.follower):
            await client.aclose()


def _delivered(fields: dict, next_index: int) -> bool:
    """Is this log entry a token the client already has? (Reading back stops there.)"""
    event = logged_event(fields)
    return event is not None and event.type == "token" and event.index is not None and event.index < next_index


def logged_event(fields: dict) -> ReplyEvent | None:
    """One replay-log entry as an event; a malformed entry is logged and skipped, never fatal."""
    try:
        return ReplyEvent.model_validate_json(fields["event"])
    except (KeyError, ValueError):
        log.error("event=bad_log_entry fields=%r", str(fields)[:200])
        return None
