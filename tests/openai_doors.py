"""Helpers of the OpenAI-door tests (tests/test_openai_api.py): `Doors`, the Stack of their four
gateways and one worker (started by its `start_all`, from that module's one module-scoped fixture),
with their ports and official `openai` clients; the chat request body, the requests a worker
runs, and a gateway's /metrics as numbers. Nothing here starts on import."""
from __future__ import annotations

from pathlib import Path

import httpx
import openai

from tests.services import Stack, create_key, wait_until, worker_statuses

MODEL = "smollm2-135m-instruct"
QUESTION = "What is the capital of France?"


class Doors(Stack):
    key: str  # a key of the strict gateway, no limits

    @property
    def open(self) -> int:
        return self.gateways["open"].port

    @property
    def strict(self) -> int:
        return self.gateways["strict"].port

    @property
    def full(self) -> int:
        return self.gateways["full"].port

    @property
    def empty(self) -> int:
        return self.gateways["empty"].port

    @property
    def store_url(self) -> str:
        return self.redis.url

    def client(self, port: int, key: str = "none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120, **kw)

    def async_client(self, port: int, key: str = "none") -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0, timeout=120)

    def start_all(self, patterns: Path) -> None:
        """Its four gateways (`strict` blocks what `patterns` names) and one worker; returns once all
        answer, `open` is ready, `empty` has looked at the heartbeats once and `key` is a key."""
        self.start_gateway("open")
        self.start_gateway("strict", BRIGADE_AUTH="required", BRIGADE_GUARD_PATTERNS_FILE=str(patterns),
                           BRIGADE_GUARDS="gateway.admission.content_guards:sanitize,gateway.admission.content_guards:patterns,"
                                          "tests.guard_plugins:explode_on_marker,tests.guard_plugins:explode_on_output")
        self.start_gateway("full", BRIGADE_MAX_QUEUE_DEPTH="0", BRIGADE_CACHE_ENABLED="0")
        self.start_gateway("empty", BRIGADE_REDIS_URL=self.redis.url.rsplit("/", 1)[0] + "/1",
                           BRIGADE_CACHE_ENABLED="0")
        self.start_worker("w1@openai")
        self.wait_healthy(timeout=300)  # four gateways start at once
        self.wait_ready(gateways=["open"])
        # The `empty` gateway must have looked at the heartbeats once (it finds none): its fleet
        # gauges appear after its first look.
        wait_until(lambda: "brigade_queue_depth{" in httpx.get(f"http://127.0.0.1:{self.empty}/metrics").text,
                   30, what="the empty gateway's first look at the fleet")
        self.key = create_key(self.redis.url)


def _chat(question: str = QUESTION, **extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": question}], "temperature": 0, **extra}


def _running(doors: Doors) -> list[str]:
    return [rid for s in worker_statuses(doors.redis.client) for rid in s["requests"]]


def _scrape(port: int) -> dict[tuple, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(scrape: dict, name: str, **labels) -> float:
    return scrape.get((name, tuple(sorted(labels.items()))), 0.0)
