"""Batch jobs on real processes: a real redis-server (append-only), a real gateway (the job runner),
two real workers with the real model, a reaper, and the `brigade batch` CLI as a user runs it.
Faults are real: a Redis restarted mid-job from its append-only file. A worker and the job's
gateway SIGKILLed mid-job are the chaos run's (tests/test_chaos.py), under streaming load."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.batch.input import Checker, read_checked, write_checked
from gateway.request import RequestRules
from ops.core.settings import Settings
from tests.services import RedisServer, Stack, wait_until, worker_statuses

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = [
    "What is the capital of France?", "Name a primary colour.", "What is two plus two?",
    "Give me a word that rhymes with cat.", "What do bees make?", "Which planet is closest to the sun?",
    "What is the opposite of hot?", "Name a fruit that is yellow.", "How many legs does a spider have?",
    "What language is spoken in Brazil?",
]


class BatchStack(Stack):
    """The stack, and `brigade batch` and the batch API as a user drives them."""

    def batch(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ops.commands.cli", "batch", "--url", self.http, *args], cwd=ROOT,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def job(self, job_id: str) -> dict:
        return httpx.get(f"{self.http}/v1/batches/{job_id}", timeout=10).json()

    def submit(self, source: Path) -> str:
        submitted = self.batch("submit", str(source))
        assert submitted.returncode == 0, submitted.stderr
        return submitted.stdout.strip()

    def wait_end(self, job_id: str, what: str, timeout: float = 240) -> dict:
        def ended():
            try:
                job = self.job(job_id)
            except (httpx.HTTPError, ValueError):
                return None  # the gateway may answer 503 while it reconnects or restarts
            return job if job.get("status") in ("completed", "failed", "cancelled", "expired") else None
        return wait_until(ended, timeout, interval=0.5, what=what)

    def results(self, job_id: str, out: Path) -> list[dict]:
        done = self.batch("results", job_id, "--output", str(out))
        assert done.returncode == 0, done.stderr
        return read_output(out)


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    redis_server = RedisServer(tmp_path_factory.mktemp("batch-redis"), persistent=True)
    # A job's mechanics (order, once each, through faults) do not depend on the words: the tiny model.
    with BatchStack(redis_server, tmp_path_factory.mktemp("batch-logs"), own_redis=True,
                    BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1", BRIGADE_MAX_WAIT_MS="20",
                    BRIGADE_HEARTBEAT_TTL_S="3", BRIGADE_BATCH_WINDOW="8", BRIGADE_BATCH_LEASE_S="3",
                    BRIGADE_BATCH_POLL_S="0.5", BRIGADE_CACHE_ENABLED="0", BRIGADE_DRAIN_SECONDS="1",
                    # A killed worker's lines it had received but not claimed are sent again after
                    # this (30 s by default, which the SIGKILL test waited out), as in the failover fleet.
                    BRIGADE_UNCLAIMED_AFTER_S="3",
                    BRIGADE_BATCH_FILES_DIR=str(tmp_path_factory.mktemp("batch-files")),
                    # float32: every batch line is compared with the same request answered
                    # interactively, token for token, whatever else shared its engine steps.
                    BRIGADE_DTYPE="float32") as s:
        # All at once: the runner's window is BRIGADE_BATCH_WINDOW, not read from the workers that
        # beat when the gateway starts (the reason this fixture once waited for them first).
        s.start("reaper")
        for name in ("w1@batch", "w2@batch"):
            s.start_worker(name)
        s.start_gateway()
        s.wait_ready()
        yield s


def line(i: int, max_tokens: int = 8, chat: bool = True) -> dict:
    question = QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (number {i})")
    body = {"model": "smollm2-135m-instruct", "max_tokens": max_tokens, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": question}]
    else:
        body["prompt"] = question
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions" if chat else "/v1/completions",
            "body": body}


def write_lines(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def read_output(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def text_of(result: dict) -> str:
    body = result["response"]["body"]
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def interactive(stack: BatchStack, request: dict) -> str:
    resp = httpx.post(stack.http + request["url"], json=request["body"], timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def test_every_line_once_in_order_each_answer_as_asked_interactively(stack, tmp_path):
    requests = [line(i, chat=i % 5 != 4) for i in range(40)]
    source = write_lines(tmp_path / "jobs.jsonl", requests)
    out = tmp_path / "out.jsonl"
    done = stack.batch("submit", str(source), "--wait", "--output", str(out))
    assert done.returncode == 0, done.stderr + stack.tails()
    job_id = done.stdout.strip().splitlines()[0]
    results = read_output(out)
    assert [r["custom_id"] for r in results] == [r["custom_id"] for r in requests]
    assert all(r["error"] is None and r["response"]["status_code"] == 200 for r in results)
    assert len({r["id"] for r in results}) == 40
    for r in results:
        usage = r["response"]["body"]["usage"]
        assert usage["completion_tokens"] >= 1 and usage["prompt_tokens"] > 0
    # The same requests asked one by one over the HTTP API say the same (greedy), every one of them.
    for request, result in zip(requests, results):
        assert text_of(result) == interactive(stack, request), request["custom_id"]
    job = stack.job(job_id)
    assert job["status"] == "completed"
    assert job["request_counts"] == {"total": 40, "completed": 40, "failed": 0}
    # The results again, from a CLI process that never saw the job start.
    again = stack.batch("results", job_id)
    assert again.returncode == 0 and [json.loads(x) for x in again.stdout.splitlines()] == results


OK_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
             "additionalProperties": False}


def test_a_line_with_n2_and_logprobs_and_a_line_with_a_json_schema_come_out_as_asked(stack, tmp_path):
    sampled = line(5, max_tokens=6)
    sampled["body"].update(n=2, temperature=1.0, seed=4, logprobs=True, top_logprobs=1)
    shaped = line(6, max_tokens=24)
    shaped["body"]["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "ok", "schema": OK_SCHEMA, "strict": True}}
    out = tmp_path / "fields.out.jsonl"
    done = stack.batch("submit", str(write_lines(tmp_path / "fields.jsonl", [sampled, shaped])), "--wait",
                       "--output", str(out))
    assert done.returncode == 0, done.stderr
    two, json_line = (r["response"]["body"] for r in read_output(out))
    assert [ch["index"] for ch in two["choices"]] == [0, 1]
    for ch in two["choices"]:
        content = ch["logprobs"]["content"]
        assert len(content) >= 1 and ch["finish_reason"] in ("stop", "length"), ch
        assert all(len(e["top_logprobs"]) == 1 and e["logprob"] <= 0 for e in content), ch
    assert two["usage"]["completion_tokens"] == sum(len(ch["logprobs"]["content"]) for ch in two["choices"])
    # Seeded: the same body asked over the HTTP API gives the same two answers.
    asked = httpx.post(stack.http + sampled["url"], json=sampled["body"], timeout=120).json()
    assert [ch["message"]["content"] for ch in asked["choices"]] == [ch["message"]["content"] for ch in two["choices"]]
    answer = json_line["choices"][0]
    assert answer["finish_reason"] == "stop" and json.loads(answer["message"]["content"]) in ({"ok": True}, {"ok": False})


def test_invalid_lines_are_all_reported_with_their_numbers_before_anything_runs(stack, tmp_path):
    lines = [line(0), "this is not json", line(1), {"custom_id": "x", "method": "GET", "url": "/v1/chat/completions",
                                                     "body": {}},
             {**line(2), "body": {"messages": [{"role": "user", "content": "hi"}], "n": 17}}, line(0)]
    source = write_lines(tmp_path / "bad.jsonl", lines)
    refused = stack.batch("submit", str(source))
    assert refused.returncode == 2, refused.stderr
    err = refused.stderr
    assert "4 invalid line(s)" in err, err
    assert "line 2: the line is not valid JSON" in err and "line 4: `method` must be" in err
    assert "line 5: body.n" in err and "line 6: `custom_id` 'req-0' appears on an earlier line" in err
    # --skip-invalid runs the rest; each bad line still has its line in the output, as an error.
    out = tmp_path / "bad.output.jsonl"
    done = stack.batch("submit", str(source), "--skip-invalid", "--wait", "--output", str(out))
    assert done.returncode == 0, done.stderr
    results = read_output(out)
    assert [r["error"]["code"] if r["error"] else 200 for r in results] == [
        200, "invalid_line", 200, "invalid_line", "invalid_line", "invalid_line"]
    assert [r["custom_id"] for r in results] == ["req-0", None, "req-1", "x", "req-2", "req-0"]


def test_identical_deterministic_lines_are_answered_once(stack, tmp_path):
    same = line(3, max_tokens=12)
    requests = [{**same, "custom_id": f"copy-{i}"} for i in range(6)] + [line(4, max_tokens=12)]
    out = tmp_path / "dup.out.jsonl"
    done = stack.batch("submit", str(write_lines(tmp_path / "dup.jsonl", requests)), "--wait", "--output", str(out))
    assert done.returncode == 0, done.stderr
    results = read_output(out)
    assert [r["custom_id"] for r in results] == [r["custom_id"] for r in requests]
    rids = {r["response"]["request_id"] for r in results[:6]}
    assert len(rids) == 1  # one request answered all six copies
    assert len({text_of(r) for r in results[:6]}) == 1 and len({r["id"] for r in results}) == 7


def test_a_job_is_parsed_once_its_checked_file_gives_back_every_verdict_as_the_checker_made_it(tmp_path):
    source = tmp_path / "in.jsonl"
    guided = {**line(1), "body": {**line(1)["body"], "response_format": {"type": "json_object"}, "stop": "x",
                                  "logit_bias": {"5": 2}}}
    source.write_text("\n".join([json.dumps(line(0)), "", "not json", json.dumps(guided),
                                  json.dumps(line(2, chat=False))]) + "\n")
    checked = tmp_path / "job.checked.jsonl"
    valid, bad, count_bad = write_checked(str(source), Checker(RequestRules(Settings())), checked)
    assert (valid, count_bad, [b["line"] for b in bad]) == (3, 1, [3])
    again = Checker(RequestRules(Settings()))  # what a second parse of the input would give
    expected = [(n, again.check(n, raw)) for n, raw in enumerate(source.read_text().splitlines(), start=1)]
    assert list(read_checked(checked)) == expected  # typed requests back, equal field for field
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "job.checked.jsonl"]  # no half file left


def test_the_checker_gives_every_bad_line_a_reason():
    checker = Checker(RequestRules(Settings()))
    good = checker.check(1, json.dumps(line(0)))
    assert good.custom_id == "req-0" and good.chat
    reasons = [checker.check(n, raw).reason for n, raw in enumerate([
        "[]", json.dumps({"method": "POST"}), json.dumps({**line(1), "url": "/v1/embeddings"}),
        json.dumps({**line(2), "extra": 1}), json.dumps({**line(3), "body": {**line(3)["body"], "stream": True}}),
        json.dumps({**line(4), "body": {**line(4)["body"], "max_tokens": -1}})], start=2)]
    assert reasons[0] == "a line must be a JSON object"
    assert reasons[1] == "`custom_id` must be a non-empty string"
    assert reasons[2].startswith("`url` must be one of")
    assert reasons[3] == "unknown field 'extra'"
    assert reasons[4] == "`body.stream` must be false or absent in a batch"
    assert reasons[5].startswith("body.max_tokens:")
    assert checker.check(9, "   \n") is None  # blank lines are skipped


def test_cancel_stops_a_running_job_and_keeps_what_it_finished(stack, tmp_path):
    # Long enough that the job cannot end while `brigade batch cancel` starts (60 lines of 48 tokens
    # once all finished first, on an idle machine).
    requests = [line(i, max_tokens=64) for i in range(300)]
    source = write_lines(tmp_path / "long.jsonl", requests)
    job_id = stack.submit(source)
    wait_until(lambda: stack.job(job_id)["request_counts"]["completed"] >= 3, 120, what="some lines to finish")
    cancelled = stack.batch("cancel", job_id)
    assert cancelled.returncode == 0, cancelled.stderr
    job = stack.wait_end(job_id, "the cancel", 60)
    assert job["status"] == "cancelled", job
    results = stack.results(job_id, tmp_path / "cancelled.jsonl")
    assert 3 <= len(results) < len(requests)
    numbers = [int(r["custom_id"].split("-")[1]) for r in results]
    assert numbers == sorted(set(numbers))  # in input order, each once
    assert all(r["response"]["status_code"] == 200 for r in results)
    assert job["request_counts"]["completed"] == len(results)
    # Nothing of the job keeps running: the workers' engines empty out.
    wait_until(lambda: all(s["running"] == 0 and s["waiting"] == 0 for s in worker_statuses(stack.redis.client)),
               30, what="the cancelled lines to leave the workers")


@pytest.mark.long
def test_a_redis_restart_mid_job_with_the_append_only_file_loses_nothing(stack, tmp_path):
    requests = [line(i, max_tokens=16, chat=False) for i in range(30)]
    source = write_lines(tmp_path / "redis.jsonl", requests)
    job_id = stack.submit(source)
    wait_until(lambda: stack.job(job_id)["brigade"]["written"] >= 3, 120, what="some lines to be written")
    stack.redis.stop()
    stack.redis.start()
    job = stack.wait_end(job_id, "the job to end after the restart")
    assert job["status"] == "completed" and job["request_counts"]["completed"] == 30, job
    results = stack.results(job_id, tmp_path / "redis.out.jsonl")
    assert [r["custom_id"] for r in results] == [r["custom_id"] for r in requests]
    assert all(r["response"]["status_code"] == 200 for r in results)


def test_the_official_openai_client_drives_a_batch_end_to_end(stack, tmp_path):
    """files.create, batches.create/retrieve/list, files.content: OpenAI's own client, its shapes."""
    import time

    from openai import OpenAI

    client = OpenAI(base_url=stack.http + "/v1", api_key="unused")
    requests = [line(i, max_tokens=6) for i in range(5)]
    source = write_lines(tmp_path / "sdk.jsonl", requests)
    uploaded = client.files.create(file=source.open("rb"), purpose="batch")
    assert uploaded.id.startswith("file_") and uploaded.bytes == source.stat().st_size
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"team": "support"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"team": "support"}
    deadline = time.monotonic() + 120
    while batch.status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
        batch = client.batches.retrieve(batch.id)
    lines = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    assert batch.status == "completed" and batch.request_counts.completed == 5 and batch.request_counts.total == 5, \
        [x["response"] for x in lines if x["response"]["status_code"] != 200]
    assert batch.id in [b.id for b in client.batches.list(limit=10).data]
    assert [x["custom_id"] for x in lines] == [r["custom_id"] for r in requests]
    assert all(x["response"]["body"]["object"] == "chat.completion" for x in lines)
    metrics = httpx.get(stack.http + "/metrics", timeout=10).text
    assert 'brigade_batch_lines_total{model="smollm2-135m-instruct",outcome="completed"}' in metrics
    assert 'door="batch"' in metrics


