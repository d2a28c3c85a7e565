# Over 400 lines: one module-scoped real stack that every command's connection options are tried against.
"""One CLI convention, and no secret printed, on real processes.

Every command that talks to a service takes its connection options (--url, --api-key, --redis-url)
after its deepest subcommand, or from the environment, run as a user runs it (`python -m ops.commands.cli`
in a subprocess) against a real redis-server, a real gateway with keys required and a real worker
(the tiny model: these tests are about the command line, not the answers). The CLI's own defaults
point where nothing listens, so a command that ignored an option would fail. Misplaced, unknown
and malformed arguments, dead and password-protected services, and wrong keys never show a key or
a password, and still say what went wrong.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import re
import subprocess
import sys
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ops.commands.cli import build_parser
from ops.commands.cli_options import report_failure
from ops.core.logs import RedactingFormatter
from ops.core.redaction import redact
from ops.stack.stack import with_env
from tests.services import RedisServer, Stack, create_key, free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
# Secrets that look real: a Brigade key that no store holds, another server's key, a password.
KEY = "brg_0123abcd_" + "S3cr3tS3cr3tS3cr3tS3cr3tS3cr3tXy"
OTHER = "sk-other-server-s3cr3t"
PW = "hunter2-p4ssw0rd"
SECRETS = (KEY, KEY.split("_", 2)[2], OTHER, PW)


def client_env(**extra: str | None) -> dict:
    """A user's shell without Brigade's variables, whose defaults point at ports where nothing
    listens: a command that ignored its options would fail instead of finding a service."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BRIGADE_")}
    env.update(BRIGADE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", BRIGADE_GATEWAY_PORT=str(free_port()),
               PYTHONUNBUFFERED="1")
    return with_env(env, extra)


def brigade(*argv: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.commands.cli", *argv], cwd=ROOT, env=env or client_env(),
                          capture_output=True, text=True, timeout=timeout)


