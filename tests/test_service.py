# Over 400 lines: one module-scoped real stack (the real model) that the end-to-end answers are compared on.
"""Brigade end to end: real redis-server, a real `brigade worker` (Celery) process, the real
gateway process, real WebSocket clients, the real default model."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from engine import EngineRequest, SamplingParams
from ops.core import redis_keys
from tests.clients import Answer, _converse, _question, absorb, ask, collect, collect_one, start_long_request
from tests.services import (
    Stack,
    _process_tree,
    free_port,
    http_get,
    http_status,
    queued_params,
    service_env,
    wait_until,
    worker_statuses,
)

QUESTIONS = [
    "What is the capital of France?", "Write a haiku about the sea.", "List three colors.", "What is 2 + 2?",
    "Name a fruit and say why it is healthy.", "Why is the sky blue?", "Give me one tip for learning to code.",
    "Translate 'thank you' into Spanish.",
]
LONG_QUESTION = "Write a very long and detailed essay about the history of the Roman Empire."


class ServiceStack(Stack):
    readiness_log: list[tuple[int | None, bool]]  # while starting: (/readyz status, did a worker status key exist)


@pytest.fixture(scope="module")
def stack(redis_server, model_dir, tmp_path_factory):
    # float32: the streamed answers are compared with the in-process engine's greedy ones, token
    # for token; in half precision a different batch composition may round differently.
    with ServiceStack(redis_server, tmp_path_factory.mktemp("logs"), BRIGADE_WORKER_CONCURRENCY="16",
                      BRIGADE_MAX_WAIT_MS="30", BRIGADE_RESUME_GRACE_S="1", BRIGADE_DTYPE="float32") as s:
        s.start_gateway()
        s.wait_healthy()
        s.readiness_log = [(http_status(s.port, "/readyz"), bool(worker_statuses(redis_server.client)))]
        worker = s.start_worker("w1@test")

        def ready() -> bool:
            status = http_status(s.port, "/readyz")
            s.readiness_log.append((status, bool(worker_statuses(redis_server.client))))
            if worker.proc.poll() is not None:
                raise AssertionError("worker exited:\n" + worker.tail())
            return status == 200

        wait_until(ready, 300, interval=0.2, what="/readyz to turn ready")
        yield s


def running_requests(stack: ServiceStack) -> list[str]:
    statuses = worker_statuses(stack.redis.client)
    assert statuses, "no worker status key"
    return [rid for s in statuses for rid in s["requests"]]


def test_readyz_turns_ready_only_after_a_worker_is_up(stack):
    first_status, worker_existed = stack.readiness_log[0]
    assert first_status == 503 and not worker_existed
    assert all(has_worker for status, has_worker in stack.readiness_log if status == 200)
    assert stack.readiness_log[-1][0] == 200
    status, body = http_get(stack.port, "/readyz")
    assert status == 200 and body["ready"] and body["workers"] == 1
    assert http_get(stack.port, "/healthz")[0] == 200


def test_eight_clients_at_once_stream_the_engines_greedy_answers(stack, engine):
    params = SamplingParams(max_tokens=32)
    asks = [EngineRequest(f"q{i}", params, messages=[{"role": "user", "content": q}]) for i, q in enumerate(QUESTIONS)]
    expected = engine.generate(asks)

    async def main():
        return await asyncio.gather(*[
            ask(stack.url, f"q{i}", messages=[{"role": "user", "content": q}], max_tokens=32)
            for i, q in enumerate(QUESTIONS)
        ])

    answers = asyncio.run(main())
    for a in answers:
        want = expected[a.id]
        assert a.end["type"] == "done", a.end
        assert a.indexes == list(range(len(a.tokens))), f"{a.id}: indexes {a.indexes}"
        assert a.text == want.text, f"{a.id}: streamed {a.text!r} != engine {want.text!r}"
        assert a.end["finish_reason"] == want.finish_reason
        assert a.end["usage"]["completion_tokens"] == len(want.token_ids)
        timing = a.end["timing"]
        assert timing["worker"] == "w1@test" and timing["ttft_s"] > 0 and timing["e2e_s"] >= timing["ttft_s"]


def test_cancel_stops_a_running_request_and_frees_its_slot(stack):
    async def main():
        async with connect(stack.url) as ws:
            answers = await start_long_request(ws, "long", LONG_QUESTION)
            rid = answers["long"].request_id
            # The status key is a snapshot refreshed every second.
            await asyncio.to_thread(wait_until, lambda: rid in running_requests(stack), 5, 0.1, "the request in the worker's status")
            await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            while answers["long"].end is None:
                await collect_one(ws, answers)
            return answers["long"], rid

    answer, rid = asyncio.run(main())
    assert answer.end == {"type": "done", "id": "long", "finish_reason": "cancelled", "usage": {}, "timing": {}}
    wait_until(lambda: rid not in running_requests(stack), 10, what="the worker to drop the cancelled request")
    length = stack.redis.client.xlen(redis_keys.stream(rid))
    time.sleep(1.0)  # what is measured: no token within a second (there is no event to wait for)
    assert stack.redis.client.xlen(redis_keys.stream(rid)) == length, "tokens kept coming after cancel"
    assert length < 200


def test_disconnect_stops_the_clients_requests(stack):
    async def main():
        async with connect(stack.url) as ws:
            return (await start_long_request(ws, "gone", LONG_QUESTION))["gone"].request_id

    rid = asyncio.run(main())  # leaving the `async with` closes the connection mid-stream
    wait_until(lambda: rid not in running_requests(stack), 10, what="the worker to drop the abandoned request")
    wait_until(lambda: all(s["running"] == 0 for s in worker_statuses(stack.redis.client)), 10,
               what="the worker's running count to drop to 0")

    # Stopped, not finished: a request of up to 1000 tokens that had simply run to its end would
    # end with `stop` or `length` in its replay log.
    def end() -> dict | None:
        events = [json.loads(f["event"]) for _, f in stack.redis.client.xrange(redis_keys.stream(rid))]
        return events[-1] if events and events[-1]["type"] == "done" else None

    done = wait_until(end, 10, what="the request's end in its replay log")
    assert done["finish_reason"] == "cancelled", done
    assert stack.redis.client.exists(redis_keys.cancelled(rid)), "the gateway did not cancel the abandoned request"


def test_resume_after_the_grace_time_ends_with_cancelled_instead_of_waiting(stack):
    """The stack's resume grace is 1 s: a client that comes back later learns its request ended."""
    async def main():
        async with connect(stack.url) as ws:
            rid = (await start_long_request(ws, "late", LONG_QUESTION))["late"].request_id
        await asyncio.to_thread(wait_until, lambda: stack.redis.client.exists(redis_keys.cancelled(rid)), 10, 0.1,
                                "the abandoned request to be cancelled")
        async with connect(stack.url) as ws:
            await ws.send(json.dumps({"type": "resume", "id": rid, "after_index": 2}))
            return json.loads(await asyncio.wait_for(ws.recv(), 10))

    event = asyncio.run(main())
    assert event["type"] == "done" and event["finish_reason"] == "cancelled", event


