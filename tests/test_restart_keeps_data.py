"""Data survives a restart of `brigade up` and a crash of its Redis, on real processes: `brigade up`
(its own Redis with the append-only file in BRIGADE_DATA_DIR, the gateway with keys required, a
worker with the tiny model, since what is kept does not depend on the words, a reaper), a real API
key, a cached answer and a finished batch job; then Redis is SIGKILLed, `up` stops, and a new
`brigade up` finds them all."""
from __future__ import annotations

import json
import signal

import httpx
import pytest
from openai import OpenAI

from tests.brigade_up import BrigadeUp, still_running
from tests.services import create_key, free_port, service_env, wait_until

# Redis SIGKILLed under `brigade up`, and `up` started again: `make test-long`.
pytestmark = pytest.mark.long

QUESTION = "What is the capital of France?"
MODEL = "smollm2-135m-instruct"


def ask(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                      json={"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                            "max_tokens": 12, "temperature": 0})


def test_keys_cached_answers_and_batch_results_outlive_a_redis_crash_and_a_restart(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    redis_url = f"redis://127.0.0.1:{free_port()}/0"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = service_env(redis_url, port, BRIGADE_DATA_DIR=str(data), BRIGADE_AUTH="required",
                      BRIGADE_DRAIN_SECONDS="1", BRIGADE_BATCH_POLL_S="0.5",
                      BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1")
    ups = [BrigadeUp(env, tmp_path / "up-1.log")]
    try:
        parts = ups[0].wait_ready()
        key = create_key(redis_url, "restart")
        first = ask(url, key)
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        assert first.json()["brigade"]["cached"] is None
        # Stored once the answer has ended; asked again, it comes from the cache.
        wait_until(lambda: ask(url, key).json()["brigade"]["cached"] == "exact", 30, interval=0.5,
                   what="the answer to be cached")

        client = OpenAI(base_url=f"{url}/v1", api_key=key)
        lines = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "max_tokens": 6, "temperature": 0,
                           "messages": [{"role": "user", "content": f"Name a colour (number {i})."}]}}
                 for i in range(3)]
        source = tmp_path / "job.jsonl"
        source.write_text("".join(json.dumps(x) + "\n" for x in lines))
        job = client.batches.create(input_file_id=client.files.create(file=source.open("rb"), purpose="batch").id,
                                    endpoint="/v1/chat/completions", completion_window="24h")
        job = wait_until(lambda: (j := client.batches.retrieve(job.id)).status in ("completed", "failed") and j,
                         180, interval=0.5, what="the batch job to end")
        assert job.status == "completed" and job.request_counts.completed == 3, job
        results = client.files.content(job.output_file_id).text
        assert [json.loads(x)["custom_id"] for x in results.splitlines()] == ["req-0", "req-1", "req-2"]
        # The job's files are data: under BRIGADE_DATA_DIR by default, not in the cache folder.
        assert (data / "batches" / f"{job.output_file_id}.jsonl").is_file()

        parts["redis"].send_signal(signal.SIGKILL)
        assert ups[0].proc.wait(120) == 1, ups[0].tail()  # its Redis died: `up` stopped the rest
        assert not still_running(list(parts.values())), ups[0].tail()

        ups.append(BrigadeUp(env, tmp_path / "up-2.log"))
        ups[1].wait_ready()
        again = ask(url, key)
        assert again.status_code == 200, again.text
        assert again.json()["brigade"]["cached"] == "exact", again.json()
        assert again.json()["choices"][0]["message"]["content"] == answer
        assert ask(url, "brg_not-a-key").status_code == 401  # keys are required: the old one still counts
        kept = client.batches.retrieve(job.id)
        assert kept.status == "completed" and kept.output_file_id == job.output_file_id, kept
        assert client.files.content(kept.output_file_id).text == results

        ups[1].proc.send_signal(signal.SIGTERM)
        assert ups[1].proc.wait(60) == 0, ups[1].tail()
    except BaseException:
        for up in ups:
            print(f"--- {up.log_path.name}\n{up.tail()}")
        raise
    finally:
        for up in ups:
            up.kill()

