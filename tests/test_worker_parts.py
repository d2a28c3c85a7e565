"""The worker's parts, each alone (workers/engine_host.py wires them together): the heartbeat's
vouching, the cancel listener, the held requests and the drain flag, the reply publisher's
settling. A real redis-server where a part speaks to Redis; no engine: the heartbeat reads only
the engine loop's clock (`EngineProgress`), which these tests turn by hand."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from engine import SequenceUpdate
from ops.core import redis_clients, redis_keys, roster
from ops.core.messages import QueuedRequest, ReplyEvent
from ops.core.settings import Settings
from tests.services import RedisServer, queued_params, wait_until
from workers.cancels import CancelListener
from workers.claims import ClaimStore
from workers.heartbeat import Heartbeat
from workers.held import HeldRequests
from workers.inflight import InFlight
from workers.publisher import ReplyPublisher, TokenPublisher

INSTANCE = "parts@test#1"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def settings(redis_server) -> Settings:
    redis_server.client.flushall()
    return Settings(redis_url=redis_server.url, heartbeat_interval_s=0.2, heartbeat_ttl_s=1.0, engine_stall_s=1.5)


@pytest.fixture
def stop():
    event = threading.Event()
    yield event
    event.set()


def queued(rid: str) -> QueuedRequest:
    return QueuedRequest(request_id=rid, client_id="c", reply_channel=redis_keys.reply_channel("test-gateway"),
                         enqueued_at=time.time(), model="parts-model", prompt="hello",
                         params=queued_params(max_tokens=8, temperature=0.0))


def held_entry(rid: str, epoch: int = 1) -> InFlight:
    return InFlight(queued(rid), added_at=time.time(), epoch=epoch)


@dataclass
class LoopClock:
    """What the heartbeat reads of an engine (EngineProgress), turned by the test."""

    loop_at: float = field(default_factory=time.monotonic)
    tokens_generated: int = 0

    def turn(self) -> None:
        self.loop_at = time.monotonic()
        self.tokens_generated += 1


def heartbeat(settings: Settings, clock: LoopClock, stop: threading.Event, engine_alive=lambda: True) -> Heartbeat:
    return Heartbeat(redis_clients.client(settings.redis_url), settings, INSTANCE, clock, engine_alive,
                     lambda rate: {"instance": INSTANCE, "worker": "parts@test", "tokens_per_s": rate}, [], stop)


def test_the_heartbeat_stops_vouching_while_the_engine_loop_stands_still_and_beats_again_once_it_moves(
        settings, redis_server, stop):
    client, clock = redis_server.client, LoopClock()
    beat = heartbeat(settings, clock, stop)
    beat.thread.start()

    def turning_and_beating() -> bool:
        clock.turn()
        return bool(client.exists(redis_keys.worker(INSTANCE)))

    wait_until(turning_and_beating, 5, what="the first beat")
    assert [w["instance"] for w in roster.live_workers(client)] == [INSTANCE]
    # The loop stands still past engine_stall_s: the thread lives on, but the key lapses.
    wait_until(lambda: not client.exists(redis_keys.worker(INSTANCE)), settings.engine_stall_s + settings.heartbeat_ttl_s + 3,
               what="the stalled worker's key to lapse")
    assert beat.thread.is_alive() and not beat.vouching
    assert not beat.renew_if_lapsed() and not client.exists(redis_keys.worker(INSTANCE))  # not even before a claim
    wait_until(turning_and_beating, 5, what="the beat to resume")
    assert beat.vouching


def test_a_claim_after_a_lapse_beats_first_unless_the_engine_thread_is_dead(settings, redis_server, stop):
    client = redis_server.client
    beat = heartbeat(settings, LoopClock(), stop)  # its thread not started: its next turn is far off
    assert beat.renew_if_lapsed()
    assert client.exists(redis_keys.worker(INSTANCE)) and client.zscore(redis_keys.WORKERS, INSTANCE) is not None
    assert not beat.renew_if_lapsed()  # the key is there: nothing to renew
    client.flushall()

    dead = heartbeat(settings, LoopClock(), stop, engine_alive=lambda: False)
    assert not dead.renew_if_lapsed()
    dead.run()  # returns at once: no engine, no beat
    assert not client.exists(redis_keys.worker(INSTANCE))


def test_the_cancel_listener_stops_only_the_requests_this_worker_holds_and_hears_again_after_redis_restarts(
        settings, redis_server, stop):
    client = redis_server.client
    held = HeldRequests()
    held.register(held_entry("mine"))
    cancelled: list[str] = []
    listener = CancelListener(redis_clients.client(settings.redis_url), held, cancelled.append, stop)
    listener.thread.start()

    def cancel_both() -> bool:  # one channel keeps its order: "theirs" is heard before "mine"
        client.publish(redis_keys.CANCEL_CHANNEL, "theirs")
        client.publish(redis_keys.CANCEL_CHANNEL, "mine")
        return "mine" in cancelled

    wait_until(cancel_both, 5, what="the listener to hear a cancel")
    assert "theirs" not in cancelled
    redis_server.stop()
    redis_server.start()
    cancelled.clear()
    wait_until(cancel_both, 15, what="the listener to subscribe again")
    assert "theirs" not in cancelled and listener.thread.is_alive()
    stop.set()
    listener.thread.join(5)
    assert not listener.thread.is_alive()


def test_a_drain_closes_registration_so_no_request_slips_past_it():
    held = HeldRequests()
    first = held_entry("first")
    assert held.register(first) and not held.draining
    held.close()
    assert not held.register(held_entry("late"))  # its task thread hands it back instead
    assert held.draining and held.ids() == ["first"]
    assert held.take_all() == [first] and len(held) == 0


def test_a_step_pairs_updates_with_held_requests_and_lets_go_of_those_that_ended():
    held = HeldRequests()
    going, ending = held_entry("going"), held_entry("ending")
    held.register(going), held.register(ending)
    step = [SequenceUpdate("going", 0, 5, "a"), SequenceUpdate("ending", 3, 6, "b", finish_reason="stop"),
            SequenceUpdate("cancelled-earlier", 1, 7, "c")]
    assert [(entry, u.request_id) for entry, u in held.match(step)] == [(going, "going"), (ending, "ending")]
    assert held.ids() == ["going"]


def test_a_task_is_released_only_once_its_last_event_is_in_redis(tmp_path):
    server = RedisServer(tmp_path, persistent=True)  # the claim survives the restart, as in production
    try:
        client = redis_clients.client(server.url)
        claims = ClaimStore.from_settings(client, Settings(redis_url=server.url))
        request = queued("r")
        client.set(redis_keys.request("r"), request.model_dump_json())
        epoch = claims.claim("r", INSTANCE).epoch
        fenced: list[str] = []
        replies = ReplyPublisher(TokenPublisher(claims), on_fenced=fenced.append)
        entry = InFlight(request, added_at=time.time(), epoch=epoch)
        done = ReplyEvent(type="done", request_id="r", epoch=epoch, finish_reason="stop")
        server.stop()
        replies.publish([(request.reply_channel, done)], [entry])
        assert not entry.finished.is_set() and replies.requests_served == 0
        server.start()
        replies.retry()  # the heartbeat's turn
        assert entry.finished.is_set() and replies.requests_served == 1 and fenced == []
        assert [json.loads(f["event"])["type"] for _, f in client.xrange(redis_keys.stream("r"))] == ["done"]
    finally:
        server.stop()


def test_a_request_queued_without_its_sampling_fields_is_refused_never_run_with_guessed_values():
    from engine import RequestRejected
    from ops.core.messages import GenerateParams
    from workers.inflight import sampling_params

    filled = queued("a")
    assert sampling_params(filled).max_tokens == filled.params.max_tokens  # a gateway's request runs as given
    bare = filled.model_copy(update={"params": GenerateParams(max_tokens=4)})
    with pytest.raises(RequestRejected) as refused:
        sampling_params(bare)
    assert refused.value.code == "invalid_request" and "temperature" in refused.value.message


# Run in a fresh process: OpenMP's pools belong to the process. Prints the process's threads once
# their count has held still for half a second (a finished thread's pool leaves a moment after it).
_THREADS_AFTER_LOADING = """
import os, sys, time
from ops.core.settings import Settings
from workers import engine_loading
load = engine_loading.load_engine if sys.argv[2] == "load_engine" else engine_loading._load
engine = load(Settings(model=sys.argv[1], torch_threads=2))
counts, deadline = [], time.monotonic() + 20
while time.monotonic() < deadline and (len(counts) < 6 or len(set(counts[-6:])) > 1):
    counts.append(len(os.listdir("/proc/self/task")))
    time.sleep(0.1)
