"""The one place Brigade builds Redis clients: decoding, retries and timeouts are decided here.

- Decoding: every client decodes replies to str (decode_responses=True). Brigade stores no
  binary value in Redis (events and records are JSON, cache vectors are base64 text), so no
  caller ever sees bytes and none needs a bytes-or-str helper.
- Retries: a command whose connection breaks is sent again, three times, 50 ms to 0.5 s apart
  (redis-py's Retry with ExponentialBackoff): after a Redis restart every pooled connection is
  dead, and without this the first command on each fails a request. Timeouts are not retried:
  a stuck Redis would only make callers wait three times as long.
- Timeouts: COMMAND_TIMEOUT_S unless a caller says otherwise (the cache's shorter one, a
  subscriber that idles between events, a follower whose XREAD blocks).
- Outages: a caller that cannot do without Redis waits it out with `outage_retry` (for ever,
  0.25 s doubling to a cap), redis-py's Retry again, around its own command or reconnection.
- Sentinel: a `redis+sentinel://` URL (ops/core/redis_address.py) gives a client of the primary
  that the sentinels name. redis-py asks them again when a connection breaks, and turns a READONLY
  reply (a demoted primary still answering) into a ConnectionError, which the retries above send
  to the new primary: a failover costs callers a retried command, not a restart.
- TLS: a rediss:// or rediss+sentinel:// URL carries its TLS options (ops/core/redis_address.py),
  the settings' BRIGADE_REDIS_TLS_* already in it; a file it names that is not there is said when
  the client is built, naming the setting, instead of as "No such file" at the first command.
- Pools: the gateway's async clients use a blocking pool. redis-py's default async pool raises
  MaxConnectionsError once 100 commands are in flight (seen in the soak with 200 clients); a
  blocking pool makes the 101st command wait for a connection instead, bounded by `wait_s`, so
  a burst slows down rather than failing requests.
"""
from __future__ import annotations

import time

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError, RedisError
from redis.retry import Retry

from ops.core.redis_address import SentinelAddress, is_sentinel, parse_sentinel, tls_options

POOL_SIZE = 100
COMMAND_TIMEOUT_S = 5.0  # a stuck Redis must not freeze a caller (the engine thread inside a publish)
CONNECT_TIMEOUT_S = 2.0
CACHE_TIMEOUT_S = 2.0  # the answer cache is optional: a slow one must not hold up answers
RETRIES = 3


def backoff() -> ExponentialBackoff:
    """The pause between two tries of a command: 50 ms, doubling, at most 0.5 s."""
    return ExponentialBackoff(cap=0.5, base=0.05)


def _outage_backoff(cap_s: float, first_s: float) -> ExponentialBackoff:
    return ExponentialBackoff(cap=cap_s, base=first_s / 2)  # it waits base * 2 ** failures


def outage_retry(cap_s: float = 2.0, first_s: float = 0.25) -> Retry:
    """Tries a call until it succeeds, whatever the Redis error: first_s after the first failure,
    doubling up to cap_s. Stop it by raising from the `fail` callback of call_with_retry."""
    return Retry(_outage_backoff(cap_s, first_s), -1, supported_errors=(RedisError,))


def async_outage_retry(cap_s: float = 2.0, first_s: float = 0.25,
                       errors: tuple[type[Exception], ...] = (RedisError,)) -> AsyncRetry:
    """outage_retry for asyncio callers (the pause is asyncio.sleep); `errors` are what an outage
    raises in the call (a caller that also reaches Redis through another layer adds OSError)."""
    return AsyncRetry(_outage_backoff(cap_s, first_s), -1, supported_errors=errors)


async def through_failover(call, budget_s: float, errors: tuple[type[Exception], ...] = (RedisError,)):
    """`await call()`, tried again while a Sentinel failover leaves no primary (about 2-3 s with
    down-after 1 s), for at most `budget_s`; then its error stands. budget_s 0: one try."""
    if budget_s <= 0:
        return await call()
    deadline = time.monotonic() + budget_s

    async def past_budget(error: Exception) -> None:
        if time.monotonic() >= deadline:
            raise error

    return await async_outage_retry(cap_s=1.0, first_s=0.1, errors=errors).call_with_retry(call, past_budget)


def outage_pause_s(failures: int, cap_s: float = 2.0, first_s: float = 0.25) -> float:
    """The pause an outage retry with these bounds takes after `failures` failures in a row (for logs)."""
    return _outage_backoff(cap_s, first_s).compute(failures)


