"""The gateway's reply intake against a real redis-server: a gap in a live route is filled from
the replay log by reading only what the client lacks, not the whole log; a catch-up (after a
lost subscription: a Redis restart, a Sentinel failover) ends a request whose records are gone,
and never one whose records are merely not written yet."""
from __future__ import annotations

import asyncio
import contextlib
import time

from gateway.delivery.events import ClientEvent, StreamError, Token
from gateway.delivery.replies import CATCH_UP_PAGE, ReplyIntake
from gateway.delivery.router import ReplyRouter, Route
from ops.core import redis_keys
from ops.core.messages import ReplyEvent
from ops.core.redis_clients import async_client
from ops.core.settings import Settings
from tests.services import queued_params, wait_until_async


class Collect:
    def send(self, event: ClientEvent) -> None: ...

    def queued(self, client_id: str, request_id: str) -> None: ...

    def ended(self, client_id: str) -> None: ...


def log_tokens(client, rid: str, start: int, stop: int) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(start, stop):
        event = ReplyEvent(type="token", request_id=rid, epoch=1, index=i, text=f"t{i} ")
        pipe.xadd(redis_keys.stream(rid), {"event": event.model_dump_json(exclude_none=True)})
    pipe.execute()


@contextlib.asynccontextmanager
async def intake_on(url: str):
    """A reply intake over a real Redis, with an empty router; yields it and its deliveries."""
    delivered = []
    aio = async_client(url)
    intake = ReplyIntake(Settings(redis_url=url), ReplyRouter(), aio, "reply", delivered.append, asyncio.ensure_future)
    try:
        yield intake, delivered
    finally:
        await intake.close()
        await aio.aclose()


def commands(client) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in client.info("commandstats").items()
            if not k.startswith(("cmdstat_info", "cmdstat_config", "cmdstat_hello", "cmdstat_client"))}  # (connection set-up)


def test_a_gap_reads_back_from_the_newest_entry_only_to_what_the_client_has(redis_server):
    client, rid = redis_server.client, "gap-request"
    client.delete(redis_keys.stream(rid))
    log_tokens(client, rid, 0, 2000)

    async def main():
        async with intake_on(redis_server.url) as (intake, delivered):
            intake.router.add(Route(rid, "c", Collect(), next_index=1990, keep_text=False))
            client.config_resetstat()
            await intake.catch_up([rid])
            first = commands(client)
            # More tokens, another gap: read from where the last catch-up left off.
            log_tokens(client, rid, 2000, 2010)
            client.config_resetstat()
            await intake.catch_up([rid])
            second = commands(client)
        return [d.event.index for d in delivered], first, second

    indexes, first, second = asyncio.run(main())
    assert indexes == list(range(1990, 2010))
    assert first == {"xrevrange": 1}, first  # one page of CATCH_UP_PAGE covers the ten it lacked
    assert second == {"xrange": 1}, second
    assert CATCH_UP_PAGE < 2000  # so reading the whole log would have taken more than one page


def test_a_gap_longer_than_a_page_is_read_back_page_by_page_in_order(redis_server):
    client, rid = redis_server.client, "long-gap"
    client.delete(redis_keys.stream(rid))
    log_tokens(client, rid, 0, 300)

    async def main():
        async with intake_on(redis_server.url) as (intake, delivered):
            route = Route(rid, "c", Collect(), next_index=100, keep_text=True, chunks=[f"t{i} " for i in range(100)])
            intake.router.add(route)
            await intake.catch_up([rid])
        return [d.event.index for d in delivered], route.text

    indexes, text = asyncio.run(main())
    assert indexes == list(range(100, 300))
    assert text == "".join(f"t{i} " for i in range(300))


def test_the_gateways_pooled_client_survives_a_redis_restart_without_failing_a_command(redis_server):
    """Every pooled connection is dead after a restart; the first command on one is tried again."""

    async def main():
        client = async_client(redis_server.url)
        await asyncio.gather(*[client.set(f"k{i}", i) for i in range(8)])  # several pooled connections
        redis_server.stop()
        redis_server.start()
        try:
            return await asyncio.gather(*[client.ping() for _ in range(8)])
        finally:
            await client.aclose()

    assert asyncio.run(main()) == [True] * 8


