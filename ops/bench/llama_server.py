"""llama.cpp's `llama-server` as `brigade bench serve --versus llama-server` runs it: the default
model's GGUF, `-np` slots decoded together (continuous batching), each slot with the context one
request of the load needs, on free ports, supervised like Brigade's own parts (stopped with the
benchmark, however it ends).

The slot count is fixed when the server starts, so each concurrency gets a server of its own.
"""
from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

from ops.bench.peer_llama_cpp import peer_environment
from ops.core.ports import free_port
from ops.stack.supervision import PartExited, Supervisor

START_TIMEOUT_S = 120.0
SLOT_ROUNDING = 256  # a slot's context, in tokens, rounded up to this


def slot_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """The context one slot needs for a prompt of `prompt_tokens` and its answer, with room to spare
    for the chat template's tokens that a count of the prompt alone might miss."""
    need = prompt_tokens + max_tokens + 64
    return -(-need // SLOT_ROUNDING) * SLOT_ROUNDING


def server_argv(binary: Path, gguf: Path, slots: int, context_per_slot: int, threads: int, port: int,
                spec_type: str | None = None) -> list[str]:
    """`-np` slots sharing `-c` = slots x context_per_slot (each slot gets an equal share), `-t` threads
    for decoding and for prompts alike, continuous batching (its default, said aloud), no web UI;
    `spec_type`: one of its draftless speculation types (`--spec-type`, e.g. ngram-simple)."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(slots * context_per_slot),
            "--cont-batching", "--no-webui", *(["--spec-type", spec_type] if spec_type else [])]


class LlamaServer:
    """One llama-server, ready (its /health answers 200) inside the `with`."""

    def __init__(self, binary: Path, gguf: Path, slots: int, context_per_slot: int, threads: int, log: Path,
                 spec_type: str | None = None):
        self.port = free_port()
        self.argv = server_argv(binary, gguf, slots, context_per_slot, threads, self.port, spec_type)
        self.log = log
        self.supervisor = Supervisor(order=("llama",), grace_s={"llama": 10.0})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:  # refused while it starts, 503 while it loads the model
            return False

    def __enter__(self) -> "LlamaServer":
        self.supervisor.start("llama", self.argv, env=peer_environment(), log=self.log, death_signal=signal.SIGTERM)
        try:
            self.supervisor.wait_for(self.healthy, START_TIMEOUT_S, interval_s=0.25)
        except (PartExited, TimeoutError) as exc:
            self.supervisor.stop()
            raise RuntimeError(f"llama-server did not get ready ({exc}); its log: {self.log}") from None
        return self

    def __exit__(self, *exc) -> None:
        self.supervisor.stop()
