"""Brigade on a Redis that speaks only TLS, as managed Redis services do: a real redis-server with
certificates from a CA made here (tests/services.py `issue_certificates`), asking every client for a
certificate too. Every process gets a bare rediss:// URL and the CA, certificate and key as
BRIGADE_REDIS_TLS_* (ops/core/settings.py folds them into the URL): a real gateway, two real workers
on the tiny model (their Celery broker on the same TLS Redis), a reaper, Flower and `brigade status`.
Then over Sentinel with TLS (rediss+sentinel://): a primary, a replica and three sentinels that
speak only TLS, among themselves too, and a gateway and a worker on them. Nothing is mocked."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.clients import ask, collect, start_long_request
from tests.services import RedisHAServer, RedisServer, Stack, free_port, issue_certificates, wait_until

# Real processes on TLS Redis, a worker killed: `make test-long`.
pytestmark = pytest.mark.long

HEARTBEAT_TTL_S = 3.0
ROOT = Path(__file__).resolve().parent.parent


def tls_env(client_tls) -> dict[str, str]:
    """The settings a deployment on this Redis sets: the CA that signed its certificate, and the
    certificate Brigade presents (redis-server asks clients for one by default)."""
    return {"BRIGADE_REDIS_TLS_CA_FILE": str(client_tls.ca_file),
            "BRIGADE_REDIS_TLS_CERT_FILE": str(client_tls.cert_file),
            "BRIGADE_REDIS_TLS_KEY_FILE": str(client_tls.key_file)}


def tiny_env(tiny_model_dir: Path) -> dict[str, str]:
    return {"BRIGADE_MODEL": str(tiny_model_dir), "BRIGADE_CACHE_ENABLED": "0", "BRIGADE_TORCH_THREADS": "1",
            "BRIGADE_MAX_WAIT_MS": "20", "BRIGADE_DRAIN_SECONDS": "1",
            "BRIGADE_HEARTBEAT_TTL_S": str(HEARTBEAT_TTL_S)}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """(the servers' files, a client's files), one CA."""
    return issue_certificates(tmp_path_factory.mktemp("certificates"))


@pytest.fixture(scope="module")
def sentinel_stack(certificates, tiny_model_dir, tmp_path_factory):
    """A gateway and a worker on a primary, a replica and three sentinels, all on TLS alone. Started
    first, in a thread, and not waited for here: the sentinels take seconds to find each other and
    the processes seconds to start, while the TLS stack starts beside them."""
    server_tls, client_tls = certificates
    folder, logs = tmp_path_factory.mktemp("sentinel-tls"), tmp_path_factory.mktemp("sentinel-tls-logs")

    def start() -> Stack:
        ha = RedisHAServer(folder, replicas=1, tls=server_tls)
        bare = ha.url.split("?", 1)[0]  # the TLS files come from the settings, as for a deployment
        assert bare.startswith("rediss+sentinel://")
        s = Stack(ha, logs, own_redis=True, BRIGADE_REDIS_URL=bare, **tiny_env(tiny_model_dir), **tls_env(client_tls))
        s.start_gateway()
        s.start_worker("w1@sentinel-tls")
        return s

    with ThreadPoolExecutor(1) as pool:
        starting = pool.submit(start)
        yield starting
        starting.result().stop()


@pytest.fixture(scope="module")
def flower_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def stack(certificates, sentinel_stack, flower_port, tiny_model_dir, tmp_path_factory):
    server_tls, client_tls = certificates
    tls_redis = RedisServer(tmp_path_factory.mktemp("redis-tls"), tls=server_tls)
    assert tls_redis.url.startswith("rediss://") and "?" not in tls_redis.url  # the settings carry the files
    with Stack(tls_redis, tmp_path_factory.mktemp("tls-logs"), own_redis=True, **tiny_env(tiny_model_dir),
               **tls_env(client_tls)) as s:
        s.start_gateway()
        s.start("reaper")
        s.start_worker("w1@tls")
        s.start_worker("w2@tls")
        s.start("flower", BRIGADE_FLOWER_PORT=str(flower_port), BRIGADE_FLOWER_USER="ops",
                BRIGADE_FLOWER_PASSWORD="tls-test")
        s.wait_ready()
        yield s


def brigade(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.commands.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


# ---- refused: a client that does not speak TLS, or without what it needs ---------------------------

def test_a_plain_tcp_client_is_refused_by_the_tls_port(stack):
    plain = redis.Redis(host="127.0.0.1", port=stack.redis.port, socket_timeout=2, socket_connect_timeout=2,
                        retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.ConnectionError):
        plain.ping()


def test_a_client_without_the_ca_is_told_to_set_the_ca_file(stack):
    without_ca = {**stack.env, "BRIGADE_REDIS_TLS_CA_FILE": ""}  # the system's trust store, which lacks the test's CA
    done = brigade("status", env=without_ca)
    assert done.returncode == 1, done
    assert "CERTIFICATE_VERIFY_FAILED" in done.stderr and "set BRIGADE_REDIS_TLS_CA_FILE" in done.stderr, done.stderr
    assert "Redis over TLS" in done.stderr and "Traceback" not in done.stderr, done.stderr
    # `up` finds no Redis answering, and must not start one without TLS on the TLS Redis's port.
    up = brigade("up", env={**without_ca, "BRIGADE_GATEWAY_PORT": str(free_port())})
    assert up.returncode == 1 and "does not answer over TLS" in up.stderr, up
    assert "BRIGADE_REDIS_TLS_" in up.stderr, up.stderr


def test_a_ca_file_that_is_not_there_is_said_naming_its_setting(stack, tmp_path):
    missing = tmp_path / "no-such-ca.pem"
    for part in ("status", "gateway", "worker"):
        done = brigade(part, env={**stack.env, "BRIGADE_REDIS_TLS_CA_FILE": str(missing),
                                  "BRIGADE_GATEWAY_PORT": str(free_port())})
        assert done.returncode == 2, (part, done)
        assert f"{missing} is not a file" in done.stderr and "set BRIGADE_REDIS_TLS_CA_FILE" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr, done.stderr


# ---- every part of Brigade over TLS ------------------------------------------------------------------

def test_brigade_status_reads_the_fleet_over_tls(stack):
    done = brigade("status", "--json", env=stack.env)
    assert done.returncode == 0, done.stderr
    assert "w1@tls" in done.stdout and "w2@tls" in done.stdout, done.stdout


def test_a_websocket_request_is_answered_over_tls(stack):
    answer = asyncio.run(ask(stack.url, "tls-1", prompt="Say hello.", max_tokens=8, cache="off"))
    assert answer.end is not None and answer.end["type"] == "done", (answer.end, stack.tails())
    assert answer.indexes == list(range(8)) and answer.end["usage"]["completion_tokens"] == 8


def test_flower_lists_both_workers_over_tls(stack, flower_port):
    base = f"http://127.0.0.1:{flower_port}"
    auth = {"Authorization": "Basic " + base64.b64encode(b"ops:tls-test").decode()}

    def get(path: str):
        try:
            with urllib.request.urlopen(urllib.request.Request(base + path, headers=auth), timeout=10) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def workers() -> dict | None:
        body = get("/api/workers?refresh=1")
        return body if body and {"w1@tls", "w2@tls"} <= set(body) else None

    wait_until(workers, 60, interval=1, what="Flower to list both workers (its broker on TLS)")
    # The broker's queues, which Flower reads with a Redis client of its own (TLS from broker_use_ssl).
    queues = get("/api/queues/length")
    assert queues and queues["active_queues"], queues


def test_the_reaper_continues_a_killed_workers_request_over_tls(stack):
    """The reaper reads the claims and sends the request on through the TLS broker; the other worker
    continues it from the replay log: the client gets every index once."""
    async def run():
        from websockets.asyncio.client import connect

        async with connect(stack.url) as ws:
            answers = await start_long_request(ws, "tls-kill", "Write a long story about a dragon.", tokens_first=4)
            rid = answers["tls-kill"].request_id
            holder = wait_until(lambda: stack.claimant(rid), 10, what="the request claimed")
            stack.kill(stack.workers[holder["worker"]])
            await collect(ws, answers, [], {"tls-kill"}, timeout=60)
            return answers["tls-kill"]

    answer = asyncio.run(run())
    assert answer.end is not None and answer.end["type"] == "done", (answer.end, stack.tails())
    assert answer.indexes == list(range(len(answer.tokens))) == list(range(answer.end["usage"]["completion_tokens"]))
    reaper_log = next(p for p in stack.started if p.log_path.name == "reaper.log").log_path.read_text()
    assert "event=reaped" in reaper_log and "outcome=requeue" in reaper_log, reaper_log[-2000:]


# ---- Sentinel with TLS -------------------------------------------------------------------------------

def test_a_gateway_and_a_worker_answer_over_sentinel_with_tls(sentinel_stack):
    s = sentinel_stack.result()
    s.wait_ready()
    answer = asyncio.run(ask(s.url, "sentinel-tls-1", prompt="Say hello.", max_tokens=8, cache="off"))
    assert answer.end is not None and answer.end["type"] == "done", (answer.end, s.tails())
    assert answer.indexes == list(range(8))
    done = brigade("status", env=s.env)
    assert done.returncode == 0 and "w1@sentinel-tls" in done.stdout, done