def test_with_keys_a_job_belongs_to_its_key_and_its_lines_are_charged_to_it(stack, tmp_path):
    """A second gateway on the same Redis and workers, with keys required: the key that submits
    a job sees it, another caller does not, and the key's usage counts the job's lines."""
    from tests.services import create_key

    with stack.another_gateway("gateway-keys", BRIGADE_AUTH="required") as keyed:
        env, url = keyed.env, keyed.http_url
        key = create_key(stack.redis.url, "batcher")
        source = write_lines(tmp_path / "keyed.jsonl", [line(i, max_tokens=4) for i in range(3)])
        run = lambda *a: subprocess.run([sys.executable, "-m", "ops.commands.cli", "batch", "--url", url, *a], cwd=ROOT,
                                        env=env, capture_output=True, text=True, timeout=300)
        refused = run("submit", str(source))
        assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr
        done = run("--api-key", key, "submit", str(source), "--wait", "--output", str(tmp_path / "k.out"))
        assert done.returncode == 0, done.stderr
        job_id = done.stdout.strip().splitlines()[0]
        assert len(read_output(tmp_path / "k.out")) == 3
        # Another caller (the keyless gateway's anonymous one) does not see it.
        assert httpx.get(f"{stack.http}/v1/batches/{job_id}", timeout=10).status_code == 404
        usage = subprocess.run([sys.executable, "-m", "ops.commands.cli", "keys", "usage", "--json"], cwd=ROOT, env=env,
                               capture_output=True, text=True, timeout=60)
        row = next(json.loads(x) for x in usage.stdout.splitlines() if json.loads(x)["name"].startswith("batcher-"))
        assert row["requests"] == 3 and row["completion_tokens"] > 0, row
