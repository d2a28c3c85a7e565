"""API keys and the keys CLI without a Redis: the key format, the Authorization header's parsing,
and `brigade keys` against a Redis that does not answer or never replies (one line, no traceback).
The store, the limiter and the CLI on a real redis-server are tests/test_api_keys.py."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.admission.api_keys import bearer_key, new_key
from ops.commands.keys import run
from ops.core.settings import Settings
from tests.keys_cli import parse
from tests.services import free_port

ROOT = Path(__file__).resolve().parent.parent


def test_new_keys_are_http_and_subprotocol_tokens_of_one_word():
    for _ in range(500):
        key_id, plain = new_key()
        assert re.fullmatch(r"brg_[0-9a-f]{8}_[A-Za-z0-9_]{32}", plain), plain
        assert plain.split("_", 2)[1] == key_id


def test_bearer_key_reads_the_authorization_header():
    assert bearer_key("Bearer brg_0123abcd_x") == "brg_0123abcd_x"
    assert bearer_key("bearer   brg_0123abcd_x ") == "brg_0123abcd_x"
    assert bearer_key("Basic dXNlcjpwYXNz") is None
    assert bearer_key("Bearer ") is None
    assert bearer_key(None) is None


@pytest.mark.parametrize("argv", [("create", "--name", "x"), ("list",), ("revoke", "0123abcd"), ("usage",)],
                         ids=lambda argv: argv[0])
def test_cli_against_a_redis_that_does_not_answer_exits_1_with_one_line(argv, capsys):
    dead = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    assert run(parse(*argv), dead) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "did not answer" in lines[0] and "Traceback" not in captured.err


def test_cli_process_against_a_dead_redis_prints_no_traceback():
    code = ("import sys; from ops.commands.keys import run; from ops.core.settings import Settings; "
            "from tests.test_api_keys import parse; sys.exit(run(parse('list'), Settings()))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "BRIGADE_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"})
    assert done.returncode == 1
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_cli_against_a_redis_that_accepts_but_never_answers_times_out_with_one_line(capsys):
    with socket.socket() as silent:  # the kernel completes the handshake; nobody ever replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hung = Settings(redis_url=f"redis://127.0.0.1:{silent.getsockname()[1]}/0")
        assert run(parse("list"), hung) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "did not answer" in lines[0] and "Timeout" in lines[0]
