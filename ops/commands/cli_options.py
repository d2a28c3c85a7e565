"""What every `brigade` command shares: the connection options, and a parser that never prints a secret.

One convention (docs/commands.md, "Connection options"): `--url`, `--api-key` and `--redis-url`, whichever a
command uses, go after its deepest subcommand (`brigade batch submit F --api-key K`); `batch` and
`keys` also take them before their subcommand, where `batch` always took them. Each falls back on
the environment, read through the settings: BRIGADE_API_KEY, BRIGADE_REDIS_URL (the cache's
commands: BRIGADE_CACHE_REDIS_URL, else BRIGADE_REDIS_URL), BRIGADE_GATEWAY_HOST/PORT for the gateway.
"""
from __future__ import annotations

import argparse
import re
import sys
import traceback

from ops.core.redaction import redact, secrets_in_argv
from ops.core.settings import Settings

CONNECTION_OPTIONS = ("--url", "--api-key", "--redis-url")

GATEWAY_HELP = {
    "ws": "the gateway's WebSocket (default ws://BRIGADE_GATEWAY_HOST:BRIGADE_GATEWAY_PORT/v1/ws)",
    "http": "the gateway (default http://BRIGADE_GATEWAY_HOST:BRIGADE_GATEWAY_PORT)",
}
# --redis-url names the setting it stands for: the Redis of the queue and keys, or the cache's.
REDIS_HELP = {
    "redis_url": "the Redis (default $BRIGADE_REDIS_URL, else redis://127.0.0.1:6379/0)",
    "cache_redis_url": "the answer cache's Redis (default $BRIGADE_CACHE_REDIS_URL, else $BRIGADE_REDIS_URL)",
}
_REDIS_DEST = "connect_"  # + the settings field: never clashes with bench serve's own --redis-url

HINT = ("connection options (--url, --api-key, --redis-url) go after the subcommand, and each command takes "
        "the ones it uses: see `brigade COMMAND --help` and \"Connection options\" in docs/commands.md")


class BrigadeParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors name no secret. argparse repeats what it could not place or
    convert ("unrecognized arguments: --api-key brg_...", "invalid choice: 'redis://:pw@...'"); each
    parser redacts the values it was given, and `add_subparsers` makes every subparser one of these."""

    _given: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        # A subparser sees only the arguments after its name, and an error names only those.
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._given, namespace)

    def error(self, message: str):
        message = redact(message, secrets_in_argv(self._given))
        # Say where they go when one is misplaced: before the command (argparse then takes its value
        # for the command's name) or on a command that does not take it (abbreviated, perhaps).
        misplaced = "invalid choice" in message and self._given and _is_connection_option(self._given[0])
        unplaced = message.startswith("unrecognized arguments") and any(
            _is_connection_option(word) for word in re.findall(r"--[\w-]+", message))
        if misplaced or unplaced:
            message += f"\n({HINT})"
        super().error(message)


def _is_connection_option(arg: str) -> bool:
    name = arg.split("=", 1)[0]
    return len(name) > 3 and any(option.startswith(name) for option in CONNECTION_OPTIONS)


def add_connection_options(parser: argparse.ArgumentParser, *, gateway: str | None = None, api_key: bool = False,
                           redis: str | None = None) -> None:
    """The connection options a command uses, each defaulting to its environment variable.

    gateway: "ws" or "http", what --url names; redis: the settings field --redis-url overrides.
    Unset options leave no attribute (SUPPRESS), so that an option given before a subcommand is not
    overwritten by the subcommand's unset default: `resolve_connection` fills the rest."""
    group = parser.add_argument_group("connection (also from the environment; docs/commands.md: Connection options)")
    if gateway:
        group.add_argument("--url", default=argparse.SUPPRESS, help=GATEWAY_HELP[gateway])
    if api_key:
        group.add_argument("--api-key", default=argparse.SUPPRESS, metavar="KEY",
                           help="sent as `Authorization: Bearer KEY` (default $BRIGADE_API_KEY)")
    if redis:
        group.add_argument("--redis-url", dest=_REDIS_DEST + redis, default=argparse.SUPPRESS, metavar="URL",
                           help=REDIS_HELP[redis])


def resolve_connection(args: argparse.Namespace, settings: Settings) -> Settings:
    """Give every command `args.url` and `args.api_key` (flag, else environment, else None); the
    settings returned hold a --redis-url as the setting it stands for, and the command is given them
    (and hands them on: the Celery app that `dlq retry` sends through is built from them)."""
    overrides = {field: value for field in REDIS_HELP if (value := getattr(args, _REDIS_DEST + field, None))}
    if overrides:
        settings = settings.model_copy(update=overrides)
    if not hasattr(args, "url"):
        args.url = None
    if not getattr(args, "api_key", None):
        args.api_key = settings.api_key.get_secret_value() or None
    return settings


def command_name(args: argparse.Namespace) -> str:
    """`keys list`, `batch submit`, `bench cache`, `status`: the command as typed, for messages."""
    sub = getattr(args, f"{args.command}_command", None) or getattr(args, "target", None)
    return f"{args.command} {sub}" if sub else args.command


def report_failure(args: argparse.Namespace, exc: Exception) -> int:
    """A command's uncaught exception, said without a secret (exit 1): Redis or another service that
    does not answer, or a missing file, in one line; anything else (a bug) as its traceback, redacted."""
    import redis

    from ops.core.redis_address import RedisAddressError, RedisTLSError
    from ops.core.redis_clients import one_line

    name = command_name(args)
    if isinstance(exc, RedisTLSError):  # it names the setting to change itself
        print(f"brigade {name}: Redis over TLS: {redact(str(exc))}", file=sys.stderr)
        return 2
    if isinstance(exc, RedisAddressError):
        variable = "BRIGADE_CACHE_REDIS_URL" if args.command == "cache" else "BRIGADE_REDIS_URL"
        print(f"brigade {name}: {variable} (or --redis-url): {redact(str(exc))}", file=sys.stderr)
        return 2
    if isinstance(exc, redis.AuthenticationError):
        print(f"brigade {name}: Redis refused the credentials in its URL ({redact(str(exc))})", file=sys.stderr)
    elif isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        variable = "BRIGADE_CACHE_REDIS_URL" if args.command == "cache" else "BRIGADE_REDIS_URL"
        print(f"brigade {name}: Redis does not answer ({redact(one_line(exc))}); start it (`brigade up`), or give "
              f"--redis-url or set {variable}", file=sys.stderr)
    elif isinstance(exc, OSError):  # a service that does not answer, a file that is not there
        print(f"brigade {name}: {redact(str(exc) or type(exc).__name__)}", file=sys.stderr)
    else:
        print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
    return 1
