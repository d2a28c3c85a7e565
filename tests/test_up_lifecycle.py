"""Nothing outlives `brigade up`, on real processes: `brigade up` itself (its Redis, gateway, worker,
reaper and, in two cases, Flower), stopped in every way a user or a machine stops it; Flower asked to
stop while Redis is gone; a worker that cannot load its model."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ops.core import redis_keys
from ops.core.settings import Settings
from tests.brigade_up import BrigadeUp, still_running
from tests.services import RedisServer, Stack, free_port, service_env, wait_until, worker_statuses

ROOT = Path(__file__).resolve().parent.parent

# How `up` is stopped, each on its own `brigade up`. "sigint-through-a-dead-pipe" is
# `brigade up 2>&1 | tee LOG` and Ctrl-C: the terminal sends SIGINT to the whole pipeline, tee
# dies of it, and `up` must stop its children although every print of its own now fails. SIGHUP
# and SIGPIPE reach the handler SIGTERM reaches (`stop_when_signalled`): each is sent to the
# supervisor that handler drives, in a process of its own, below, not to a whole `up`.
ORDERLY = ("sigint-through-a-dead-pipe", "sigterm")
CASES = (*ORDERLY, "sigkill")
WITH_FLOWER = ("sigint-through-a-dead-pipe", "sigkill")  # Flower stopped in order, and killed with `up`
EPHEMERAL = ("sigterm",)  # one `up --ephemeral`: its Redis keeps nothing


def flower_listens(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthcheck", auth=("brigade", "brigade"), timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


class Pipeline:
    """`brigade up 2>&1 | tee LOG` in a process group of its own, as a shell runs a pipeline."""

    def __init__(self, env: dict, log_path: Path, *args: str):
        self.tee = subprocess.Popen(["tee", str(log_path)], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                    process_group=0)
        self.up = BrigadeUp(env, log_path, *args, stdout=self.tee.stdin, process_group=self.tee.pid)
        self.tee.stdin.close()  # `up` and its children hold the pipe's writing end, tee its reading end

    def kill(self) -> None:
        self.up.kill()
        if self.tee.poll() is None:
            self.tee.kill()
        self.tee.wait(5)


@pytest.fixture(scope="module")
def ups(tmp_path_factory, tiny_model_dir):
    """One `brigade up` per case, all started at once (their start is most of these tests' time),
    each on its own ports, Redis and data folder, with the tiny model."""
    started = {}
    try:
        for case in CASES:
            home = tmp_path_factory.mktemp(case)
            env = service_env(f"redis://127.0.0.1:{free_port()}/0", free_port(),
                              BRIGADE_HOME=str(home / "home"), BRIGADE_DATA_DIR=str(home / "data"),
                              BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_DTYPE="float32", BRIGADE_TORCH_THREADS="1",
                              BRIGADE_CACHE_ENABLED="false", BRIGADE_FLOWER_PORT=str(free_port()))
            args = [*(["--flower"] if case in WITH_FLOWER else []), *(["--ephemeral"] if case in EPHEMERAL else [])]
            if case == "sigint-through-a-dead-pipe":
                started[case] = Pipeline(env, home / "up.log", *args)
            else:
                started[case] = BrigadeUp(env, home / "up.log", *args)
        yield {case: s.up if isinstance(s, Pipeline) else s for case, s in started.items()}
    finally:
        for s in started.values():
            s.kill()


def stop(up: BrigadeUp, case: str) -> None:
    if case == "sigint-through-a-dead-pipe":
        os.killpg(os.getpgid(up.proc.pid), signal.SIGINT)  # the pipeline: tee leads it, `up` is in it
    else:
        up.proc.send_signal({"sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}[case])


@pytest.mark.long
def test_a_second_up_on_the_same_data_folder_refuses_to_start_a_redis_there(ups):
    """Two Redis servers writing one append-only folder would corrupt it."""
    import redis

    first = ups["sigint-through-a-dead-pipe"]  # its data folder is kept (not --ephemeral), and it runs first
    first.wait_ready()
    redis_url, port = f"redis://127.0.0.1:{free_port()}/0", free_port()
    env = dict(first.env, BRIGADE_REDIS_URL=redis_url, BRIGADE_GATEWAY_PORT=str(port))
    second = subprocess.run([sys.executable, "-m", "ops.commands.cli", "up"], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert second.returncode == 1, second.stdout + second.stderr
    assert "is in use by another `brigade up`'s Redis" in second.stderr, second.stderr
    with pytest.raises(redis.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()


@pytest.mark.long
@pytest.mark.parametrize("case", CASES)
def test_every_process_up_started_ends_when_up_is_stopped(ups, case):
    up = ups[case]
    parts = up.wait_ready()
    expected = {"gateway", "worker", "reaper", "redis", *(["flower"] if case in WITH_FLOWER else [])}
    if "flower" in expected:
        flower_port = int(up.env["BRIGADE_FLOWER_PORT"])
        wait_until(lambda: flower_listens(flower_port), 120, what="Flower to listen")
        parts = up.parts()
    assert set(parts) == expected, f"{case}: `up` started {sorted(parts)}"
    aof = list((Path(up.env["BRIGADE_DATA_DIR"]) / "redis").glob("**/*.aof*"))
    if case in EPHEMERAL:
        assert aof == [], f"--ephemeral kept an append-only file: {aof}"
    else:
        assert aof, "no append-only file in BRIGADE_DATA_DIR/redis"
    started = time.monotonic()
    stop(up, case)
    deadline = started + 60
    while still_running(list(parts.values())) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {name: p.pid for name, p in parts.items() if still_running([p])}
    assert not left, f"{case}: still running 60 s after `up` was stopped: {left}\n{up.tail()}"
    print(f"{case}: every part ended {time.monotonic() - started:.1f} s after the signal")
    if case in ORDERLY:
        # Stopped in order by `up` itself, which then returned normally: not killed by its own
        # broken output, and not cleaned up only by the kernel.
        assert up.proc.wait(10) == 0, f"{case}: `up` exited {up.proc.returncode}\n{up.tail()}"
        if case != "sigint-through-a-dead-pipe":  # there, the log ended with tee
            output = up.log_path.read_text()
            assert "stopping gateway, then worker, then reaper" in output, output[-2000:]
            assert "Traceback" not in output, output[-3000:]
    else:
        assert up.proc.wait(10) == -signal.SIGKILL


def test_flower_asked_to_stop_while_redis_is_gone_stops(tmp_path):
    """Flower's threads retried a broadcast to a gone Redis for ever, and its exit waited for them:
    now it exits, cleanly, well inside the deadline (a hang fails the wait)."""
    server = RedisServer(tmp_path)
    port = free_port()
    flower = Stack(server, tmp_path, BRIGADE_FLOWER_PORT=str(port)).start("flower")
    try:
        wait_until(lambda: flower_listens(port), 120, what="Flower to listen")
        server.stop()
        # A refresh of the workers' page makes Flower inspect them, from its thread pool, with
        # Redis gone: the threads that stopped its exit.
        httpx.get(f"http://127.0.0.1:{port}/workers?refresh=1", auth=("brigade", "brigade"), timeout=10)
        flower.proc.terminate()
        try:
            code = flower.proc.wait(60)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"Flower still runs 60 s after SIGTERM with Redis gone\n{flower.tail()}") from None
    finally:
        flower.stop(timeout=5)
        if server.proc.poll() is None:
            server.stop()
    assert code == 0, flower.tail()


@pytest.mark.parametrize("case", ["device-this-machine-lacks", "model-folder-without-weights"])
def test_a_worker_that_cannot_load_its_model_exits_with_one_line_before_consuming(redis_server, tmp_path, case):
    from ops.core.queue import GENERATE_TASK, make_app

    settings = Settings()
    queue = redis_keys.interactive_queue(settings.model_name)
    for name in redis_keys.queue_lists(settings.model_name):
        redis_server.client.delete(name)
    make_app(redis_server.url).send_task(GENERATE_TASK, args=[{"request_id": "waiting"}], queue=queue,
                                         task_id="waiting-for-a-worker")
    if case == "device-this-machine-lacks":
        # No device 99 anywhere; without a GPU this is `cuda` on a machine that has none.
        extra = {"BRIGADE_DEVICE": "cuda:99"}
        reason = "BRIGADE_DEVICE=cuda:99"
    else:
        folder = tmp_path / "model"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
        extra = {"BRIGADE_MODEL": str(folder)}
        reason = f"the model at {folder} has no weights"
    def waiting() -> list[str]:
        return [json.loads(m)["headers"]["id"] for name in redis_keys.queue_lists(settings.model_name)
                for m in redis_server.client.lrange(name, 0, -1)]

    worker = subprocess.Popen([sys.executable, "-m", "ops.commands.cli", "worker", "--name", f"{case}@test"], cwd=ROOT,
                              env=service_env(redis_server.url, free_port(), **extra), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        # Until it exits, or shows that it did not: it took the message, or it beats as a live worker.
        wait_until(lambda: worker.poll() is not None or not waiting() or worker_statuses(redis_server.client),
                   180, what="the worker to exit")
        took_it, live = waiting() != ["waiting-for-a-worker"], worker_statuses(redis_server.client)
    finally:
        if worker.poll() is None:
            worker.kill()
        out, err = worker.communicate(timeout=10)
    lines = err.strip().splitlines()
    assert worker.returncode != 0 and not took_it and not live, (worker.returncode, took_it, live, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"brigade worker: {reason}"), err
    assert out == ""


# ---- the one Supervisor behind `up`, `bench soak` and `bench scale` ----------------------------

# A part that writes its name to a file when asked to stop, then exits: the file says in which
# order the supervisor stopped them.
RECORDS_ITS_STOP = """
import signal, sys, time
def stop(*_):
    with open(sys.argv[1], "a") as f:
        f.write(sys.argv[2] + "\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
while True:
    time.sleep(0.05)
"""


def test_the_supervisor_stops_its_parts_in_order_and_restarts_a_killed_one(tmp_path):
    from ops.stack.supervision import PartExited, Supervisor

    stopped = tmp_path / "stopped"
    supervisor = Supervisor()
    try:
        # Started out of order on purpose; a part's role is its name's first word unless given.
        for name, role in (("redis", None), ("worker-1", None), ("w2@test", "worker"), ("reaper", None),
                           ("gateway", None)):
            supervisor.start(name, [sys.executable, "-c", RECORDS_ITS_STOP, str(stopped), name],
                             log=tmp_path / f"{name}.log", role=role)
        supervisor.wait_for(lambda: all((tmp_path / f"{n}.log").read_text() for n in supervisor.parts), 60)
        first = supervisor.process("worker-1").pid
        supervisor.kill_and_restart("worker-1")
        assert supervisor.process("worker-1").pid != first
        supervisor.wait_for(lambda: (tmp_path / "worker-1.log").read_text().count("started") == 2, 60)
        assert supervisor.exited() is None
        with pytest.raises(ValueError):
            supervisor.start("database", [sys.executable, "-c", "pass"])  # a role the order does not know
    finally:
        supervisor.stop()
    lines = stopped.read_text().split()
    assert lines[0] == "gateway" and sorted(lines[1:3]) == ["w2@test", "worker-1"] and lines[3:] == ["reaper", "redis"]
    # A part that ends while the supervisor waits for something else is said, with its exit code.
    ending = Supervisor()
    ending.start("reaper", [sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(PartExited) as exited:
        ending.wait_for(lambda: False, 60)
    assert (exited.value.name, exited.value.code) == ("reaper", 3)
    ending.stop()


# `up`'s loop in small: the handler it installs, one part, the watch, the stop in order.
STOPS_WHEN_SIGNALLED = """
import sys
from pathlib import Path
from ops.stack.supervision import Supervisor, stop_when_signalled
stopping = stop_when_signalled()
folder = Path(sys.argv[1])
supervisor = Supervisor()
supervisor.start("worker", [sys.executable, "-c", sys.argv[2], str(folder / "stopped"), "worker"],
                 log=folder / "worker.log")
supervisor.wait_for(lambda: "started" in (folder / "worker.log").read_text(), 60)
print("watching", flush=True)
ended = supervisor.watch(stopping)
supervisor.stop()
sys.exit(0 if ended is None else 1)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE],
                         ids=lambda s: s.name)