# What a failed TLS handshake says (the ssl module's words, inside redis-py's), and what to set.
TLS_HINTS = (
    (("Hostname mismatch", "IP address mismatch"), "Redis's certificate does not name the host in the URL: connect "
     "by a name it lists, or set BRIGADE_REDIS_TLS_CHECK_HOSTNAME=false"),
    (("CERTIFICATE_VERIFY_FAILED",), "Redis's certificate is not signed by a CA this client trusts: set "
     "BRIGADE_REDIS_TLS_CA_FILE to the PEM file of the CA that signed it"),
    (("EOF occurred in violation of protocol", "TLSV13_ALERT_CERTIFICATE_REQUIRED"), "Redis ended the TLS "
     "handshake: if it asks clients for a certificate (tls-auth-clients), set BRIGADE_REDIS_TLS_CERT_FILE and "
     "BRIGADE_REDIS_TLS_KEY_FILE"),
)


def one_line(exc: Exception) -> str:
    """A Redis error for a message: redis-py's "No master found for 'm' : <client repr>" loses
    the repr (hundreds of characters of pool settings); a failed TLS handshake says what to set."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = text.split(" : <", 1)[0]
    hint = next((hint for marks, hint in TLS_HINTS if any(mark in text for mark in marks)), None)
    return f"{text} ({hint}; docs/operations.md, \"Redis over TLS\")" if hint else text


def _sentinel_kwargs(address: SentinelAddress, connect_timeout_s: float, retry) -> dict:
    # A sentinel that is down must not hold up the search for the primary among the others: one
    # try each (redis-py's default retried each with a backoff of seconds, and the client's own
    # retry around the search multiplied it: 16 s before `brigade status` could say that no
    # sentinel answers). The client's retry and the failover budget try the search again.
    return {"socket_timeout": connect_timeout_s, "socket_connect_timeout": connect_timeout_s, "retry": retry,
            **address.sentinel_kwargs()}


def client(url: str, timeout_s: float | None = COMMAND_TIMEOUT_S,
           connect_timeout_s: float = CONNECT_TIMEOUT_S) -> redis.Redis:
    """A synchronous client (workers, the reaper, commands)."""
    tls_options(url)  # a TLS file that is not there: said now, naming its setting
    options = dict(decode_responses=True, socket_timeout=timeout_s, socket_connect_timeout=connect_timeout_s,
                   retry=Retry(backoff(), RETRIES, supported_errors=(ConnectionError,)))
    if is_sentinel(url):
        address = parse_sentinel(url)
        watch = redis.sentinel.Sentinel(list(address.sentinels),
                                        sentinel_kwargs=_sentinel_kwargs(address, connect_timeout_s, Retry(NoBackoff(), 0)))
        return watch.master_for(address.master, redis_class=redis.Redis, **options, **address.node_kwargs())
    return redis.Redis.from_url(url, **options)


class _BlockingSentinelPool(aiosentinel.SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """Sentinel's pool of primary connections, waiting for a free connection as the blocking pool
    does (the module's docstring says why) instead of raising at POOL_SIZE."""


def async_client(url: str, timeout_s: float | None = COMMAND_TIMEOUT_S, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 wait_s: float = 5.0, health_check_interval: int = 0) -> aioredis.Redis:
    """A pooled asyncio client (the gateway, the answer cache, async commands)."""
    tls_options(url)  # a TLS file that is not there: said now, naming its setting
    options = dict(max_connections=POOL_SIZE, timeout=wait_s, decode_responses=True, socket_timeout=timeout_s,
                   socket_connect_timeout=connect_timeout_s, health_check_interval=health_check_interval,
                   retry=AsyncRetry(backoff(), RETRIES, supported_errors=(ConnectionError,)))
    if is_sentinel(url):
        address = parse_sentinel(url)
        watch = aiosentinel.Sentinel(list(address.sentinels),
                                     sentinel_kwargs=_sentinel_kwargs(address, connect_timeout_s, AsyncRetry(NoBackoff(), 0)))
        return watch.master_for(address.master, redis_class=aioredis.Redis, connection_pool_class=_BlockingSentinelPool,
                                **options, **address.node_kwargs())
    return aioredis.Redis(connection_pool=aioredis.BlockingConnectionPool.from_url(url, **options))
