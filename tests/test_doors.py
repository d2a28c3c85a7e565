"""The doors a new user walks through first, on real processes: `brigade chat` (as a subprocess
with its stdin piped) against a real gateway and `brigade worker` on a real redis-server, and
`brigade up` itself."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.brigade_up import BrigadeUp
from tests.services import RedisServer, Stack, create_key, free_port, service_env, wait_until, worker_statuses

ROOT = Path(__file__).resolve().parent.parent
LONG_QUESTION = "Write a very long and detailed essay about the history of the Roman Empire."


class Doors(Stack):
    key: str  # an API key: this gateway requires one


@pytest.fixture(scope="module")
def doors(redis_server, tiny_model_dir, tmp_path_factory):
    # Keepalive pings every second, answered within a second: a client whose event loop is
    # blocked (waiting for the user's next line) loses its connection within about 2 s. The doors'
    # mechanics need no real answers: the tiny model.
    with Doors(redis_server, tmp_path_factory.mktemp("doors"), BRIGADE_WS_PING_INTERVAL_S="1",
               BRIGADE_WS_PING_TIMEOUT_S="1", BRIGADE_AUTH="required", BRIGADE_RESUME_GRACE_S="60",
               BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1") as doors:
        doors.key = create_key(redis_server.url, "doors")
        doors.start_gateway()
        doors.start_worker("doors@test")
        doors.wait_ready()
        yield doors


class Chat:
    """`brigade chat` as a user runs it, its stdin a pipe; stdout and stderr gathered as they come."""

    def __init__(self, doors: Doors, *args: str, key_in_env: bool = True):
        env = dict(doors.env)
        env.pop("BRIGADE_API_KEY", None)
        if key_in_env:
            env["BRIGADE_API_KEY"] = doors.key
        self.proc = subprocess.Popen([sys.executable, "-m", "ops.commands.cli", "chat", "--url", doors.url, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env, cwd=ROOT)
        self._out, self._err = bytearray(), bytearray()
        for stream, buf in ((self.proc.stdout, self._out), (self.proc.stderr, self._err)):
            threading.Thread(target=_gather, args=(stream, buf), daemon=True).start()

    @property
    def out(self) -> str:
        return self._out.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self._err.decode("utf-8", "replace")

    def say(self, line: str) -> None:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def end_input(self) -> None:
        self.proc.stdin.close()

    def summaries(self) -> list[str]:
        """The one-line notes after each answer (stderr), e.g. `[not cached, ..., 31 prompt tokens]`."""
        return [line for line in self.err.splitlines() if line.startswith("[") and "prompt tokens" in line]

    def wait_for_answers(self, n: int, timeout: float = 120) -> list[str]:
        def answered():
            if self.proc.poll() is not None:
                raise AssertionError(f"chat exited ({self.proc.returncode}):\n{self.err}")
            return len(self.summaries()) >= n and self.summaries()
        return wait_until(answered, timeout, what=f"{n} answer(s); stderr so far:\n{self.err}")

    def finish(self, timeout: float = 15) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


def _gather(stream, buf: bytearray) -> None:
    while chunk := os.read(stream.fileno(), 65536):
        buf.extend(chunk)


def prompt_tokens(summary: str) -> int:
    return int(re.search(r"(\d+) prompt tokens", summary).group(1))


def prompt_tokens_alone(doors: Doors, question: str) -> int:
    chat = Chat(doors, "--no-cache", "--max-tokens", "1", question)
    try:
        assert chat.finish(120) == 0, chat.err
        [summary] = chat.summaries()
        return prompt_tokens(summary)
    finally:
        chat.close()


def running(doors: Doors) -> int:
    return sum(s["running"] for s in worker_statuses(doors.redis.client))


def assert_no_traceback(chat: Chat) -> None:
    assert "Traceback" not in chat.err and "KeyboardInterrupt" not in chat.err, chat.err


# ---- brigade chat ------------------------------------------------------------------------------

def test_chat_outlives_an_idle_longer_than_the_keepalive_and_keeps_its_conversation(doors):
    chat = Chat(doors, "--no-cache", "--max-tokens", "16")
    try:
        chat.say("My name is Ada. What is 2 + 2?")
        chat.wait_for_answers(1)
        # Idle for 5 s: a client that cannot answer the gateway's pings meanwhile is disconnected.
        idle_until = time.monotonic() + 5
        wait_until(lambda: chat.proc.poll() is not None or time.monotonic() >= idle_until, 10, what="idle time")
        assert chat.proc.poll() is None, chat.err
        second = "And what is 3 + 3?"
        chat.say(second)
        first, then = chat.wait_for_answers(2)
        chat.end_input()
        assert chat.finish() == 0, chat.err
    finally:
        chat.close()
    assert_no_traceback(chat)
    assert "connection lost" not in chat.err, "the connection should have lived through the idle time"
    assert first.startswith("[not cached,") and "first token" in first and "total" in first, first
    # The second question went with the first exchange before it: a longer prompt than alone.
    assert prompt_tokens(then) > prompt_tokens_alone(doors, second), (then, chat.err)


def test_ctrl_c_during_an_answer_cancels_it_and_the_session_goes_on(doors):
    chat = Chat(doors, "--no-cache", "--max-tokens", "1000")
    try:
        chat.say(LONG_QUESTION)
        wait_until(lambda: len(chat.out) > 20, 120, what="the answer to stream")
        wait_until(lambda: running(doors) >= 1, 10, what="the worker to run the request")
        chat.proc.send_signal(signal.SIGINT)
        wait_until(lambda: running(doors) == 0, 15, what="the worker to stop the cancelled request")
        wait_until(lambda: "[cancelled]" in chat.err, 10, what="the chat to say the answer was cancelled")
        assert chat.proc.poll() is None, chat.err
        chat.say("What is 2 + 2?")
        chat.wait_for_answers(1)
        chat.proc.send_signal(signal.SIGINT)  # at the prompt: the session ends
        assert chat.finish() == 130, chat.err
    finally:
        chat.close()
    assert_no_traceback(chat)


def test_ctrl_c_during_a_one_shot_question_cancels_it_and_exits_130(doors):
    chat = Chat(doors, "--no-cache", "--max-tokens", "1000", "--api-key", doors.key, LONG_QUESTION, key_in_env=False)
    try:
        wait_until(lambda: len(chat.out) > 20, 120, what="the answer to stream")
        wait_until(lambda: running(doors) >= 1, 10, what="the worker to run the request")
        chat.proc.send_signal(signal.SIGINT)
        assert chat.finish() == 130, chat.err
        # Cancelled, not merely abandoned: this gateway keeps a left request running 60 s for a resume.
        wait_until(lambda: running(doors) == 0, 15, what="the worker to stop the cancelled request")
    finally:
        chat.close()
    assert_no_traceback(chat)


def test_an_error_event_is_printed_and_the_session_goes_on(doors):
    chat = Chat(doors, "--max-tokens", "8")
    try:
        chat.say("x" * 70_000)  # over max_prompt_chars
        wait_until(lambda: "error prompt_too_long:" in chat.err, 30, what="the error to be printed")
        chat.say("What is 2 + 2?")
        chat.wait_for_answers(1)
        chat.end_input()
        assert chat.finish() == 0, chat.err
    finally:
        chat.close()
    assert_no_traceback(chat)


def test_a_repeated_question_is_summarised_as_an_exact_cache_hit(doors):
    question = f"What colour is the sky on a clear day? ({uuid.uuid4().hex[:6]})"
    chat = Chat(doors, "--max-tokens", "8")
    try:
        chat.say(question)
        chat.wait_for_answers(1)
        wait_until(lambda: _one_shot_summary(doors, question).startswith("[cached (exact),"), 30, interval=0.5,
                   what="the repeated question to be an exact hit")
        chat.end_input()
        assert chat.finish() == 0
    finally:
        chat.close()
    assert chat.summaries()[0].startswith("[not cached,")


def _one_shot_summary(doors: Doors, question: str) -> str:
    chat = Chat(doors, "--max-tokens", "8", question)
    try:
        assert chat.finish(120) == 0, chat.err
        return chat.summaries()[-1]
    finally:
        chat.close()


def test_chat_without_a_valid_api_key_is_told_so_without_a_traceback(doors):
    for args in ([], ["--api-key", "brg_00000000_" + "x" * 32]):
        chat = Chat(doors, *args, "What is 2 + 2?", key_in_env=False)
        try:
            assert chat.finish(60) == 1, chat.err
        finally:
            chat.close()
        assert "error unauthorized:" in chat.err, chat.err
        assert_no_traceback(chat)


def test_chat_reconnects_when_the_gateway_restarts_and_keeps_its_conversation(doors):
    chat = Chat(doors, "--no-cache", "--max-tokens", "16")
    try:
        chat.say("My name is Ada. What is 2 + 2?")
        chat.wait_for_answers(1)
        doors.restart_gateway()
        second = "And what is 3 + 3?"
        chat.say(second)
        _, then = chat.wait_for_answers(2, timeout=60)
        chat.end_input()
        assert chat.finish() == 0, chat.err
    finally:
        chat.close()
    assert_no_traceback(chat)
    assert prompt_tokens(then) > prompt_tokens_alone(doors, second), (then, chat.err)


def test_an_answer_cut_by_a_gateway_restart_is_resumed_whole(doors):
    # Long enough that the restart lands mid-answer: the tiny model makes a token in a few ms, and 48
    # tokens once ended before the restart did.
    args = ("--no-cache", "--max-tokens", "600", LONG_QUESTION)
    chat = Chat(doors, *args)
    try:
        wait_until(lambda: len(chat.out) > 10, 120, what="the answer to stream")
        doors.restart_gateway()
        assert chat.finish(60) == 0, chat.err
    finally:
        chat.close()
    assert "[connection lost; reconnecting]" in chat.err, chat.err
    again = Chat(doors, *args)
    try:
        assert again.finish(120) == 0, again.err
    finally:
        again.close()
    # Greedy: the same question gives the same answer; the resumed one lost and repeated nothing.
    assert chat.out == again.out and len(again.out) > 20, (chat.out, again.out)


# ---- brigade up ----------------------------------------------------------------------------------

def _processes_marked(mark: str) -> list[int]:
    """Live processes (of this user) whose environment carries `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if mark.encode() in (entry / "environ").read_bytes() and _state(int(entry.name)) not in ("Z", None):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _state(pid: int) -> str | None:
    """The kernel's state letter of a process (Z: exited, not yet reaped), or None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


def test_up_on_a_port_in_use_says_so_and_starts_nothing(tmp_path):
    server = RedisServer(tmp_path)
    held = socket.socket()
    mark = uuid.uuid4().hex
    try:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = service_env(server.url, port, DOORS_MARK=mark)
        up = subprocess.run([sys.executable, "-m", "ops.commands.cli", "up"], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=30)
        started = _processes_marked(f"DOORS_MARK={mark}")
        heartbeats = worker_statuses(server.client)
    finally:
        for pid in _processes_marked(f"DOORS_MARK={mark}"):
            os.kill(pid, signal.SIGKILL)
        held.close()
        server.stop()
    assert up.returncode != 0, up.stdout + up.stderr
    assert (f"port {port} on 127.0.0.1 is in use (another Brigade?): stop it or set BRIGADE_GATEWAY_PORT"
            in up.stderr), up.stderr
    assert started == [], f"`up` started processes although it refused: {started}"
    assert heartbeats == []


def test_up_stops_the_gateway_then_the_worker_then_the_reaper_then_its_redis(tmp_path, tiny_model_dir):
    order = ("gateway", "worker", "reaper", "redis")
    redis_port, port = free_port(), free_port()
    env = service_env(f"redis://127.0.0.1:{redis_port}/0", port, BRIGADE_CACHE_ENABLED="false",
                      BRIGADE_DATA_DIR=str(tmp_path / "data"), BRIGADE_MODEL=str(tiny_model_dir),
                      BRIGADE_TORCH_THREADS="1")
    up = BrigadeUp(env, tmp_path / "up.log")
    snapshots: list[dict[str, bool]] = []
    pids: dict[str, int] = {}
    try:
        pids = {name: p.pid for name, p in up.wait_ready(180).items()}
        assert sorted(pids) == sorted(order), pids
        up.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            # Later parts first: a part seen stopped here stopped before the earlier ones are read.
            snapshot = {name: _alive(pids[name]) for name in reversed(order)}
            snapshots.append(snapshot)
            if not any(snapshot.values()):
                break
            time.sleep(0.02)
        assert up.proc.wait(30) == 0
    finally:
        up.kill()
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    output = (tmp_path / "up.log").read_text()
    assert "Traceback" not in output, output[-3000:]
    assert not any(snapshots[-1].values()), f"still running after 90 s: {snapshots[-1]}"
    for snapshot in snapshots:
        for i, name in enumerate(order):
            if not snapshot[name]:
                assert not any(snapshot[earlier] for earlier in order[:i]), (
                    f"{name} stopped while {[e for e in order[:i] if snapshot[e]]} still ran")