def test_a_client_that_resumes_before_its_old_connection_closes_keeps_its_request(stack):
    """The old connection's grace timer (1 s here) must not cancel a request already resumed elsewhere."""
    async def main():
        async with connect(stack.url) as old:
            answers = await start_long_request(old, "kept", LONG_QUESTION)
            rid = answers["kept"].request_id
            new = await connect(stack.url)
            await new.send(json.dumps({"type": "resume", "id": rid, "after_index": answers["kept"].indexes[-1]}))
            first = json.loads(await asyncio.wait_for(new.recv(), 30))
        # The old connection is closed now, after the resume; outlive its grace time.
        rest = {rid: Answer(rid)}
        absorb(rest, first)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and rest[rid].end is None:
            absorb(rest, json.loads(await asyncio.wait_for(new.recv(), 30)))
        await new.send(json.dumps({"type": "cancel", "id": rid}))
        while rest[rid].end is None:
            absorb(rest, json.loads(await asyncio.wait_for(new.recv(), 30)))
        await new.close()
        return answers["kept"], rest[rid]

    first, rest = asyncio.run(main())
    # Still streaming after the grace time; it ended only because this client cancelled it.
    assert rest.end["finish_reason"] == "cancelled" and rest.end["usage"] == {}, rest.end
    indexes = first.indexes + [i for i in rest.indexes if i > first.indexes[-1]]
    assert rest.indexes[0] == first.indexes[-1] + 1 and indexes == list(range(len(indexes)))
    assert len(rest.tokens) > 10