def test_a_catch_up_never_ends_a_route_whose_request_is_not_stored_yet(redis_server):
    """Issue 38: a request admitted during a failover had its route in the router while its put
    waited for the new primary; the catch-up after the resubscription found neither its record
    nor its log and told its client it was lost, within 20 ms of its `enqueued`. Now it waits until
    the request is stored, then catches up like any route; a stored route whose records are gone
    is still ended (Redis lost its data)."""
    client, pending, lost = redis_server.client, "not-yet-stored", "records-gone"
    client.delete(redis_keys.stream(pending), redis_keys.request(pending), redis_keys.stream(lost), redis_keys.request(lost))

    async def main():
        async with intake_on(redis_server.url) as (intake, delivered):
            storing = asyncio.Event()
            route = Route(pending, "c1", Collect(), held=[], stored=storing)
            intake.router.add(route)
            intake.router.add(Route(lost, "c2", Collect()))
            await intake.catch_up([pending, lost])
            await asyncio.sleep(0.2)  # any task the catch-up spawned has run by now
            after_catch_up = [(d.route.request_id, type(d.event)) for d in delivered]
            still_live = pending in intake.router.live
            # The put goes through: record, then the worker's first token is logged (pub/sub lost it).
            client.set(redis_keys.request(pending), "{}", ex=60)
            log_tokens(client, pending, 0, 1)
            route.held = None
            storing.set()
            await wait_until_async(lambda: len(delivered) > len(after_catch_up), 5, what="the stored route's catch-up")
            return after_catch_up, still_live, [(d.route.request_id, type(d.event)) for d in delivered]

    after_catch_up, still_live, after_stored = asyncio.run(main())
    assert after_catch_up == [(lost, StreamError)], after_catch_up  # the pending one was not judged
    assert still_live
    assert after_stored == [(lost, StreamError), (pending, Token)], after_stored


def test_a_request_redis_lost_before_it_ran_is_queued_again_and_one_that_began_is_told(redis_server):
    """Seen in make test-long on a starved machine: sentinels promoted two replicas in turn, and the
    first one's writes (requests stored and queued on it) were lost when it was made a replica of
    the second. A request that never sent its client a token is put on the queue again, as it was
    stored; one that had begun cannot continue without its log, and its client is told."""
    from gateway.admission.request_store import RequestStore
    from ops.core.messages import QueuedRequest
    from ops.core.queue import QueueSender

    client = redis_server.client
    settings = Settings(redis_url=redis_server.url)

    def queued(rid: str) -> QueuedRequest:
        client.delete(redis_keys.stream(rid), redis_keys.request(rid), redis_keys.claim(rid))
        return QueuedRequest(request_id=rid, client_id=rid, reply_channel="reply", enqueued_at=time.time(),
                             model="lost-model", prompt="hi", params=queued_params(max_tokens=4))

    async def main():
        aio = async_client(redis_server.url)
        store = RequestStore(settings, aio, QueueSender(settings))
        delivered = []
        intake = ReplyIntake(settings, ReplyRouter(), aio, "reply", delivered.append, asyncio.ensure_future,
                             resend=store.put)
        try:
            unstarted = Route("unstarted", "c1", Collect(), queued=queued("unstarted"))
            begun = Route("begun", "c2", Collect(), next_index=3, queued=queued("begun"))
            intake.router.add(unstarted)
            intake.router.add(begun)
            await intake.catch_up(["unstarted", "begun"])
            return [(d.route.request_id, type(d.event)) for d in delivered], list(intake.router.live)
        finally:
            await intake.close()
            await aio.aclose()

    delivered, live = asyncio.run(main())
    assert delivered == [("begun", StreamError)]
    assert live == ["unstarted"]  # still waiting for its answer
    assert QueuedRequest.model_validate_json(client.get(redis_keys.request("unstarted"))).prompt == "hi"  # stored again
    assert client.zscore(redis_keys.UNCLAIMED, "unstarted") is not None  # and on its way to the queue
    assert any("unstarted" in m for name in redis_keys.queue_lists("lost-model", "") for m in client.lrange(name, 0, -1))
