# Over 400 lines: the Redis floor's every script and client, each on the real redis-server it shares.
"""The Redis floor (ops/core): one client factory, every Lua script in one folder with its keys in
KEYS, and every growing key's bound asked of ops/core/redis_keys.py. On a real redis-server."""
from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from redis.exceptions import RedisError

from ops.core import redis_clients, redis_keys, scripts
from ops.core.messages import QueuedRequest
from ops.core.settings import Settings
from tests.services import queued_params
from workers.claims import ClaimStore

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "ops" / "core" / "lua"


@pytest.fixture
def client(redis_server):
    redis_server.client.flushall()
    return redis_clients.client(redis_server.url)


def test_every_lua_file_is_a_registered_script_and_every_script_has_its_file():
    assert sorted(p.stem for p in LUA.glob("*.lua")) == sorted(scripts.NAMES)
    for name in scripts.NAMES:
        assert "redis.call" in scripts.source(name)
    with pytest.raises(KeyError):
        scripts.source("no_such_script")


def test_no_script_builds_a_key_from_its_arguments():
    # A key built inside a script (`ARGV[1] .. id`) is invisible to redis_keys.py and refused by Redis
    # Cluster: every call's key must come in KEYS. PUBLISH names a channel, not a key.
    built = re.compile(r"redis\.call\('(?!PUBLISH)\w+',\s*[^,)]*\.\.")
    for path in LUA.glob("*.lua"):
        text = path.read_text()
        assert not built.search(text), f"{path.name} builds a key: {built.search(text).group(0)}"
        assert "WORKER_PREFIX" not in text and "prefix" not in text.lower(), path.name