def run_all(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """Each case's command, four at a time: they are independent, and most of each is Python starting."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        running = {name: pool.submit(brigade, *argv) for name, argv in cases.items()}
        return {name: future.result() for name, future in running.items()}


def batch_lines(n: int) -> str:
    return "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": "smollm2-135m-instruct", "max_tokens": 2, "temperature": 0,
                                        "messages": [{"role": "user", "content": f"Say {i}"}]}}) + "\n"
                   for i in range(n))


class CliStack(Stack):
    key: str  # a real key of the gateway, which requires one
    job: str  # a batch job already completed
    files: Path

    @property
    def redis_url(self) -> str:
        return self.redis.url

    @property
    def ws(self) -> str:
        return self.url

    @property
    def gateway_log(self) -> Path:
        return self.gateway.log_path

    def fill(self, argv: list[str]) -> list[str]:
        values = {"redis": self.redis_url, "http": self.http, "ws": self.ws, "key": self.key, "job": self.job,
                  "files": str(self.files)}
        return [a.format(**values) for a in argv]


def _finish_a_job(http: str, key: str) -> str:
    """A job run to its end through the HTTP API, not the CLI under test."""
    with httpx.Client(base_url=http, headers={"Authorization": f"Bearer {key}"}, timeout=30) as c:
        uploaded = c.post("/v1/files", files={"file": ("in.jsonl", batch_lines(2).encode(), "application/jsonl")},
                          data={"purpose": "batch"}).json()
        job = c.post("/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions",
                                          "completion_window": "24h"}).json()
        wait_until(lambda: c.get(f"/v1/batches/{job['id']}").json()["status"] == "completed", 120, interval=0.2,
                   what="the batch job to complete")
    return job["id"]


@pytest.fixture(scope="module")
def stack(redis_server, tiny_model_dir, tmp_path_factory):
    files = tmp_path_factory.mktemp("cli-files")
    (files / "in.jsonl").write_text(batch_lines(2))
    (files / "questions.jsonl").write_text(json.dumps({"question": "Say hi", "max_tokens": 2}) + "\n")
    with CliStack(redis_server, files, BRIGADE_AUTH="required", BRIGADE_CACHE_ENABLED="0",
                  BRIGADE_MODEL=str(tiny_model_dir), BRIGADE_TORCH_THREADS="1", BRIGADE_DTYPE="float32",
                  BRIGADE_MAX_WAIT_MS="0", BRIGADE_BATCH_POLL_S="0.2", BRIGADE_API_KEY=None,
                  BRIGADE_BATCH_FILES_DIR=str(files / "batches")) as s:
        s.start_worker("w@cli")
        s.start_gateway()
        s.wait_ready()
        s.key = create_key(redis_server.url, "cli-keys")
        s.job, s.files = _finish_a_job(s.http, s.key), files
        yield s


def assert_outcome(done: subprocess.CompletedProcess, code: int, pattern: str) -> None:
    out = done.stdout + done.stderr
    assert done.returncode == code, out
    assert re.search(pattern, out), out


# ---- every service command, its options after the (deepest) subcommand ------------------------

# (argv, exit code, what its output shows), {placeholders} from the stack. Each outcome needs the
# service its options name: without them the command would meet the dead defaults of client_env.
AFTER_THE_SUBCOMMAND = {
    "chat": (["chat", "Say hi", "--max-tokens", "2", "--no-cache", "--url", "{ws}", "--api-key", "{key}"],
             0, r"not cached"),
    "batch submit": (["batch", "submit", "{files}/in.jsonl", "--wait", "--output", "{files}/submitted.jsonl",
                      "--url", "{http}", "--api-key", "{key}"], 0, r"completed, 2 completed"),
    "batch status": (["batch", "status", "{job}", "--json", "--url", "{http}", "--api-key", "{key}"],
                     0, r'"status": "completed"'),
    "batch list": (["batch", "list", "--url", "{http}", "--api-key", "{key}"], 0, r"{job}: completed"),
    "batch results": (["batch", "results", "{job}", "--url", "{http}", "--api-key", "{key}"],
                      0, r'"custom_id": ?"line-1"'),
    "batch cancel": (["batch", "cancel", "batch_nosuchjob", "--url", "{http}", "--api-key", "{key}"], 2, r"404"),
    "keys create": (["keys", "create", "--name", "made-by-cli", "--redis-url", "{redis}"], 0, r"brg_[0-9a-f]{{8}}_"),
    "keys list": (["keys", "list", "--redis-url", "{redis}"], 0, r"cli-keys-"),
    "keys usage": (["keys", "usage", "--json", "--redis-url", "{redis}"], 0, r'"name": "cli-keys-'),
    "keys revoke": (["keys", "revoke", "00000000", "--redis-url", "{redis}"], 1, r"no API key 00000000"),
    "cache stats": (["cache", "stats", "--redis-url", "{redis}"], 0, r'"entries": \d+'),
    "cache clear": (["cache", "clear", "--redis-url", "{redis}"], 0, r'"removed": \d+'),
    "cache forget": (["cache", "forget", "no-such-entry", "--redis-url", "{redis}"], 1, r'"no-such-entry": false'),
    "cache warm": (["cache", "warm", "{files}/questions.jsonl", "--url", "{ws}", "--api-key", "{key}"],
                   0, r'"answered": 1'),
    "status": (["status", "--json", "--redis-url", "{redis}"], 0, r'"worker": "w@cli"'),
    "dlq list": (["dlq", "list", "--redis-url", "{redis}"], 0, r"0 dead letter\(s\)"),
    "dlq drop": (["dlq", "drop", "no-such-request", "--redis-url", "{redis}"], 1,
                 r"drop no-such-request: not in the dead-letter list"),
    "bench doors": (["bench", "doors", "--rounds", "1", "--max-tokens", "2", "--url", "{http}", "--api-key", "{key}"],
                    0, r'"http_sse": \{{\s*"ttft_p50_s"'),
    # This stack's cache is off, so nothing is stored: the fill's wait would last its whole 60 s.
    "bench cache-replay": (["bench", "cache-replay", "--limit", "1", "--max-tokens", "2", "--store-timeout", "1",
                            "--url", "{http}", "--api-key", "{key}"], 0, r'"requests": 1,'),
    # bench serve's own --redis-url (count its commands) rides along.
    "bench serve": (["bench", "serve", "--num-requests", "2", "--max-tokens", "2", "--url", "{http}",
                     "--api-key", "{key}", "--redis-url", "{redis}"], 0, r'"completed": 2'),
    # Where `batch` always took them, and now `keys` too: before the subcommand.
    "batch, before the subcommand": (["batch", "--url", "{http}", "--api-key", "{key}", "list"], 0, r"{job}"),
    "keys, before the subcommand": (["keys", "--redis-url", "{redis}", "list"], 0, r"cli-keys-"),
    "batch, after wins over before": (["batch", "--url", "http://127.0.0.1:9", "status", "{job}", "--url", "{http}",
                                       "--api-key", "{key}"], 0, r"{job}: completed"),
}


@pytest.fixture(scope="module")
def after_the_subcommand(stack) -> dict[str, subprocess.CompletedProcess]:
    return run_all({name: stack.fill(argv) for name, (argv, _, _) in AFTER_THE_SUBCOMMAND.items()})


@pytest.mark.parametrize("case", list(AFTER_THE_SUBCOMMAND), ids=list(AFTER_THE_SUBCOMMAND))
def test_every_service_command_takes_its_connection_options_after_the_subcommand(stack, after_the_subcommand, case):
    _, code, pattern = AFTER_THE_SUBCOMMAND[case]
    done = after_the_subcommand[case]
    assert_outcome(done, code, stack.fill([pattern])[0])
    if case == "batch submit":  # the brief's example: the results land where --output says
        lines = [json.loads(x) for x in (stack.files / "submitted.jsonl").read_text().splitlines()]
        assert sorted(x["custom_id"] for x in lines) == ["line-0", "line-1"]


def test_without_the_options_the_dead_defaults_fail(stack):
    """The control for the test above: the environment of these tests finds no service by itself."""
    assert_outcome(brigade("keys", "list"), 1, r"did not answer")
    assert_outcome(brigade("status"), 1, r"does not answer")
    assert_outcome(brigade("batch", "list", "--url", stack.http), 1, r"401")  # keys are required


def test_the_environment_gives_each_option_when_the_flag_is_absent(stack):
    env = client_env(BRIGADE_REDIS_URL=stack.redis_url, BRIGADE_GATEWAY_PORT=str(stack.port), BRIGADE_API_KEY=stack.key)
    assert_outcome(brigade("keys", "list", env=env), 0, r"cli-keys-")
    assert_outcome(brigade("status", env=env), 0, r"workers: 1 alive")
    assert_outcome(brigade("batch", "list", env=env), 0, re.escape(stack.job))
    assert_outcome(brigade("chat", "Say hi", "--max-tokens", "2", "--no-cache", env=env), 0, r"not cached")
    # The cache's commands read the cache's Redis, which falls back on BRIGADE_REDIS_URL.
    cache_only = client_env(BRIGADE_CACHE_REDIS_URL=stack.redis_url)
    assert_outcome(brigade("cache", "stats", env=cache_only), 0, r'"entries"')
    assert_outcome(brigade("keys", "list", env=cache_only), 1, r"did not answer")


# ---- no secret printed -------------------------------------------------------------------------

def assert_no_secret(done: subprocess.CompletedProcess, *logs: Path) -> None:
    for secret in SECRETS:
        for name, text in [("stdout", done.stdout), ("stderr", done.stderr),
                           *[(str(p), p.read_text(errors="replace")) for p in logs]]:
            assert secret not in text, f"{secret!r} in {name}:\n{text}"


DEAD = free_port()
PW_DEAD_REDIS = f"redis://:{PW}@127.0.0.1:{DEAD}/0"

# (argv, exit code, the useful message): argparse's own errors, then services that do not answer.
NEVER_SHOWN = {
    "key before the command": (["--api-key", KEY, "batch", "submit", "in.jsonl", "--wait"], 2,
                               r"invalid choice: '\*\*\*'.*\n.*go after the subcommand"),
    "unknown option beside a key": (["batch", "submit", "in.jsonl", "--wait", "--output", "out.jsonl", "--api-key",
                                     KEY, "--wiat"], 2, r"unrecognized arguments: --wiat"),
    "key on a command without one": (["keys", "list", "--api-key", KEY], 2,
                                     r"unrecognized arguments: --api-key \*\*\*\n.*go after the subcommand"),
    "another server's key, --opt=value": (["keys", "list", f"--api-key={OTHER}"], 2,
                                          r"unrecognized arguments: --api-key=\*\*\*"),
    "abbreviated option": (["keys", "list", "--api", OTHER], 2, r"unrecognized arguments: --api \*\*\*"),
    "key as a bad number": (["chat", "hi", "--max-tokens", KEY], 2, r"invalid int value: 'brg_0123abcd_\*\*\*'"),
    "bad value beside a key": (["chat", "hi", "--temperature", "warm", "--api-key", OTHER], 2,
                               r"invalid float value: 'warm'"),
    "key before a bench target": (["bench", "--api-key", "serve", KEY], 2,
                                  r"unrecognized arguments: --api-key \*\*\*\n.*go after the subcommand"),
    "key on a bench target without one": (["bench", "engine", "--n", "1", "--api-key", KEY], 2,
                                          r"unrecognized arguments: --api-key \*\*\*\n.*go after the subcommand"),
    "key as a bench target": (["bench", KEY], 2, r"argument target: invalid choice: 'brg_0123abcd_\*\*\*'"),
    "key missing its value": (["batch", "submit", "in.jsonl", "--api-key"], 2,
                              r"argument --api-key: expected one argument"),
    "password URL before the command": (["--redis-url", PW_DEAD_REDIS, "status"], 2,
                                        r"invalid choice: 'redis://:\*\*\*@127.0.0.1"),
    "status, dead password Redis": (["status", "--redis-url", PW_DEAD_REDIS], 1,
                                    r"Redis at redis://:\*\*\*@127.0.0.1:\d+/0 does not answer"),
    "cache stats, dead password Redis": (["cache", "stats", "--redis-url", PW_DEAD_REDIS], 1,
                                         r"brigade cache stats: Redis does not answer"),
    "dlq, dead password Redis": (["dlq", "list", "--redis-url", PW_DEAD_REDIS], 1, r"brigade dlq: Redis does not"),
    "keys revoke of a whole key, dead Redis": (["keys", "revoke", KEY, "--redis-url", PW_DEAD_REDIS], 1,
                                               r"did not answer"),
    "chat, password in the gateway URL": (["chat", "hi", "--url", f"ws://me:{PW}@127.0.0.1:{DEAD}/v1/ws",
                                           "--api-key", KEY], 1, r"cannot reach the gateway at ws://me:\*\*\*@"),
    "batch, password in the gateway URL": (["batch", "list", "--url", f"http://me:{PW}@127.0.0.1:{DEAD}",
                                            "--api-key", KEY], 3, r"the gateway at http://me:\*\*\*@.* does not"),
    "bench serve, everything secret": (["bench", "serve", "--url", f"http://me:{PW}@127.0.0.1:{DEAD}", "--api-key",
                                        OTHER, "--redis-url", PW_DEAD_REDIS, "--num-requests", "1"], 2,
                                       r"does not answer"),
}


@pytest.fixture(scope="module")
def never_shown() -> dict[str, subprocess.CompletedProcess]:
    return run_all({name: argv for name, (argv, _, _) in NEVER_SHOWN.items()})


@pytest.mark.parametrize("case", list(NEVER_SHOWN), ids=list(NEVER_SHOWN))
def test_errors_never_show_a_key_or_a_password(never_shown, case):
    _, code, pattern = NEVER_SHOWN[case]
    done = never_shown[case]
    assert_no_secret(done)
    assert_outcome(done, code, pattern)


def test_a_wrong_key_is_refused_without_being_shown_by_the_cli_or_the_gateway(stack):
    wrong_key = brigade("batch", "list", "--url", stack.http, "--api-key", KEY)
    assert_outcome(wrong_key, 1, r"401 invalid API key")
    chat = brigade("chat", "hi", "--url", stack.ws, "--api-key", KEY)
    assert_outcome(chat, 1, r"error unauthorized: invalid API key")
    revoke = brigade("keys", "revoke", KEY, "--redis-url", stack.redis_url)
    assert_outcome(revoke, 1, r"no API key 0123abcd")
    for done in (wrong_key, chat, revoke):
        assert_no_secret(done, stack.gateway_log)


def test_a_redis_password_works_in_the_url_and_a_wrong_one_is_never_shown(tmp_path):
    server = RedisServer(tmp_path)
    server.client.config_set("requirepass", PW)
    try:
        assert_outcome(brigade("keys", "list", "--redis-url", f"redis://:{PW}@127.0.0.1:{server.port}/0"),
                       0, r"0 key\(s\)")
        wrong = f"redis://:{OTHER}@127.0.0.1:{server.port}/0"
        for argv, pattern in [(["keys", "list"], r"invalid username-password pair"),
                              (["status"], r"does not answer \(.*password"),
                              (["cache", "stats"], r"Redis refused the credentials in its URL"),
                              (["dlq", "list"], r"Redis refused the credentials in its URL")]:
            done = brigade(*argv, "--redis-url", wrong)
            assert_no_secret(done)
            assert_outcome(done, 1, pattern)
    finally:
        server.stop()


# ---- bench <target>: each target its own flags ------------------------------------------------

def bench_targets() -> dict[str, argparse.ArgumentParser]:
    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    return subcommands(subcommands(build_parser())["bench"])


def flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def test_each_bench_target_takes_its_own_flags_and_refuses_the_others():
    targets = bench_targets()
    assert sorted(targets) == ["cache", "cache-replay", "chaos", "doors", "engine", "guards", "guided", "quality",
                               "rerank", "scale", "serve", "soak", "vetoes"]
    assert {"--n", "--compare", "--full", "--peer"} <= flags(targets["engine"])
    assert {"--clients", "--seconds", "--kill-every", "--kill-redis-primary"} <= flags(targets["soak"])
    assert {"--clients", "--sse-clients", "--batch-lines", "--kill-worker-every", "--kill-redis-primary",
            "--kill-gateway", "--cut-seconds", "--model"} <= flags(targets["chaos"])
    assert {"--libraries", "--repeats", "--threads"} <= flags(targets["guided"])
    assert {"--rate", "--slo", "--backend"} <= flags(targets["serve"]) & flags(targets["scale"])
    assert not {"--clients", "--rate", "--pairs", "--dtype"} & flags(targets["engine"])
    # Only the targets that talk to a running gateway take its connection options.
    assert [name for name, p in sorted(targets.items()) if "--api-key" in flags(p)] == ["cache", "cache-replay",
                                                                                       "doors", "serve"]
    assert all("--json" in flags(p) for p in targets.values())
    # Each target's --max-tokens default is its own, said in its help.
    defaults = {name: targets[name].parse_args([]).max_tokens for name in ("engine", "quality", "soak", "chaos",
                                                                            "doors", "serve", "scale", "cache-replay")}
    assert defaults == {"engine": 128, "quality": 32, "soak": 16, "chaos": 16, "doors": 16, "serve": None,
                        "scale": None, "cache-replay": 48}
    for argv in (["bench", "soak", "--n", "1"], ["bench", "engine", "--clients", "3"], ["bench", "doors", "--rate", "1"]):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(argv)
        assert exited.value.code == 2, argv


DOCUMENTED = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "Makefile")
# A mention runs to the end of its code span, table cell or line; `\|` is an alternative in a table.
BENCH_MENTION = re.compile(r"brigade bench ([a-z][a-z-]*)((?:\\\||[^`|\n])*)")


def test_every_documented_bench_command_line_still_parses():
    mentions = [(path.name, m.group(1), m.group(2).strip().rstrip("\\").strip())
                for path in DOCUMENTED for m in BENCH_MENTION.finditer(path.read_text())]
    assert len(mentions) >= 20, mentions  # docs/commands.md's table, the other docs' runs, the Makefile's
    targets = bench_targets()
    parsed = 0
    for where, target, rest in mentions:
        assert target in targets, (where, target)
        named = set(re.findall(r"--[a-z][\w-]*", rest))
        assert named <= flags(targets[target]), (where, target, rest, named - flags(targets[target]))
        words = rest.split()
        # A concrete command line (no [optional] placeholders, no shell variables) parses as written.
        if words and words[0].startswith("--") and not re.search(r"[\[\]$<]", rest):
            args = build_parser().parse_args(["bench", target, *words])
            assert args.target == target
            parsed += 1
    assert parsed >= 6


# ---- the redaction itself ----------------------------------------------------------------------

def test_redaction_keeps_what_a_message_needs():
    assert redact("Redis at redis://:pw@h:6379/0 and rediss://user:p@ss@h2/1") == \
        "Redis at redis://:***@h:6379/0 and rediss://user:***@h2/1"
    assert redact("redis://h:6379/0?password=pw&db=1") == "redis://h:6379/0?password=***&db=1"
    assert redact(f"key {KEY} refused") == "key brg_0123abcd_*** refused"  # the id names it, harmlessly
    assert redact("brg_0123 (expected brg_ID_SECRET)") == "brg_*** (expected brg_ID_SECRET)"
    assert redact("Authorization: Bearer sk-abc, --api-key=sk-def, --api-key sk-ghi") == \
        "Authorization: Bearer ***, --api-key=***, --api-key ***"
    # A value the user typed goes as a whole word, and only as one.
    assert redact("invalid choice: 'ab' (choose from 'tab', 'abc')", ["ab"]) == \
        "invalid choice: '***' (choose from 'tab', 'abc')"
    assert redact("http://127.0.0.1:8765/v1 and redis://127.0.0.1:6379/0") == \
        "http://127.0.0.1:8765/v1 and redis://127.0.0.1:6379/0"


def test_log_lines_and_their_tracebacks_are_redacted():
    try:
        raise ConnectionError(f"cannot use {PW_DEAD_REDIS}")
    except ConnectionError:
        record = logging.LogRecord("brigade", logging.ERROR, __file__, 1, "event=failed key=%s", (KEY,),
                                   sys.exc_info())
    line = RedactingFormatter("%(message)s").format(record)
    assert "event=failed key=brg_0123abcd_***" in line and "redis://:***@127.0.0.1" in line
    assert "Traceback" in line and PW not in line and KEY not in line


def test_a_bug_in_a_command_prints_its_traceback_redacted(capsys):
    def command():
        raise RuntimeError(f"could not use {PW_DEAD_REDIS} with {KEY}")

    try:
        command()
    except RuntimeError as exc:
        assert report_failure(Namespace(command="status"), exc) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "in command" in err and "RuntimeError: could not use redis://:***@" in err
    assert PW not in err and KEY not in err
