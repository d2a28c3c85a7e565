"""Canary releases (ops/rollout/canary.py, `brigade canary`) on a real redis-server.

Two versions are registered directly (no weights are read), their outcomes written as a gateway
writes them, and the controller driven by `tick(now=...)`: outcomes carry the real write time
(their stream ids), ticks pass a later `now` to let a step's interval pass without waiting.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from ops.bench import serve_stats
from ops.core import redis_keys
from ops.rollout import canary, outcomes, registry
from ops.rollout.canary import CanaryError, Controller
from ops.rollout.outcomes import Outcome
from ops.core.redis_clients import client as redis_client
from ops.rollout.registry import ModelEntry, RouteSpec, Share
from ops.core.settings import Settings
from ops.rollout.slo import InvalidObjective, parse_slo

ROOT = Path(__file__).resolve().parent.parent
BRIGADE = ROOT / ".venv" / "bin" / "brigade"
SLO = "ttft_p95<=1.2x,tpot_p50<=1.2x,error_rate<=0.01"
HOUR = 3600.0


@pytest.fixture
def redis_client_(redis_server):
    client = redis_client(redis_server.url)
    client.flushdb()
    for version in ("v1", "v2"):  # v1 first: the stable version
        registry.register(client, ModelEntry(name="m", version=version, source="/nowhere", path="/nowhere",
                                             checksum="sha256:x", parameters=1, added_at=time.time()))
    yield client
    client.close()


@pytest.fixture
def settings(redis_server) -> Settings:
    return Settings(redis_url=redis_server.url, canary_lease_s=30.0)


def write(client, settings, version: str, count: int, ttft: float = 0.2, tpot: float = 0.05, **flags) -> None:
    for _ in range(count):
        outcome = Outcome(at=time.time(), ttft_s=None if flags.get("error") else ttft,
                          tpot_s=None if flags.get("error") or flags.get("cached") else tpot,
                          e2e_s=None if flags.get("error") else ttft + 31 * tpot, **flags)
        outcomes.record_sync(client, settings, "m", version, outcome)


def route(client) -> RouteSpec:
    return registry.read_snapshot(client).routes["m"]


def start(client, steps=(5, 25, 50, 100), interval_s=60.0, slo=SLO, min_requests=20, window_s=HOUR) -> float:
    t0 = time.time()
    canary.start(client, "m", "v2", list(steps), interval_s, slo, min_requests, window_s=window_s, now=t0)
    return t0


# ---- objectives -----------------------------------------------------------------------------------


def test_a_ratio_objective_is_a_multiple_of_the_baseline():
    ratio, absolute, rate = parse_slo("ttft_p95<=1.2x, tpot_p50<=200ms, error_rate<=1%")
    assert (ratio.name, ratio.relative, ratio.threshold) == ("ttft_p95", True, 1.2)
    assert ratio.limit(2.0) == pytest.approx(2.4) and ratio.limit(None) is None
    assert ratio.holds(2.3, baseline=2.0) and not ratio.holds(2.5, baseline=2.0)
    assert not ratio.holds(0.1)  # no baseline: no verdict of "holds"
    assert (absolute.relative, absolute.threshold) == (False, pytest.approx(0.2))
    assert rate.threshold == pytest.approx(0.01) and not rate.relative


@pytest.mark.parametrize("text, says", [("error_rate<=1.2x", "not a ratio"), ("ttft_p95<=0x", "above 0"),
                                        ("ttft_p95<=1.2", "unit")])
def test_a_bad_ratio_is_refused_with_a_reason(text, says):
    with pytest.raises(InvalidObjective, match=says):
        parse_slo(text)


def test_bench_serve_refuses_a_ratio_it_has_no_baseline_for():
    with pytest.raises(InvalidObjective, match="no stable version to compare with"):
        serve_stats.parse_slo("ttft_p95<=2s,tpot_p50<=1.2x")
    assert serve_stats.parse_slo("ttft_p95<=2s")[0].threshold == 2.0
    done = subprocess.run([str(BRIGADE), "bench", "serve", "--slo", "ttft_p95<=1.2x", "--url", "http://127.0.0.1:9",
                           "--num-requests", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "no stable version to compare with" in done.stderr


def test_version_stats_leave_out_shadows_and_keep_latencies_of_decoded_answers_only():
    found = [Outcome(at=1, ttft_s=0.1, tpot_s=0.01, e2e_s=1.0), Outcome(at=2, ttft_s=0.3, tpot_s=0.03, e2e_s=3.0),
             Outcome(at=3, ttft_s=0.001, e2e_s=0.001, cached=True), Outcome(at=4, error=True),
             Outcome(at=5, ttft_s=9.0, tpot_s=9.0, e2e_s=9.0, shadow=True)]
    stats = canary.VersionStats.of(found, wanted=("ttft_p99", "tpot_mean"))
    assert (stats.requests, stats.errors, stats.cached, stats.fresh) == (4, 1, 1, 3)
    assert stats.samples == {"ttft": 2, "tpot": 2, "e2e": 2}
    assert stats.stats["ttft_p50"] == pytest.approx(0.2) and stats.stats["tpot_mean"] == pytest.approx(0.02)
    assert stats.stats["ttft_p99"] == pytest.approx(0.298)
    assert stats.error_rate == 0.25 and stats.cache_hit_rate == 0.25


# ---- starting -------------------------------------------------------------------------------------


def test_start_gives_the_canary_its_first_share_last_and_keeps_the_sticky_mode(redis_client_):
    client = redis_client_
    registry.set_route(client, RouteSpec(model="m", shares=[Share(version="v1", percent=100)], sticky="user"))
    start(client)
    spec = route(client)
    assert [(s.version, s.percent) for s in spec.shares] == [("v1", 95.0), ("v2", 5.0)]
    assert spec.sticky == "user" and spec.why == "canary step 1 of 4"
    record = canary.read(client, "m")
    assert (record.state, record.stable, record.share) == ("running", "v1", 5.0)


@pytest.mark.parametrize("version, steps, slo, says", [
    ("v9", [5, 100], SLO, "not registered"),
    ("v1", [5, 100], SLO, "already the stable version"),
    ("v2", [5, 50], SLO, "the last step is 100"),
    ("v2", [50, 25, 100], SLO, "increasing"),
    ("v2", [5, 100], "ttft_p95<=fast", "not an objective"),
    ("v2", [5, 100], "itl_p95<=1.2x", "inter-token"),
])
def test_start_refuses_what_cannot_run(redis_client_, version, steps, slo, says):
    with pytest.raises((CanaryError, InvalidObjective), match=says):
        canary.start(redis_client_, "m", version, steps, 60, slo, 10)
    assert canary.read(redis_client_, "m") is None


def test_a_second_canary_of_a_model_waits_for_the_first(redis_client_):
    start(redis_client_)
    with pytest.raises(CanaryError, match="already has a running canary"):
        start(redis_client_)


# ---- the controller -------------------------------------------------------------------------------


def test_a_slow_canary_is_rolled_back_with_its_reason_and_evidence(redis_client_, settings):
    client = redis_client_
    start(client)
    write(client, settings, "v1", 30, tpot=0.05)
    write(client, settings, "v2", 30, tpot=0.10)  # twice the stable version's time per token
    decisions = Controller(client, "gw-1", settings).tick(now=time.time())
    reason = "rolled back: tpot_p50 2.0x stable over 30 requests"
    assert [(d.model, d.version, d.kind, d.reason, d.share) for d in decisions] == [
        ("m", "v2", "rolled_back", reason, 0.0)]
    spec = route(client)
    assert spec.share_of("v2") == 0 and spec.share_of("v1") == 100
    assert spec.why == f"canary {reason}"
    record = canary.read(client, "m")
    assert (record.state, record.reason) == ("rolled_back", reason)
    assert record.evidence["canary"]["stats"]["tpot_p50"] == pytest.approx(0.10)
    assert record.evidence["stable"]["stats"]["tpot_p50"] == pytest.approx(0.05)
    tpot = next(v for v in record.evidence["verdicts"] if v["name"] == "tpot_p50")
    assert tpot["state"] == "breached" and tpot["limit"] == pytest.approx(0.06)
    assert canary.log_entries(client, "m")[0]["reason"] == reason
    assert registry.read_snapshot(client).stable["m"] == "v1"
    assert Controller(client, "gw-1", settings).tick(now=time.time()) == []  # ended: nothing more to do


def test_an_absolute_objective_names_value_and_limit_in_the_reason(redis_client_, settings):
    client = redis_client_
    start(client, slo="error_rate<=0.01,ttft_p95<=2s")
    write(client, settings, "v2", 18)
    write(client, settings, "v2", 2, error=True)
    decisions = Controller(client, "gw-1", settings).tick(now=time.time())
    assert [d.reason for d in decisions] == ["rolled back: error_rate 0.1 > 0.01 over 20 requests"]


def test_a_canary_that_holds_is_stepped_through_every_step_and_promoted(redis_client_, settings):
    client = redis_client_
    t0 = start(client, interval_s=60.0)
    write(client, settings, "v1", 30)
    write(client, settings, "v2", 30)
    write(client, settings, "v2", 30, tpot=1.0, shadow=True)  # a shadow copy served no one: not evidence
    controller = Controller(client, "gw-1", settings)
    assert controller.tick(now=t0 + 30) == []  # the first step has not lasted its interval
    seen = []
    for k, at in enumerate((t0 + 61, t0 + 122, t0 + 183)):
        decisions = controller.tick(now=at)
        assert len(decisions) == 1, (k, decisions)
        seen.append((decisions[0].kind, decisions[0].share, route(client).share_of("v2")))
    assert seen == [("stepped", 25.0, 25.0), ("stepped", 50.0, 50.0), ("promoted", 100.0, 100.0)]
    snap = registry.read_snapshot(client)
    assert snap.stable["m"] == "v2"
    assert [(s.version, s.percent) for s in snap.routes["m"].shares] == [("v2", 100.0)]
    record = canary.read(client, "m")
    assert record.state == "promoted" and record.reason == "promoted: every objective held over 30 requests"
    assert [h["kind"] for h in record.history] == ["started", "stepped", "stepped", "promoted"]


def test_no_verdict_before_the_canary_answered_min_requests_itself(redis_client_, settings):
    client = redis_client_
    start(client, min_requests=50)
    write(client, settings, "v1", 50)
    write(client, settings, "v2", 20, ttft=0.001, cached=True)  # the cache answered: not the version's
    write(client, settings, "v2", 49, tpot=0.5)
    controller = Controller(client, "gw-1", settings)
    assert controller.tick(now=time.time()) == []
    report = canary.status(client, "m")
    assert {v["state"] for v in report["verdicts"]} == {"waiting"}
    assert report["verdicts"][0]["why"] == "49 of 50 requests"
    write(client, settings, "v2", 1, tpot=0.5)
    assert [d.kind for d in controller.tick(now=time.time())] == ["rolled_back"]


def test_a_ratio_waits_for_min_requests_samples_of_the_stable_version(redis_client_, settings):
    client = redis_client_
    start(client, slo="tpot_p50<=1.2x", min_requests=10)
    write(client, settings, "v2", 10, tpot=0.5)
    controller = Controller(client, "gw-1", settings)
    assert controller.tick(now=time.time()) == []
    assert canary.status(client, "m")["verdicts"][0]["why"] == "0 of 10 tpot samples of the stable version"
    write(client, settings, "v1", 9, tpot=0.1)  # one fast stable answer is no baseline; nine are not enough
    assert controller.tick(now=time.time()) == []
    assert canary.status(client, "m")["verdicts"][0]["why"] == "9 of 10 tpot samples of the stable version"
    write(client, settings, "v1", 1, tpot=0.1)
    assert [d.reason for d in controller.tick(now=time.time())] == [
        "rolled back: tpot_p50 5.0x stable over 10 requests"]


def test_only_the_controller_holding_the_lease_acts(redis_client_, settings):
    client = redis_client_
    first, second = Controller(client, "gw-1", settings), Controller(client, "gw-2", settings)
    assert first.tick(now=time.time()) == []  # nothing to do yet, but the lease is taken
    assert client.get(redis_keys.CANARY_LEASE) == "gw-1" and client.pttl(redis_keys.CANARY_LEASE) > 0
    start(client)
    write(client, settings, "v1", 30)
    write(client, settings, "v2", 30, tpot=0.5)
    assert second.tick(now=time.time()) == []
    assert canary.read(client, "m").state == "running"
    assert [d.kind for d in first.tick(now=time.time())] == ["rolled_back"]
    assert client.get(redis_keys.CANARY_LEASE) == "gw-1"  # renewed, not taken over
    first.release()
    assert second.hold_lease() and client.get(redis_keys.CANARY_LEASE) == "gw-2"
    assert not first.hold_lease()


def test_promote_by_hand_makes_the_canary_stable_now(redis_client_):
    client = redis_client_
    start(client)
    decision = canary.promote(client, "m")
    assert (decision.kind, decision.share) == ("promoted", 100.0)
    snap = registry.read_snapshot(client)
    assert snap.stable["m"] == "v2" and snap.routes["m"].share_of("v2") == 100
    assert canary.read(client, "m").reason == "promoted by hand"
    with pytest.raises(CanaryError, match="no running canary"):
        canary.promote(client, "m")


def test_abort_by_hand_gives_the_stable_version_everything_and_allows_a_new_start(redis_client_):
    client = redis_client_
    start(client)
    decision = canary.abort(client, "m")
    assert (decision.kind, decision.reason, decision.share) == ("aborted", "aborted by hand", 0.0)
    assert route(client).share_of("v1") == 100 and route(client).share_of("v2") == 0
    assert registry.read_snapshot(client).stable["m"] == "v1"
    assert canary.read(client, "m").state == "aborted"
    start(client)
    assert canary.read(client, "m").state == "running"


# ---- the command line -----------------------------------------------------------------------------


def brigade(redis_server, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "BRIGADE_REDIS_URL": redis_server.url}
    return subprocess.run([str(BRIGADE), "canary", *argv], env=env, capture_output=True, text=True, timeout=60)


def test_canary_status_prints_both_versions_side_by_side(redis_client_, redis_server, settings):
    client = redis_client_
    started = brigade(redis_server, "start", "m", "--version", "v2", "--steps", "10,100", "--interval", "10m",
                      "--slo", SLO, "--min-requests", "5")
    assert started.returncode == 0, started.stderr
    assert canary.read(client, "m").interval_s == 600.0
    write(client, settings, "v1", 6, ttft=0.2)
    write(client, settings, "v2", 7, ttft=0.4)
    shown = brigade(redis_server, "status", "m")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    header = next(line for line in lines if "stable v1" in line and "canary v2" in line and "@" not in line)
    assert header.index("stable v1") < header.index("canary v2")
    assert any(line.split()[:1] == ["requests"] and line.split()[1:] == ["6", "7"] for line in lines), shown.stdout
    ttft = next(line for line in lines if line.startswith("TTFT p95"))
    assert ttft.split()[2:] == ["0.200", "s", "0.400", "s"], ttft
    assert "verdict: breached" in shown.stdout and "FAIL ttft_p95<=1.2x" in shown.stdout
    as_json = json.loads(brigade(redis_server, "status", "m", "--json").stdout)
    assert (as_json["stable"]["requests"], as_json["canary"]["requests"]) == (6, 7)


def test_canary_commands_say_what_is_wrong_and_exit_2(redis_client_, redis_server):
    missing = brigade(redis_server, "status", "m")
    assert missing.returncode == 2 and "has had no canary" in missing.stderr
    bad = brigade(redis_server, "start", "m", "--version", "v2", "--interval", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    again = brigade(redis_server, "abort", "m")
    assert again.returncode == 2 and "no running canary" in again.stderr


def test_canary_status_says_in_one_line_when_redis_does_not_answer(tmp_path):
    env = {**os.environ, "BRIGADE_REDIS_URL": "redis://127.0.0.1:1/0"}
    done = subprocess.run([str(BRIGADE), "canary", "status", "m"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert len(done.stderr.strip().splitlines()) == 1 and "did not answer" in done.stderr


def test_status_of_an_ended_canary_shows_the_window_of_its_decision(redis_client_, settings):
    client = redis_client_
    start(client)
    write(client, settings, "v1", 30)
    write(client, settings, "v2", 30, tpot=0.5)
    ended = Controller(client, "gw-1", settings).tick(now=time.time())
    assert [d.kind for d in ended] == ["rolled_back"]
    decided_ms = int(canary.read(client, "m").ended_at * 1000)
    while int(time.time() * 1000) <= decided_ms:  # a later write gets a later stream id (milliseconds)
        time.sleep(0.001)
    write(client, settings, "v2", 30, tpot=0.05)  # traffic after the decision (a shadow, a pinned user)
    report = canary.status(client, "m")
    assert report["canary"]["requests"] == 30
    assert report["canary"]["stats"]["tpot_p50"] == pytest.approx(0.5)


def test_the_incremental_window_reads_what_a_whole_read_does(redis_client_, settings):
    """The controller's reader (only new entries each tick) against outcomes.window (all of them)."""
    client = redis_client_
    client.delete(redis_keys.outcomes("m", "v1"))
    reader = outcomes.WindowReader()
    start = time.time() - 1
    for rounds in range(3):
        write(client, settings, "v1", 1500 if rounds == 0 else 7)  # past one XRANGE page the first time
        now = time.time()
        assert reader.window(client, "m", "v1", start, now) == outcomes.window(client, "m", "v1", start, now)
    last_ms = int(client.xrevrange(redis_keys.outcomes("m", "v1"), count=1)[0][0].split("-")[0])
    while int(time.time() * 1000) <= last_ms:  # the next entries fall in a later millisecond
        time.sleep(0.001)
    later = time.time()
    write(client, settings, "v1", 3)
    # A window that slid past the first entries drops them, as a whole read does.
    assert reader.window(client, "m", "v1", later) == outcomes.window(client, "m", "v1", later)
    assert len(reader.window(client, "m", "v1", later)) == 3