print(counts[-1])
"""


def test_loading_the_engine_leaves_no_openmp_pool_behind(tiny_model_dir):
    # libgomp keeps a pool for every thread that ran a parallel region, and once the pools' threads
    # outnumber the cores it barely spins before sleeping, so every region of a step pays a futex
    # wake (a worker's one-stream decode ran at two thirds of the engine's own speed). Loaded on the
    # main thread, the load's pool stays; loaded by load_engine, it ends with the loader's thread.
    runs = {how: subprocess.Popen([sys.executable, "-c", _THREADS_AFTER_LOADING, str(tiny_model_dir), how], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for how in ("main", "load_engine")}  # side by side: each is mostly imports
    threads = {}
    for how, run in runs.items():
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err[-3000:]
        threads[how] = int(out.split()[-1])
    on_the_main_thread, by_load_engine = threads["main"], threads["load_engine"]
    assert on_the_main_thread - by_load_engine == 1, (on_the_main_thread, by_load_engine)  # 2 threads: one worker


_SPIN_BEFORE_TORCH = """
import os, sys
from ops.commands.cli import build_parser
from ops.core.settings import Settings, openmp_spin
args = build_parser().parse_args(["worker"])
loaded_first = "torch" in sys.modules  # main's spin would come too late for libgomp
openmp_spin(Settings())
print(loaded_first, os.environ.get("GOMP_SPINCOUNT"))
"""


@pytest.mark.parametrize("env, expected", [({}, "1000"), ({"GOMP_SPINCOUNT": "50000"}, "50000"),
                                           ({"BRIGADE_OPENMP_SPIN_COUNT": "0"}, "None")])
def test_brigade_commands_set_the_openmp_spin_before_anything_loads_torch(env, expected):
    # libgomp reads GOMP_SPINCOUNT once, when torch loads it: `brigade`'s main sets it after building
    # its parser (every command's), before any command runs, so nothing on the way may import torch.
    # A value already in the environment wins; 0 leaves libgomp's own.
    clean = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "BRIGADE_OPENMP_SPIN_COUNT")}
    done = subprocess.run([sys.executable, "-c", _SPIN_BEFORE_TORCH], cwd=ROOT, env={**clean, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", expected]