BAD_FRAMES = {
    # First: a frame is handled only after the one before it, so `good` is surely still running.
    # Later, behind the 10 MB frame, a short answer could have ended (then `good` may be reused).
    "duplicate id": (json.dumps({"type": "generate", "id": "good", "prompt": "again"}), "duplicate_id"),
    "not json": ("{oops", "invalid_json"),
    "unknown type": (json.dumps({"type": "dance", "id": "b1"}), "unknown_type"),
    "missing prompt": (json.dumps({"type": "generate", "id": "b2"}), "missing_field"),
    "negative temperature": (json.dumps({"type": "generate", "id": "b3", "prompt": "x", "temperature": -1}), "invalid_field"),
    "huge max_tokens": (json.dumps({"type": "generate", "id": "b4", "prompt": "x", "max_tokens": 10**9}), "invalid_field"),
    "10 MB prompt": (json.dumps({"type": "generate", "id": "b5", "prompt": "x" * 10_000_000}), "prompt_too_long"),
    "binary frame": (b"\x00\xff binary", "binary_frame"),
    "cancel of unknown id": (json.dumps({"type": "cancel", "id": "nobody"}), "unknown_id"),
    # Passes the gateway's character limit but not the model's context: refused by the worker.
    "over the context": (json.dumps({"type": "generate", "id": "b6", "prompt": "word " * 12_000, "max_tokens": 64}),
                         "context_overflow"),
}


def test_every_bad_input_gets_its_error_while_a_good_request_completes(stack):
    async def main():
        async with connect(stack.url, max_size=None) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "good", "max_tokens": 24,
                                      "messages": [{"role": "user", "content": "What is the capital of France?"}]}))
            for frame, _ in BAD_FRAMES.values():
                await ws.send(frame)
            answers = {"good": Answer("good"), "b6": Answer("b6")}
            errors: list[dict] = []
            await collect(ws, answers, errors, {"good", "b6"})
            # Errors for ids the test did not pre-register land in `answers` too; gather them all.
            errors += [a.end for i, a in answers.items() if i != "good" and a.end and a.end["type"] == "error"]
            return answers["good"], errors

    good, errors = asyncio.run(main())
    assert good.end["type"] == "done" and good.tokens and "Paris" in good.text, good.end
    codes = sorted(e["code"] for e in errors)
    assert codes == sorted(code for _, code in BAD_FRAMES.values()), errors
    assert all(e["message"] for e in errors)


def test_request_cancelled_while_queued_is_never_run(stack):
    """The worker checks the cancel flag when it takes a request from the queue."""
    import redis as redis_lib

    from ops.core.messages import QueuedRequest
    from ops.core.queue import GENERATE_TASK, make_app

    client = redis_lib.Redis.from_url(stack.redis.url)
    channel = redis_keys.reply_channel("test-direct")
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)

    def queued(rid: str) -> dict:
        return QueuedRequest(request_id=rid, client_id=rid, reply_channel=channel, enqueued_at=time.time(),
                             model="smollm2-135m-instruct", prompt="Hello", params=queued_params(max_tokens=4),
                             ).model_dump(mode="json")

    app = make_app(stack.redis.url)
    client.set(redis_keys.cancelled("skipped-1"), "1", ex=60)
    app.send_task(GENERATE_TASK, args=[queued("skipped-1")], queue=redis_keys.interactive_queue("smollm2-135m-instruct"))
    after = queued("after-1")
    client.set(redis_keys.request("after-1"), json.dumps(after), ex=60)  # as the gateway does: the request's record
    app.send_task(GENERATE_TASK, args=[after], queue=redis_keys.interactive_queue("smollm2-135m-instruct"))
    seen: list[dict] = []

    def after_done() -> bool:
        message = pubsub.get_message(timeout=0.5)
        if message and message["type"] == "message":
            seen.append(json.loads(message["data"]))
        return any(e["request_id"] == "after-1" and e["type"] == "done" for e in seen)

    wait_until(after_done, 60, interval=0, what="the request queued behind the cancelled one to finish")
    # No model work: no token, only the end a resumed client would need to stop waiting.
    skipped = [e for e in seen if e["request_id"] == "skipped-1"]
    assert [(e["type"], e.get("finish_reason")) for e in skipped] == [("done", "cancelled")], skipped
    logged = [json.loads(f[b"event"])["type"] for _, f in client.xrange(redis_keys.stream("skipped-1"))]
    assert logged == ["done"]