def test_each_stop_signal_has_the_supervisor_stop_its_part_and_exit_0(tmp_path, signum):
    watcher = subprocess.Popen([sys.executable, "-c", STOPS_WHEN_SIGNALLED, str(tmp_path), RECORDS_ITS_STOP],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert watcher.stdout.readline().strip() == "watching", watcher.stdout.read()
        watcher.send_signal(signum)
        assert watcher.wait(30) == 0, watcher.stdout.read()
    finally:
        if watcher.poll() is None:
            watcher.kill()
    assert (tmp_path / "stopped").read_text().split() == ["worker"]  # asked to stop, not killed with it


@pytest.mark.long
def test_up_with_redis_ha_serves_through_a_killed_primary_and_stops_every_part(tmp_path, tiny_model_dir):
    """`brigade up --redis-ha`: a primary, two replicas and three sentinels instead of one Redis,
    every part on their redis+sentinel:// URL; SIGKILL the primary and the service answers again
    from the promoted replica, with no part restarted; SIGTERM stops all of it."""
    import re

    import psutil

    from ops.core.redis_address import parse_sentinel
    from ops.core.redis_clients import client

    env = service_env("redis://127.0.0.1:1/0", free_port(),  # the URL --redis-ha replaces: nothing listens there
                      BRIGADE_HOME=str(tmp_path / "home"), BRIGADE_DATA_DIR=str(tmp_path / "data"),
                      BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_DTYPE="float32", BRIGADE_TORCH_THREADS="1",
                      BRIGADE_CACHE_ENABLED="false")
    up = BrigadeUp(env, tmp_path / "up.log", "--redis-ha")
    try:
        parts = up.wait_ready()
        url = re.search(r"BRIGADE_REDIS_URL=(redis\+sentinel://\S+)", up.log_path.read_text()).group(1)
        redis_nodes = [c for c in psutil.Process(up.proc.pid).children() if c.name() == "redis-server"]
        assert len(redis_nodes) == 6, [c.cmdline() for c in redis_nodes]  # 3 data nodes, 3 sentinels
        address = parse_sentinel(url)
        sentinel = client(f"redis://{address.sentinels[0][0]}:{address.sentinels[0][1]}")
        _, port = sentinel.sentinel_get_master_addr_by_name(address.master)
        primary = next(c for c in redis_nodes if f":{port}" in " ".join(c.cmdline()) or str(port) in c.cmdline())
        primary.kill()

        def answers() -> bool:
            try:
                r = httpx.post(f"http://127.0.0.1:{up.port}/v1/completions", timeout=10,
                               json={"prompt": "Hello", "max_tokens": 2})
            except httpx.HTTPError:
                return False
            return r.status_code == 200
        wait_until(answers, 60, interval=0.5, what="an answer after the primary's kill")
        assert sentinel.sentinel_get_master_addr_by_name(address.master)[1] != port
        for name in ("gateway", "worker", "reaper"):
            assert parts[name].is_running(), f"{name} ended:\n{up.tail()}"
        # the killed node is started again once a replica was promoted, and rejoins as a replica
        wait_until(lambda: "Redis HA: redis-primary started again" in up.log_path.read_text(), 60,
                   what="the killed primary to be started again")
        everything = psutil.Process(up.proc.pid).children()
        up.proc.send_signal(signal.SIGTERM)
        assert up.proc.wait(60) == 0, up.tail()
        wait_until(lambda: not still_running(everything), 30, what="every part, the sentinels too, to end")
    finally:
        up.kill()