def test_nothing_outside_ops_core_builds_a_redis_client():
    construction = re.compile(r"Redis\.from_url\(|redis\.Redis\(|aioredis\.Redis\(|ConnectionPool\.from_url\("
                              r"|\.register_script\(")
    found = []
    for pkg in ("engine", "cache", "gateway", "workers", "ops"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path.parts[-3:-1] == ("ops", "core") and path.name in ("redis_clients.py", "scripts.py"):
                continue
            if construction.search(path.read_text()):
                found.append(str(path.relative_to(ROOT)))
    assert not found, found


def test_the_factorys_clients_answer_in_text(redis_server, client):
    client.set("k", "v")
    client.xadd("s", {"event": "{}"})
    assert client.get("k") == "v"
    [(entry_id, fields)] = client.xrange("s")
    assert isinstance(entry_id, str) and fields == {"event": "{}"}

    async def read():
        aio = redis_clients.async_client(redis_server.url)
        try:
            return await aio.get("k"), await aio.hgetall("nothing")
        finally:
            await aio.aclose()

    assert asyncio.run(read()) == ("v", {})


def test_an_outage_retry_waits_until_redis_answers_and_stops_when_told():
    failures = []

    def flaky():
        if len(failures) < 3:
            raise RedisError("down")
        return "up"

    retry = redis_clients.outage_retry(cap_s=0.02, first_s=0.01)
    assert retry.call_with_retry(flaky, lambda exc: failures.append(exc)) == "up"
    assert len(failures) == 3
    assert [redis_clients.outage_pause_s(n) for n in (1, 2, 3, 4, 5)] == [0.25, 0.5, 1.0, 2.0, 2.0]

    def down():
        raise RedisError("down")

    def stop(exc):
        raise exc  # what a stopping caller does in its fail callback

    with pytest.raises(RedisError):
        retry.call_with_retry(down, stop)


def queued(rid: str) -> QueuedRequest:
    return QueuedRequest(request_id=rid, client_id="c", reply_channel=redis_keys.reply_channel("g"), enqueued_at=time.time(),
                         model="m", prompt="hi", params=queued_params(max_tokens=4))


def test_a_claim_checks_the_heartbeat_of_the_owner_it_finds_and_writes_the_keys_bounds(client):
    settings = Settings(stream_ttl_s=1234, max_attempts=2)
    claims = ClaimStore.from_settings(client, settings)
    client.set(redis_keys.request("r1"), queued("r1").model_dump_json())
    first_claim = claims.claim("r1", "a#1")
    assert first_claim.outcome == "claimed"
    assert client.ttl(redis_keys.claim("r1")) == redis_keys.claim_ttl_s(settings) == 1234
    again = claims.claim("r1", "a#1")  # its own claim, asked again (a retry whose first reply was lost)
    assert (again.outcome, again.epoch, again.attempts) == ("mine", first_claim.epoch, 1)
    claims.engage({"r1": first_claim.epoch})  # its engine computes it: a death now costs an attempt
    client.set(redis_keys.worker("a#1"), "{}", px=redis_keys.worker_ttl_ms(settings))
    assert claims.claim("r1", "b#1").outcome == "busy"  # its owner's heartbeat lives
    first = int(client.hget(redis_keys.claim("r1"), "epoch"))
    client.delete(redis_keys.worker("a#1"))
    took = claims.claim("r1", "b#1")
    assert took.outcome == "claimed" and took.epoch > first  # a dead owner's claim is taken over
    assert took.attempts == 2


def test_an_epoch_lost_in_a_failover_is_never_issued_again(client):
    """Replication is asynchronous: a promoted replica may lack the last raise of a claim's epoch.
    The next raise must still be above every epoch issued before, or a gateway would take the new
    owner's tokens for a stale worker's (or the stale worker's for the new owner's)."""
    settings = Settings()
    claims = ClaimStore.from_settings(client, settings)
    client.set(redis_keys.request("lost"), queued("lost").model_dump_json())
    before = claims.claim("lost", "a#1")
    # the failover: the new primary has the claim as it was before that raise
    client.hset(redis_keys.claim("lost"), mapping={"state": "queued", "owner": "", "attempts": 0, "epoch": 0})
    time.sleep(0.002)  # the clock moves on, as it does during any failover (seconds)
    after = claims.claim("lost", "b#1")
    assert after.outcome == "claimed" and after.epoch > before.epoch, (before, after)
    # and a counter far ahead of the clock still only grows
    client.hset(redis_keys.claim("lost"), mapping={"state": "queued", "owner": "", "epoch": 10**15})
    assert claims.claim("lost", "c#1").epoch == 10**15 + 1
    assert claims.release("lost", "c#1", 10**15 + 1)
    assert int(client.hget(redis_keys.claim("lost"), "epoch")) == 10**15 + 2


def test_the_claim_script_refuses_to_judge_an_owner_it_was_not_given(client):
    # The caller reads the owner, then passes that owner's heartbeat key; if the owner changed in
    # between, the script says so (ClaimStore reads again) instead of judging a key it lacks.
    client.set(redis_keys.request("r2"), queued("r2").model_dump_json())
    client.hset(redis_keys.claim("r2"), mapping={"state": "running", "owner": "now#1", "attempts": 1})
    claim = scripts.register(client, "claim")
    outcome = claim(keys=[redis_keys.claim("r2"), redis_keys.CLAIMS, redis_keys.request("r2"), redis_keys.UNCLAIMED, redis_keys.TAKEN,
                          redis_keys.worker("before#1")],
                    args=["r2", "me#1", 3, 60, "before#1"])
    assert outcome == ["moved", 0, 1]
    assert client.hget(redis_keys.claim("r2"), "owner") == "now#1"  # nothing changed


def test_a_burial_by_the_reaper_or_at_a_claim_writes_the_same_dead_letter_and_notice(client):
    settings = Settings(max_attempts=1, dlq_max=5)
    claims = ClaimStore.from_settings(client, settings)
    for rid, bury in (("by-reap", lambda: claims.reap("by-reap", "dead#1")),
                      ("by-claim", lambda: claims.claim("by-claim", "w#2").outcome)):
        client.set(redis_keys.request(rid), queued(rid).model_dump_json())
        client.hset(redis_keys.claim(rid), mapping={"state": "running", "owner": "dead#1", "attempts": 1, "engaged": 1})
        assert bury() in ("buried", "dead")
        assert client.hget(redis_keys.claim(rid), "state") == "dead"
        assert client.ttl(redis_keys.stream(rid)) == redis_keys.stream_ttl_s(settings)
    letters = {e["request_id"]: e for e in claims.dead_letters()}
    assert {r: (e["attempts"], e["reason"]) for r, e in letters.items()} == {
        "by-reap": (1, "crashed 1 workers"), "by-claim": (1, "crashed 1 workers")}
    notices = [client.xrange(redis_keys.stream(rid))[-1][1]["event"] for rid in ("by-reap", "by-claim")]
    assert notices[0].replace("by-reap", "X") == notices[1].replace("by-claim", "X")
    assert '"code":"worker_failed"' in notices[0]


def test_two_that_decide_a_burial_bury_the_request_once(client):
    # The reaper fences the dead owner and decides to bury; a worker's claim, before that burial
    # runs, decides the same: one dead letter, one notice, whoever's bury.lua comes first.
    settings = Settings(max_attempts=1)
    claims = ClaimStore.from_settings(client, settings)
    client.set(redis_keys.request("r3"), queued("r3").model_dump_json())
    client.hset(redis_keys.claim("r3"), mapping={"state": "running", "owner": "dead#1", "attempts": 1, "epoch": 4,
                                          "engaged": 1})
    reap = scripts.register(client, "reap")
    outcome, epoch = reap(keys=[redis_keys.claim("r3"), redis_keys.CLAIMS, redis_keys.UNCLAIMED], args=["r3", "dead#1", 1, time.time()])
    assert outcome == "bury" and int(epoch) > 4 and epoch == client.hget(redis_keys.claim("r3"), "epoch")
    assert claims.claim("r3", "w#2").outcome == "dead"  # the claim decides and buries first
    assert not claims._buried("r3", epoch)  # the reaper's burial finds it done
    assert [e["request_id"] for e in claims.dead_letters()] == ["r3"]
    notices = [f["event"] for _, f in client.xrange(redis_keys.stream("r3"))]
    assert len(notices) == 1 and '"code":"worker_failed"' in notices[0]
    # A request handed a new life (`brigade dlq retry`) before a stale burial runs is not buried.
    assert claims.retry_dead_letter("r3") is not None
    assert not claims._buried("r3", epoch)
    assert client.hget(redis_keys.claim("r3"), "state") == "queued"


def _log(client, rid: str) -> list[tuple[str, int | None]]:
    import json

    return [(e["type"], e.get("index")) for e in
            (json.loads(f["event"]) for _, f in client.xrange(redis_keys.stream(rid)))]


def test_a_replay_log_tail_lost_in_a_failover_is_sent_again_from_the_workers_memory(client):
    """A promoted replica may lack the last tokens the old primary logged. The worker's next
    publish finds the log shorter than its events assume and sends the missing ones again, in
    order, before the new ones: the log ends whole, each token once."""
    from ops.core.messages import ReplyEvent
    from workers.publisher import TokenPublisher

    claims = ClaimStore.from_settings(client, Settings())
    client.set(redis_keys.request("tail"), queued("tail").model_dump_json())
    epoch = claims.claim("tail", "w#1").epoch
    publisher = TokenPublisher(claims)
    channel = redis_keys.reply_channel("g")
    token = lambda i: (channel, ReplyEvent(type="token", request_id="tail", epoch=epoch, index=i, token_id=100 + i,
                                           text=f"t{i}"))
    assert publisher.publish([token(i) for i in range(5)]) == set()
    assert _log(client, "tail") == [("token", i) for i in range(5)]
    # the failover: the new primary has the log and the claim as they were after token 2
    for entry_id, _ in client.xrange(redis_keys.stream("tail"))[3:]:
        client.xdel(redis_keys.stream("tail"), entry_id)
    client.hset(redis_keys.claim("tail"), "logged", 3)

    done = (channel, ReplyEvent(type="done", request_id="tail", epoch=epoch, finish_reason="length"))
    assert publisher.publish([token(5), token(6), done]) == set()
    assert _log(client, "tail") == [("token", i) for i in range(7)] + [("done", None)]
    assert publisher.refilled == 5  # tokens 3 to 6 and the done event
    assert client.hget(redis_keys.claim("tail"), "state") == "done"
    assert claims.generated("tail") == [100 + i for i in range(7)]
    assert publisher.publish([]) == set() and not publisher._sent  # nothing kept once it ended


def test_a_token_already_logged_is_not_logged_twice(client):
    from ops.core.messages import ReplyEvent

    claims = ClaimStore.from_settings(client, Settings())
    client.set(redis_keys.request("dup"), queued("dup").model_dump_json())
    epoch = claims.claim("dup", "w#1").epoch
    channel = redis_keys.reply_channel("g")
    events = [(channel, ReplyEvent(type="token", request_id="dup", epoch=epoch, index=i, token_id=i, text="x"), i)
              for i in range(3)]
    assert claims.publish(events).gaps == {}
    again = claims.publish(events[1:])  # a resend racing the live events
    assert again.gaps == {} and again.fenced == set()
    assert _log(client, "dup") == [("token", 0), ("token", 1), ("token", 2)]
    assert claims.publish([(channel, events[0][1].model_copy(update={"index": 5}), 5)]).gaps == {"dup": 3}
    # A claim with no count yet (written before it existed: a rolling upgrade) starts counting at
    # the first publish instead of calling every earlier token missing.
    client.hdel(redis_keys.claim("dup"), "logged")
    assert claims.publish([(channel, events[0][1].model_copy(update={"index": 5}), 5)]).gaps == {}
    assert client.hget(redis_keys.claim("dup"), "logged") == "6"


def test_the_sentinel_url_names_the_sentinels_the_master_the_db_and_both_passwords():
    from ops.core.redis_address import (
        RedisAddressError,
        describe,
        is_sentinel,
        kombu_broker,
        parse_sentinel,
        sentinel_url,
    )

    address = parse_sentinel("redis+sentinel://:p%40ss@h1:26380,h2,[::1]:26381/mymaster/2?sentinel_password=s3")
    assert address.sentinels == (("h1", 26380), ("h2", 26379), ("::1", 26381))
    assert (address.master, address.db, address.password, address.sentinel_password) == ("mymaster", 2, "p@ss", "s3")
    assert address.node_kwargs() == {"db": 2, "password": "p@ss"} and address.sentinel_kwargs() == {"password": "s3"}
    broker, options = kombu_broker(address)  # kombu's form of the same primary: one URL, every sentinel
    assert broker == "sentinel://:p%40ss@h1:26380/2"
    assert options == {"master_name": "mymaster", "sentinel_kwargs": {"password": "s3"},
                       "sentinel_hosts": [["h1", 26380], ["h2", 26379], ["::1", 26381]]}
    assert "p@ss" not in describe("redis+sentinel://:p%40ss@h1/m") and "p@ss" not in repr(address)
    tls = parse_sentinel("rediss+sentinel://h1/m?ssl_cert_reqs=none")
    assert tls.tls and tls.node_kwargs() == {"db": 0, "ssl": True, "ssl_cert_reqs": "none"}
    assert is_sentinel("redis+sentinel://h/m") and not is_sentinel("redis://h:6379/0")
    assert parse_sentinel(sentinel_url([("127.0.0.1", 5), ("::1", 6)], "b", 0, "x y")).sentinels == (
        ("127.0.0.1", 5), ("::1", 6))
    for bad, says in [("redis+sentinel://h1:26379", "no master name"), ("redis+sentinel://h1:x/m", "is not HOST:PORT"),
                      ("redis+sentinel://h1/m/a", "/MASTER or /MASTER/DB"), ("redis+sentinel://h1/m?db=1", "unknown option"),
                      ("redis+sentinel:///m", "no sentinel named")]:
        with pytest.raises(RedisAddressError, match=says):
            parse_sentinel(bad)


def test_the_tls_settings_travel_in_the_redis_urls_and_every_client_reads_them_alike(tmp_path):
    """BRIGADE_REDIS_TLS_* fill in the ssl_* options that a TLS URL leaves out (its own win), in a URL
    given later too (--redis-url); redis-py and Celery's broker (kombu, Flower) read the same options.
    tests/test_redis_tls.py runs Brigade on a real TLS Redis."""
    import ssl

    from pydantic import ValidationError

    from ops.core.queue import make_app
    from ops.core.redis_address import RedisTLSError, parse_sentinel, tls_options

    ca = tmp_path / "ca.pem"
    ca.write_text("a CA")
    settings = Settings(redis_url="rediss://h:6380/0?ssl_check_hostname=false", redis_tls_ca_file=str(ca),
                        redis_tls_verify="none", cache_redis_url="redis://c:6379/0")
    assert settings.redis_url == f"rediss://h:6380/0?ssl_check_hostname=false&ssl_ca_certs={ca}&ssl_cert_reqs=none"
    assert settings.cache_redis_url == "redis://c:6379/0"  # no TLS there: nothing added
    assert tls_options(settings.redis_url) == {"ssl_check_hostname": False, "ssl_ca_certs": str(ca),
                                               "ssl_cert_reqs": "none"}
    assert settings.model_copy(update={"redis_url": "rediss://h2/1"}).redis_url == \
        f"rediss://h2/1?ssl_ca_certs={ca}&ssl_cert_reqs=none"
    # kombu gets them once, as broker_use_ssl, and a URL without them (it would read them its own way).
    app = make_app(settings=settings, set_as_current=False)
    assert app.conf.broker_url == "rediss://h:6380/0"
    assert app.conf.broker_use_ssl == {"ssl_check_hostname": False, "ssl_ca_certs": str(ca),
                                       "ssl_cert_reqs": ssl.CERT_NONE}
    assert app.connection_for_write().ssl == app.conf.broker_use_ssl
    # Sentinel with TLS: the sentinels and the data nodes alike, the certificate checked by default.
    sentinel = Settings(redis_url="rediss+sentinel://s1,s2:26380/m/0", redis_tls_ca_file=str(ca))
    address = parse_sentinel(sentinel.redis_url)
    assert address.node_kwargs() == {"db": 0, "ssl": True, "ssl_ca_certs": str(ca)}
    assert address.sentinel_kwargs() == {"ssl": True, "ssl_ca_certs": str(ca)}
    sentinel_app = make_app(settings=sentinel, set_as_current=False)
    assert sentinel_app.conf.broker_use_ssl == {"ssl_ca_certs": str(ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    assert sentinel_app.conf.broker_transport_options["sentinel_kwargs"] == address.sentinel_kwargs()
    # A URL without TLS is left alone; a file that is not there is said naming its setting, before any command.
    assert Settings(redis_url="redis://h:6379/0", redis_tls_ca_file=str(ca)).redis_url == "redis://h:6379/0"
    missing = Settings(redis_url="rediss://h/0", redis_tls_cert_file=str(tmp_path / "gone.crt")).redis_url
    for build in (redis_clients.client, redis_clients.async_client, make_app):
        with pytest.raises(RedisTLSError, match="gone.crt is not a file .*set BRIGADE_REDIS_TLS_CERT_FILE"):
            build(missing)
    with pytest.raises(RedisTLSError, match="should be one of none, optional, required"):
        tls_options("rediss://h/0?ssl_cert_reqs=sometimes")
    with pytest.raises(ValidationError):
        Settings(redis_tls_verify="optional")  # the same as required for a client: one word for it


def test_a_failed_tls_handshake_says_which_setting_to_change():
    # The ssl module's words inside redis-py's errors, as a real TLS Redis gives them (tests/test_redis_tls.py).
    for error, setting in [
        ("Error 1 connecting to h:6380. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed "
         "certificate in certificate chain (_ssl.c:1006).", "set BRIGADE_REDIS_TLS_CA_FILE"),
        ("Error 1 connecting to 10.0.0.5:6380. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP "
         "address mismatch, certificate is not valid for '10.0.0.5'. (_ssl.c:1006).", "BRIGADE_REDIS_TLS_CHECK_HOSTNAME"),
        ("Error while reading from h:6380 : (1, '[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate "
         "required (_ssl.c:2580)')", "set BRIGADE_REDIS_TLS_CERT_FILE and BRIGADE_REDIS_TLS_KEY_FILE"),
    ]:
        said = redis_clients.one_line(RedisError(error))
        assert said.startswith(error[:30]) and setting in said and 'docs/operations.md, "Redis over TLS"' in said, said
    assert redis_clients.one_line(RedisError("Connection refused")) == "Connection refused"


def test_a_killed_data_node_starts_again_as_the_replica_of_the_node_promoted_in_its_place(tmp_path):
    from ops.stack.redis_ha import RedisHA, replica_of

    ha = RedisHA(tmp_path, data_ports=[7001, 7002, 7003], sentinel_ports=[7011, 7012, 7013])
    parts = ha.parts(server="redis-server")
    first, replica = parts["redis-primary"], parts["redis-replica1"]  # replica1: --replicaof 7001
    assert replica_of(first, ha.host, 7002)[-3:] == ["--replicaof", ha.host, "7002"]
    moved = replica_of(replica, ha.host, 7003)
    assert moved.count("--replicaof") == 1 and moved[-3:] == ["--replicaof", ha.host, "7003"]
    # No other node was promoted (none named, or the killed node itself): started without
    # `--replicaof`, for the sentinels to take back as primary, not as a replica of a replica.
    for argv, port in ((first, 7001), (replica, 7002), (replica, None)):
        assert "--replicaof" not in replica_of(argv, ha.host, port)
    assert replica_of(first, ha.host, 7002)[:len(first)] == first  # the rest of the command line kept


def test_the_factory_follows_a_sentinel_url_to_the_primary(tmp_path):
    """A real primary, two replicas and three sentinels: the sync and async clients of a
    redis+sentinel:// URL write to the primary and read back; a redis:// client of the primary sees it."""
    from tests.services import RedisHAServer

    ha = RedisHAServer(tmp_path)
    try:
        sync = redis_clients.client(ha.url)
        sync.set("via-sentinel", "yes")
        primary = redis_clients.client(ha.ha.node_url(ha.ha.primary_port()))
        assert primary.get("via-sentinel") == "yes"

        async def read():
            aio = redis_clients.async_client(ha.url)
            try:
                return await aio.get("via-sentinel")
            finally:
                await aio.aclose()

        assert asyncio.run(read()) == "yes"
    finally:
        ha.stop()


def test_a_bad_or_unanswered_sentinel_url_is_one_line_that_says_what_to_do():
    import subprocess
    import sys

    def brigade(*args: str, url: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ops.commands.cli", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=60, env={**__import__("os").environ, "BRIGADE_REDIS_URL": url})

    bad = brigade("status", url="redis+sentinel://:pw@127.0.0.1:1")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "BRIGADE_REDIS_URL" in bad.stderr and "no master name" in bad.stderr and "pw" not in bad.stderr
    for args in (("status",), ("keys", "list")):
        gone = brigade(*args, url="redis+sentinel://:pw@127.0.0.1:1/m/0")
        assert gone.returncode == 1 and gone.stderr.count("\n") == 1, (args, gone.stderr)
        assert "No master found for 'm'" in gone.stderr and "ConnectionPool" not in gone.stderr, gone.stderr
        assert ":pw@" not in gone.stderr


def test_a_call_waits_out_a_failover_for_its_budget_and_no_longer():
    from redis.exceptions import ConnectionError as RedisConnectionError

    def failing(times: int):
        calls = []

        async def call():
            calls.append(time.monotonic())
            if len(calls) <= times:
                raise RedisConnectionError("no master")
            return "answered"
        return call, calls

    call, calls = failing(3)
    assert asyncio.run(redis_clients.through_failover(call, 5.0)) == "answered" and len(calls) == 4
    call, calls = failing(1000)
    started = time.monotonic()
    with pytest.raises(RedisConnectionError):
        asyncio.run(redis_clients.through_failover(call, 0.5))
    assert time.monotonic() - started >= 0.5 and len(calls) > 2  # it waited out its budget, trying again
    # and no longer: the first try that fails past the budget's end is the last (the budget starts
    # before the first try, so a try begun 0.5 s after it is past the end)
    assert len([t for t in calls if t >= calls[0] + 0.5]) <= 1, [round(t - calls[0], 2) for t in calls]
    call, calls = failing(1)
    with pytest.raises(RedisConnectionError):  # budget 0 (a lone Redis): one try
        asyncio.run(redis_clients.through_failover(call, 0))
    assert len(calls) == 1
    assert Settings(redis_url="redis+sentinel://h/m").failover_budget_s == 10.0 and Settings().failover_budget_s == 0


def test_a_death_costs_an_attempt_only_to_the_requests_its_engine_was_computing(client):
    """Issue 38's chaos bench: batch lines that each sat, waiting for a row, in three workers that
    were killed for other reasons were buried as poison (`worker_failed`). A run counts as an
    attempt only once its engine starts computing it (engage.lua): by the reaper and at a takeover
    by claim alike; a fenced caller cannot mark another's run."""
    settings = Settings(max_attempts=2)
    claims = ClaimStore.from_settings(client, settings)
    for rid in ("waited", "computed"):
        client.delete(redis_keys.claim(rid), redis_keys.stream(rid))
        client.set(redis_keys.request(rid), queued(rid).model_dump_json())
    for death in range(5):  # five deaths while waiting: none counts, never buried
        took = claims.claim("waited", f"w{death}#1")
        assert took.outcome == "claimed" and took.attempts == 1, took
        reap = claims.reap if death % 2 else (lambda rid, owner: claims.claim(rid, "next#1").outcome)
        assert reap("waited", f"w{death}#1") in ("requeue", "claimed")
        if death % 2 == 0:  # taken over by a claim: hand it back for the next round
            assert claims.release("waited", "next#1", int(client.hget(redis_keys.claim("waited"), "epoch")))
    first = claims.claim("computed", "a#1")
    assert not claims.release("computed", "x#1", first.epoch)  # (another's claim: untouched)
    claims.engage({"computed": first.epoch - 1})  # a stale epoch marks nothing
    assert client.hget(redis_keys.claim("computed"), "engaged") is None
    claims.engage({"computed": first.epoch})
    assert claims.reap("computed", "a#1") == "requeue"  # one death while computing: 1 of 2
    second = claims.claim("computed", "b#1")
    assert second.attempts == 2 and client.hget(redis_keys.claim("computed"), "engaged") is None  # a new run
    claims.engage({"computed": second.epoch})
    assert claims.reap("computed", "b#1") == "buried"  # the second: poison
    assert "computed" in {e["request_id"] for e in claims.dead_letters()}
    assert "waited" not in {e["request_id"] for e in claims.dead_letters()}


def test_a_fenced_worker_queues_again_only_a_request_nobody_will_queue(client):
    """Issue 38's chaos bench: a worker back from a cut was fenced on a request the reaper had just
    queued again, took it for an orphan and queued it a second time; its second copy ran beside the
    first. A claim `queued` (reaped, handed back) has its sender; only a lost claim is an orphan."""
    claims = ClaimStore.from_settings(client, Settings())
    client.delete(redis_keys.claim("o1"))
    client.set(redis_keys.request("o1"), queued("o1").model_dump_json())
    claims.claim("o1", "cut#1")
    assert claims.reap("o1", "cut#1") == "requeue"
    assert not claims.orphaned("o1", "cut#1")  # the reaper sends it
    claims.claim("o1", "other#1")
    client.set(redis_keys.worker("other#1"), "{}", ex=30)
    assert not claims.orphaned("o1", "cut#1")  # another runs it
    client.delete(redis_keys.claim("o1"))  # a failover lost the claim: nobody will send it
    assert claims.orphaned("o1", "cut#1")