def served(stack: ServiceStack) -> int:
    """The worker's requests-served count, once its status beat has caught up."""
    # A worker counts a request as served right after it publishes its end, so a beat written
    # after now counts every request whose client has seen its end.
    asked = time.time()

    def beat_after() -> dict | None:
        return next((s for s in worker_statuses(stack.redis.client) if s["updated_at"] > asked), None)

    return wait_until(beat_after, 20, what="a worker beat after the last answer")["requests_served"]


CACHED_Q = [{"role": "user", "content": "Name three planets of the solar system."}]


def test_repeated_question_is_answered_from_the_cache_without_reaching_a_worker(stack):
    entries = stack.redis.client.zcard(redis_keys.CACHE_LRU)
    first = asyncio.run(ask(stack.url, "c1", messages=CACHED_Q, max_tokens=24))
    assert first.end["type"] == "done" and "cached" not in first.end
    # The gateway stores the answer right after `done`.
    wait_until(lambda: stack.redis.client.zcard(redis_keys.CACHE_LRU) > entries, 10, what="the answer stored in the cache")
    before = served(stack)

    async def again():
        async with connect(stack.url) as ws:
            await ws.send(json.dumps({"type": "generate", "id": "c2", "messages": CACHED_Q, "max_tokens": 24}))
            events = []
            while not events or events[-1]["type"] not in ("done", "error"):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
            return events

    events = asyncio.run(again())
    tokens = [e for e in events if e["type"] == "token"]
    assert events[-1]["type"] == "done" and events[-1]["cached"] == "exact" and events[-1]["similarity"] == 1.0
    assert all(e["cached"] == "exact" for e in tokens)
    assert [e["index"] for e in tokens] == list(range(len(tokens)))
    assert "".join(e["text"] for e in tokens) == first.text
    assert events[-1]["finish_reason"] == first.end["finish_reason"]
    assert served(stack) == before, "a cache hit reached the worker"


def test_answer_stored_through_one_gateway_is_hit_through_another(stack):
    first = asyncio.run(ask(stack.url, "g1", messages=[{"role": "user", "content": "What colour is the sky?"}],
                            max_tokens=16))
    assert first.end["type"] == "done"
    with stack.another_gateway("gateway-b") as other:
        hit = asyncio.run(ask(other.ws_url, "g2", messages=[{"role": "user", "content": "What colour is the sky?"}],
                              max_tokens=16))
    assert hit.end.get("cached") == "exact" and hit.text == first.text


def test_cache_outage_degrades_to_a_miss_and_the_worker_answers(stack):
    dead_cache = f"redis://127.0.0.1:{free_port()}/0"
    with stack.another_gateway("gateway-c", BRIGADE_CACHE_REDIS_URL=dead_cache) as broken:
        answer = asyncio.run(ask(broken.ws_url, "d1", messages=CACHED_Q, max_tokens=24))
        assert answer.end["type"] == "done" and "cached" not in answer.end and answer.tokens
        assert "cache_lookup_failed" in broken.log_path.read_text()


