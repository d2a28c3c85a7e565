"""Admission ends a request early and resumes it, for every door, against a real redis-server.

No worker and no model: what is checked is the one sequence every door uses (the route goes, the
request is stopped everywhere, the route is settled once) and resume's checks. The doors'
tests (test_service.py, test_openai_api.py, test_batch.py) drive the same paths end to end.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from gateway.admission.api_keys import KeyStore
from gateway.admission.content_guards import GuardInput
from gateway.admission.lifecycle import Caller, RequestContext, RequestLifecycle
from gateway.admission.limits import KeyLimiter
from gateway.admission.request_store import RequestStore
from gateway.admission.shadows import Shadows
from gateway.background import BackgroundTasks
from gateway.delivery.events import ClientEvent, StreamError
from gateway.delivery.replies import ReplyIntake
from gateway.delivery.router import ReplyRouter, Route
from gateway.request import ProtocolError
from ops.core import redis_keys
from ops.core.messages import QueuedRequest
from ops.core.queue import QueueSender
from ops.core.redis_clients import async_client
from ops.core.settings import Settings
from tests.services import queued_params


class Sink:
    def __init__(self) -> None:
        self.events: list[ClientEvent] = []
        self.ended_ids: list[str] = []

    def send(self, event: ClientEvent) -> None:
        self.events.append(event)

    def queued(self, client_id: str, request_id: str) -> None: ...

    def ended(self, client_id: str) -> None:
        self.ended_ids.append(client_id)


@contextlib.asynccontextmanager
async def admission_on(url: str, **overrides):
    settings = Settings(redis_url=url, **overrides)
    client = async_client(url)
    background = BackgroundTasks()
    router = ReplyRouter()
    delivered: list = []
    intake = ReplyIntake(settings, router, client, "brigade:reply:test", delivered.append, background.spawn)
    store = RequestStore(settings, client, QueueSender(settings))
    shadows = Shadows(settings, router, store, background.spawn)
    admission = RequestLifecycle(settings, client, router, intake, store, shadows, KeyStore(client),
                                 KeyLimiter(client), [], background.spawn)
    try:
        yield admission, background
    finally:
        await background.drain(timeout_s=5)
        await intake.close()
        await client.aclose()


def routed(admission: RequestLifecycle, sink: Sink) -> Route:
    rid = uuid.uuid4().hex
    context = RequestContext(Caller(None, "ws"), GuardInput(rid, "m", "a prompt", None))
    route = Route(rid, "c1", sink, context=context)
    admission.router.add(route)
    return route


def stopped(redis_server, rid: str) -> bool:
    return redis_server.client.get(redis_keys.cancelled(rid)) is not None


def run(coro):
    return asyncio.run(coro)


def test_a_cancel_removes_the_route_stops_the_request_and_settles_it_once(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, background):
            sink = Sink()
            route = routed(admission, sink)
            redis_server.client.zadd(redis_keys.UNCLAIMED, {route.request_id: time.time()})
            admission.cancel(route.request_id, sink)
            await background.drain(timeout_s=5)
            assert admission.router.live.get(route.request_id) is None
            assert stopped(redis_server, route.request_id)
            assert redis_server.client.zscore(redis_keys.UNCLAIMED, route.request_id) is None  # queued: never runs
            assert route.context.settled
    run(main())


def test_a_cancel_stops_the_request_even_when_this_gateway_no_longer_routes_it(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, background):
            rid = uuid.uuid4().hex
            admission.cancel(rid, Sink())
            await background.drain(timeout_s=5)
            assert stopped(redis_server, rid)
    run(main())


def test_a_refusal_mid_answer_tells_its_client_once_and_stops_the_request(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, background):
            sink = Sink()
            route = routed(admission, sink)
            admission.refuse_midway(route, "content_blocked", "refused by guard g: no")
            admission.refuse_midway(route, "internal_error", "a second refusal finds nothing to end")
            await background.drain(timeout_s=5)
            assert sink.events == [StreamError("c1", "content_blocked", "refused by guard g: no")]
            assert sink.ended_ids == ["c1"]
            assert stopped(redis_server, route.request_id) and route.context.settled
    run(main())


def test_an_abandoned_request_stops_and_one_this_client_no_longer_follows_is_left_alone(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, background):
            sink, other = Sink(), Sink()
            route = routed(admission, sink)
            elsewhere = routed(admission, other)
            admission.abandon(route.request_id, sink)
            admission.abandon(elsewhere.request_id, sink)  # not this sink's: it runs on for its own client
            admission.abandon(None, sink)  # an HTTP client gone before its request was queued
            await background.drain(timeout_s=5)
            assert stopped(redis_server, route.request_id)
            assert not stopped(redis_server, elsewhere.request_id)
            assert admission.router.live.get(elsewhere.request_id) is elsewhere
    run(main())


def test_a_websocket_client_that_does_not_come_back_within_the_grace_time_has_its_request_stopped(redis_server):
    async def main():
        async with admission_on(redis_server.url, resume_grace_s=0.3) as (admission, background):
            gone, back = Sink(), Sink()
            left = routed(admission, gone)
            resumed = routed(admission, back)
            admission.hold_for_resume(left.request_id, gone)
            admission.hold_for_resume(resumed.request_id, back)
            assert admission.router.live.get(left.request_id) is None
            assert not stopped(redis_server, left.request_id)  # within the grace time it may come back
            # The second client resumes (on any gateway) after its old connection took the request on.
            redis_server.client.set(redis_keys.resumed(resumed.request_id), str(time.time()), ex=60)
            await asyncio.sleep(0.6)
            await background.drain(timeout_s=5)
            assert stopped(redis_server, left.request_id) and left.context.settled
            assert not stopped(redis_server, resumed.request_id) and not resumed.context.settled
    run(main())


def queue_record(redis_server, rid: str, api_key: str | None = None) -> None:
    queued = QueuedRequest(request_id=rid, client_id="c1", reply_channel="brigade:reply:old", enqueued_at=time.time(),
                           model="m", prompt="a prompt", params=queued_params(), api_key=api_key)
    redis_server.client.set(redis_keys.request(rid), queued.model_dump_json(), ex=60)


def test_resume_follows_a_known_request_from_the_replay_log_after_the_clients_last_token(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, _):
            rid, sink = uuid.uuid4().hex, Sink()
            queue_record(redis_server, rid)
            assert await admission.resume(rid, Caller(None, "ws"), sink, after_index=4)
            route = admission.router.followed[rid]
            assert route.sink is sink and route.next_index == 5
            assert redis_server.client.get(redis_keys.resumed(rid)) is not None  # the old connection must not stop it
    run(main())


def test_resume_of_a_cancelled_request_says_so_and_of_an_unknown_one_is_refused(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, _):
            cancelled = uuid.uuid4().hex
            queue_record(redis_server, cancelled)
            redis_server.client.set(redis_keys.cancelled(cancelled), "1", ex=60)
            assert not await admission.resume(cancelled, Caller(None, "ws"), Sink(), after_index=-1)
            assert cancelled not in admission.router.followed
            with pytest.raises(ProtocolError) as err:
                await admission.resume(uuid.uuid4().hex, Caller(None, "ws"), Sink(), after_index=-1)
            assert err.value.code == "unknown_request"
    run(main())


def test_a_batch_line_is_followed_again_only_while_its_request_has_a_replay_log(redis_server):
    async def main():
        async with admission_on(redis_server.url) as (admission, _):
            known, gone = uuid.uuid4().hex, uuid.uuid4().hex
            queue_record(redis_server, known)
            assert await admission.follow_again(known, "line-1", Sink())
            assert admission.router.followed[known].client_id == "line-1"
            assert not await admission.follow_again(gone, "line-2", Sink())
            assert gone not in admission.router.followed
    run(main())


# ---- shadows ------------------------------------------------------------------------------------


def _shadow_routes(admission: RequestLifecycle, served_text: list[str], shadow_text: list[str]):
    from gateway.admission.catalog import Choice
    from gateway.admission.shadows import ShadowContext, ShadowPair, ShadowSink

    served = routed(admission, Sink())
    served.keep_text, served.chunks = True, list(served_text)
    served.context.choice, served.context.shadows = Choice("m", "v1", "stable"), ["v3"]
    admission.shadows.pairs[served.request_id] = ShadowPair(shadows=1)
    shadow = Route(uuid.uuid4().hex, "s", ShadowSink(), keep_text=True, chunks=list(shadow_text),
                   context=ShadowContext(served.request_id, Choice("m", "v3", "shadow")))
    return served, shadow


def _done(rid: str):
    from ops.core.messages import ReplyEvent

    return ReplyEvent(type="done", request_id=rid, finish_reason="stop", usage={"completion_tokens": 3},
                      timing={"ttft_s": 0.1, "e2e_s": 0.3, "tpot_s": 0.1})


@pytest.mark.parametrize("shadow_first", [False, True])
@pytest.mark.parametrize("same", [True, False])
def test_a_shadow_is_compared_with_the_served_answer_whichever_ends_first(redis_server, shadow_first, same):
    from ops.rollout import outcomes

    async def scenario():
        async with admission_on(redis_server.url) as (admission, background):
            served, shadow = _shadow_routes(admission, ["Paris", "."], ["Paris", "." if same else "!"])
            ends = [(shadow, _done(shadow.request_id)), (served, _done(served.request_id))]
            for route, reply in ends if shadow_first else ends[::-1]:
                admission.settle(route, reply)
            await background.drain(timeout_s=5)
            return admission.shadows.pairs

    client = redis_server.client
    client.delete(redis_keys.outcomes("m", "v3"), redis_keys.outcomes("m", "v1"))
    pairs = run(scenario())
    recorded = outcomes.window(client, "m", "v3", 0)
    assert [(o.shadow, o.same_text) for o in recorded] == [(True, same)]
    assert [o.shadow for o in outcomes.window(client, "m", "v1", 0)] == [False]  # the served answer's own
    assert pairs == {}  # both ended: nothing kept
