"""`brigade up`: Redis (when none answers), the workers, the gateway and a reaper (and Flower) on
one machine, stopped in order on Ctrl-C, SIGTERM, SIGHUP or SIGPIPE, and killed with `up` itself.

Each part is a child process of one Stack (ops/stack/stack.py: `python -m ops.commands.cli PART`)
that reads its settings from its environment: `up`'s own, with the redis+sentinel:// URL of
`--redis-ha`'s set when it started one.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
from urllib.parse import urlparse

from ops.core.redaction import redact_url
from ops.core.redis_address import is_sentinel, is_tls
from ops.core.settings import Settings


def redis_answers(url: str) -> bool:
    import redis

    from ops.core import redis_clients

    try:
        return bool(redis_clients.client(url, connect_timeout_s=1).ping())
    except redis.RedisError:
        return False


def cmd_up(args, settings: Settings) -> int:
    from ops.core.ports import CannotListen, ensure_free
    from ops.stack.stack import Stack
    from ops.stack.supervision import say, stop_graces, stop_when_signalled

    if args.workers < 1:
        print("brigade up: --workers must be at least 1", file=sys.stderr)
        return 2
    # Before anything starts: on a taken port (a second `brigade up`), the gateway could only
    # fail, after a worker had joined the shared queue for nothing.
    try:
        ensure_free(settings.gateway_host, settings.gateway_port)
        if args.flower:
            ensure_free(settings.flower_host, settings.flower_port, "BRIGADE_FLOWER_PORT")
    except CannotListen as exc:
        print(exc, file=sys.stderr)
        return 1
    stopping = stop_when_signalled()
    stack = Stack(grace_s=stop_graces(settings))
    supervisor = stack.supervisor  # Redis, the HA set and the watch are its parts too
    ha = None
    if args.redis_ha:
        ha = _start_redis_ha(supervisor, settings, stopping)
        if ha is None:
            supervisor.stop()
            return 1
        settings = settings.model_copy(update={"redis_url": ha.url})
        stack.env = {**os.environ, "BRIGADE_REDIS_URL": ha.url}  # every part started after the set runs on it
    elif not redis_answers(settings.redis_url):
        failed = _start_local_redis(args, supervisor, settings, stopping)
        if failed is not None:
            return failed
    problem = _up_models_step(args.model, settings)
    if problem is not None:
        supervisor.stop()
        print(f"brigade up: {problem}", file=sys.stderr)
        return 1
    for name, (part, part_args) in _parts(args).items():
        stack.start(part, name, part_args)
    say(f"Brigade is starting: the chat page at {settings.http_url}/, the OpenAI API at {settings.http_url}/v1, "
        f"the WebSocket at {settings.ws_url} (readiness: {settings.http_url}/readyz); Ctrl-C stops everything",
        sys.stdout)
    status = 0
    try:
        while (ended := supervisor.watch(stopping)) is not None:
            if ha is not None and ended[0].startswith("redis-"):
                _rejoin_redis_node(supervisor, ha, ended, stopping)
                continue
            say(f"brigade {ended[0]} exited (code {ended[1]}); stopping the rest")
            status = 1
            break
    finally:
        supervisor.stop(announce=say)
    return status


def _parts(args) -> dict[str, tuple[str, list[str]]]:
    """Each part's name, and the part with its arguments. Should `up` die without stopping its parts
    (SIGKILL), the kernel kills them outright: a drain needs the order and a Redis, which is going at
    the same moment; what they held is recovered from Redis at the next start (the reaper moves the
    dead workers' requests)."""
    parts = {"gateway": ("gateway", []), "reaper": ("reaper", [])}
    host = socket.gethostname()
    model = ["--model", args.model] if args.model else []
    for i in range(1, args.workers + 1):
        parts["worker" if args.workers == 1 else f"worker-{i}"] = ("worker", [*model] if args.workers == 1 else [
            *model, "--name", f"brigade-{os.getpid()}-{i}@{host}"])
    if args.flower:
        parts["flower"] = ("flower", [])
    return parts


def _start_local_redis(args, supervisor, settings: Settings, stopping) -> int | None:
    """A redis-server on the settings' local address, when none answers there; the exit status
    of `up` when it cannot (or `up` was stopped meanwhile), else None."""
    from ops.stack.stack import redis_command
    from ops.stack.supervision import FolderInUse, PartExited, hold_folder

    if is_sentinel(settings.redis_url):
        print(f"Redis at {redact_url(settings.redis_url)} does not answer: start its sentinels and nodes, "
              "or try failover on this machine with `brigade up --redis-ha`", file=sys.stderr)
        return 1
    if is_tls(settings.redis_url):
        # `up` starts Redis without TLS: on this port it would be a second server, or one that the
        # parts, speaking TLS, could not talk to. A TLS Redis that does not answer is the operator's.
        print(f"Redis at {redact_url(settings.redis_url)} does not answer over TLS: start it, or check "
              "BRIGADE_REDIS_TLS_* (`brigade status` says why; docs/operations.md, \"Redis over TLS\")", file=sys.stderr)
        return 1
    url = urlparse(settings.redis_url)
    if url.hostname not in ("127.0.0.1", "localhost", "::1"):
        print(f"Redis at {redact_url(settings.redis_url)} does not answer, and it is not local to start", file=sys.stderr)
        return 1
    server = shutil.which("redis-server")
    if server is None:
        print("redis-server is not installed: sudo apt-get install -y redis-server", file=sys.stderr)
        return 1
    bind = "127.0.0.1" if url.hostname == "localhost" else url.hostname
    # Its log goes to a file: Redis repeats on every start warnings about the host (memory
    # overcommit) that a development machine need not act on.
    settings.home.mkdir(parents=True, exist_ok=True)
    redis_log = settings.home / "redis.log"
    data = None
    if not args.ephemeral:
        # An append-only file: keys, cached answers, batch jobs and dead letters outlive a restart
        # and a crash, losing at most the last second.
        data = settings.data_dir.expanduser() / "redis"
        data.mkdir(parents=True, exist_ok=True)
        try:
            hold_folder(data)
        except FolderInUse:
            print(f"{data} is in use by another `brigade up`'s Redis: stop it, or give this one its own "
                  "BRIGADE_DATA_DIR (or --ephemeral)", file=sys.stderr)
            return 1
    # Redis dies with `up` by SIGTERM, which closes the append-only file cleanly.
    supervisor.start("redis", redis_command(server, url.port or 6379, [bind], data, persistent=data is not None,
                                            log=redis_log), death_signal=signal.SIGTERM)
    # Loading a large append-only file takes a while (Redis answers LOADING until done).
    try:
        if not supervisor.wait_for(lambda: redis_answers(settings.redis_url), 60, stopping=stopping,
                                   interval_s=0.1):
            supervisor.stop()
            return 0
    except (PartExited, TimeoutError):
        supervisor.stop()
        print(f"redis-server did not come up at {redact_url(settings.redis_url)} (its log: {redis_log})", file=sys.stderr)
        return 1
    return None


def _up_models_step(model: str | None, settings: Settings) -> str | None:
    """`brigade up`'s model step, once its Redis answers: on a first start (an empty registry,
    BRIGADE_MODEL unset) the default model is registered, in place, as NAME@v1; then what the
    workers will serve is resolved once here, so that a model that is unknown or not on this machine
    stops `up` with its reason before any part starts. Returns that reason, or None."""
    from engine.model_files import ModelNotFound
    from ops.core import redis_clients
    from ops.rollout.registry import RegistryError
    from ops.rollout.model_store import ModelNotHere, register_default_model, resolve_served
    from ops.stack.supervision import say

    try:
        registered = register_default_model(redis_clients.client(settings.redis_url), settings)
        if registered:
            say(registered, sys.stdout)
        resolve_served(model, settings)
    except (RegistryError, ModelNotHere, ModelNotFound) as exc:
        return str(exc)
    return None


def _start_redis_ha(supervisor, settings, stopping):
    """`up --redis-ha`: a primary, two replicas and three sentinels on free ports (ops/stack/redis_ha.py),
    a trial whose data is not kept between runs; every part started after it gets the
    redis+sentinel:// URL (`ha.url`). Returns the set, or None when it did not come up."""
    from ops.stack.redis_ha import RedisHA
    from ops.stack.supervision import PartExited, say

    folder = settings.home / "redis-ha"
    shutil.rmtree(folder, ignore_errors=True)  # its ports are new every run: old sentinel files would mislead
    ha = RedisHA(folder)
    try:
        if not ha.start(lambda name, argv: supervisor.start(name, argv, death_signal=signal.SIGTERM),
                        lambda ready, timeout_s: supervisor.wait_for(ready, timeout_s, stopping=stopping)):
            return None
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return None
    except (PartExited, TimeoutError):
        print(f"the Redis HA set did not come up (logs in {folder})", file=sys.stderr)
        return None
    primary = ha.primary_port()
    replicas = ", ".join(str(p) for p in ha.data_ports if p != primary)
    say(f"Redis HA: primary port {primary}, replicas {replicas}, sentinels "
        f"{', '.join(str(p) for p in ha.sentinel_ports)} (logs in {folder}); BRIGADE_REDIS_URL={ha.url}", sys.stdout)
    return ha


def _rejoin_redis_node(supervisor, ha, ended: tuple[str, int], stopping) -> None:
    """A node of `up --redis-ha`'s set ended (killed to try a failover, say): the rest serve on.
    A data node is started again once the sentinels name another primary (started at once, the
    old primary would come back as primary with its last second of writes lost, and no failover
    would have happened), as that primary's replica (redis_ha.replica_of). A sentinel is started
    again at once."""
    from ops.stack.redis_ha import replica_of
    from ops.stack.supervision import say

    name, code = ended
    say(f"Redis HA: {name} exited (code {code}); the others serve on", sys.stdout)
    argv = None
    if not name.startswith("redis-sentinel"):
        port = next(p for p in ha.data_ports if ha.node_name(p) == name)
        deadline = time.monotonic() + 30
        while ha.primary_port() in (port, None) and time.monotonic() < deadline and not stopping():
            time.sleep(0.2)
        argv = replica_of(supervisor.parts[name].argv, ha.host, ha.primary_port())
    if not stopping():
        supervisor.restart(name, argv)
        say(f"Redis HA: {name} started again; primary port now {ha.primary_port()}", sys.stdout)