def test_cache_warm_stats_and_clear_commands(stack, tmp_path):
    import subprocess
    import sys

    env = service_env(stack.redis.url, stack.port)
    questions = tmp_path / "warm.jsonl"
    questions.write_text(json.dumps({"question": "Name a primary colour.", "max_tokens": 12}) + "\n"
                         + json.dumps({"messages": [{"role": "user", "content": "Name a season."}], "max_tokens": 12}) + "\n")

    def brigade(*args: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "ops.commands.cli", *args], env=env, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout[out.stdout.index("{"):])

    entries = stack.redis.client.zcard(redis_keys.CACHE_LRU)
    assert brigade("cache", "warm", str(questions)) == {"questions": 2, "answered": 2, "already_cached": 0, "errors": 0}
    # The gateway stores each answer right after its `done`.
    wait_until(lambda: stack.redis.client.zcard(redis_keys.CACHE_LRU) >= entries + 2, 10, what="both answers stored")
    assert brigade("cache", "warm", str(questions))["already_cached"] == 2
    stats = brigade("cache", "stats")
    assert stats["entries"] >= 2 and stats["hits"]["exact"] >= 2 and 0 < stats["hit_rate"] <= 1
    assert stats["memory_bytes_estimate"] > 0
    assert brigade("cache", "clear")["removed"] == stats["entries"]
    assert brigade("cache", "stats")["entries"] == 0


LOOKALIKES = [
    # stored question, a look-alike that means something else, a rewording that means the same
    ("How do I convert Celsius to Fahrenheit?", "How do I convert Fahrenheit to Celsius?",
     "how do I convert celsius to fahrenheit"),
    ("What is the capital of Austria?", "What is the capital of Australia?", "What's the capital of Austria?"),
    ("Is it safe to drink beer with alcohol during pregnancy?",
     "Is it safe to drink beer without alcohol during pregnancy?",
     "Is it safe to drink beer with alcohol during pregnancy"),
]


def test_lookalike_questions_are_not_served_each_others_answers(stack):
    """The verifier's decisions end to end over a WebSocket: a rewording is a semantic hit, a
    look-alike that means something else is answered by the worker."""
    for n, (stored, lookalike, rewording) in enumerate(LOOKALIKES):
        entries = stack.redis.client.hlen(redis_keys.CACHE_ENTRY_NAMESPACE)
        [first] = asyncio.run(_converse(stack.url, [(f"s{n}", _question(stored))]))
        assert first[-1]["type"] == "done" and first[-1]["finish_reason"] == "stop", first[-1]
        wait_until(lambda: stack.redis.client.hlen(redis_keys.CACHE_ENTRY_NAMESPACE) > entries, 10,
                   what="the answer stored in the cache")
        stored_text = "".join(e["text"] for e in first if e["type"] == "token")
        other, same = asyncio.run(_converse(stack.url, [(f"l{n}", _question(lookalike)),
                                                         (f"r{n}", _question(rewording))]))
        assert other[-1]["type"] == "done" and "cached" not in other[-1], (lookalike, other[-1])
        assert any(e["type"] == "queued" for e in other), "the look-alike should have gone to a worker"
        assert same[-1].get("cached") == "semantic", (rewording, same[-1])
        assert "".join(e["text"] for e in same if e["type"] == "token") == stored_text


def test_feedback_evicts_a_wrong_cached_answer_and_keeps_the_pair_as_a_hard_negative(stack):
    stored, asked = "What is the tallest mountain in Africa?", "what is the tallest mountain in africa"
    entries = stack.redis.client.hlen(redis_keys.CACHE_ENTRY_NAMESPACE)
    [first] = asyncio.run(_converse(stack.url, [("f0", _question(stored))]))
    assert first[-1]["finish_reason"] == "stop", first[-1]
    wait_until(lambda: stack.redis.client.hlen(redis_keys.CACHE_ENTRY_NAMESPACE) > entries, 10, what="the answer stored")
    # Earlier tests' audits may raise the learned serving cosine: this request names the one it is served at.
    asked_here = {**_question(asked), "cache_threshold": 0.95}
    hit, feedback, unknown = asyncio.run(_converse(stack.url, [
        ("f1", asked_here), ("f1", {"type": "feedback", "verdict": "wrong"}),
        ("nope", {"type": "feedback", "verdict": "wrong"})]))
    assert hit[-1].get("cached") == "semantic"
    entry = hit[-1]["entry"]
    assert feedback[-1] == {"type": "feedback_recorded", "id": "f1", "entry": entry, "evicted": True}
    assert unknown[-1]["type"] == "error" and unknown[-1]["code"] == "unknown_request"
    assert not stack.redis.client.exists(redis_keys.cache_entry(entry))
    negatives = [json.loads(x) for x in stack.redis.client.lrange(redis_keys.CACHE_HARD_NEGATIVES, 0, -1)]
    assert {"asked": asked, "stored": stored, "entry": entry}.items() <= negatives[0].items()
    # The verdict is evidence against serving at that cosine (cache/evidence.py).
    evidence = [json.loads(x) for x in stack.redis.client.lrange(redis_keys.CACHE_EVIDENCE, 0, -1)]
    reported = [o for o in evidence if o["source"] == "feedback" and o["entry"] == entry]
    assert len(reported) == 1 and reported[0]["agreed"] is False
    assert reported[0]["cosine"] == pytest.approx(hit[-1]["similarity"], abs=1e-3)
    [again] = asyncio.run(_converse(stack.url, [("f2", asked_here)]))
    assert "cached" not in again[-1] and any(e["type"] == "queued" for e in again)


def test_flower_lists_the_live_worker_behind_basic_auth_and_shows_no_prompt_or_password(stack):
    import base64
    import urllib.error
    import urllib.request

    port = free_port()
    flower = stack.start("flower", BRIGADE_FLOWER_PORT=str(port), BRIGADE_FLOWER_USER="ops",
                         BRIGADE_FLOWER_PASSWORD="s3cret")
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret").decode()}

    def get(path: str) -> str | None:
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=auth), timeout=10) as resp:
                return resp.read().decode()
        except (urllib.error.URLError, OSError):
            return None

    def workers() -> dict | None:
        try:
            body = json.loads(get("/api/workers?refresh=1") or "null")
        except ValueError:
            return None
        return body if body and "w1@test" in body else None

    try:
        assert wait_until(workers, 60, interval=1, what="Flower to list the worker")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "/api/workers", timeout=10)
        assert refused.value.code == 401
        # The broker's queues: Flower reads them with a client chosen by the broker URL's scheme,
        # so this answers only while Flower runs on kombu's own Redis transport (workers/flower.py).
        queues = json.loads(get("/api/queues/length") or "null")
        assert queues and queues["active_queues"], queues
        # The version's shared queue and the worker's own (prefix routing, docs/scaling.md).
        names = sorted(q["name"] for q in queues["active_queues"])
        assert len(names) == 2 and names[0].endswith(".interactive"), queues
        assert names[1].startswith(names[0] + ".w1@test#"), queues
        assert all(q["messages"] >= 0 for q in queues["active_queues"]), queues
        # `ps` shows every user the command lines: Flower's, and its children's, hold no password.
        for pid in _process_tree(flower.proc.pid):
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            assert "s3cret" not in cmdline, f"pid {pid}: {cmdline}"
        # Flower's task list names the request, not its words.
        secret_words = "Tell me about the quiet violet heron of Lake Zumbro."
        [events] = asyncio.run(_converse(stack.url, [("fl", {"type": "generate", "max_tokens": 4, "cache": "off",
                                                             "messages": [{"role": "user", "content": secret_words}]})]))
        request_id = next(e["request_id"] for e in events if e["type"] == "queued")
        tasks = wait_until(lambda: (body := get("/api/tasks")) and request_id in body and body, 30, interval=0.5,
                           what="Flower to list the request's task")
        assert "heron" not in tasks and "Zumbro" not in tasks, tasks
        assert f"'message_chars': {len(secret_words)}" in json.loads(tasks)[request_id]["args"], tasks
    finally:
        flower.stop()
