"""Where Brigade's Redis is: one URL, for one Redis or for a primary watched by Sentinel.

BRIGADE_REDIS_URL takes redis-py's forms for one Redis (redis://, rediss://, unix://) and a
Sentinel form for a primary with replicas and sentinels that promote a replica when it fails:

    redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?sentinel_password=P]
    rediss+sentinel://...  (TLS to the data nodes and the sentinels; ?ssl_cert_reqs=none etc. as redis-py)

PASSWORD (and USER) are the data nodes' (`requirepass`/ACL), as in redis-py's and kombu's
Sentinel support; sentinels that need a password of their own take `sentinel_password`. One
parse serves redis-py (ops/core/redis_clients.py) and Celery's broker (ops/core/queue.py, through
kombu's `sentinel://` list with the transport options `master_name` and `sentinel_kwargs`), so
every part of Brigade finds the same primary the same way, and finds the new one after a failover.
"""
from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlsplit

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379
TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


class RedisAddressError(ValueError):
    """A Redis URL that cannot be used, said in one line with the form it should take."""


@dataclass(frozen=True)
class SentinelAddress:
    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    sentinel_password: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_options: tuple[tuple[str, str], ...] = ()

    def node_kwargs(self) -> dict:
        """redis-py connection arguments for the primary (and the replicas)."""
        out: dict = {"db": self.db}
        if self.username:
            out["username"] = self.username
        if self.password:
            out["password"] = self.password
        if self.tls:
            out.update(ssl=True, **_tls_kwargs(self.tls_options))
        return out

    def sentinel_kwargs(self) -> dict:
        """redis-py connection arguments for the sentinels themselves."""
        out: dict = {}
        if self.sentinel_password:
            out["password"] = self.sentinel_password
        if self.tls:
            out.update(ssl=True, **_tls_kwargs(self.tls_options))
        return out

    def describe(self) -> str:
        """For messages: no password."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"Sentinel master {self.master!r} (db {self.db}) via {hosts}"


def _tls_kwargs(options: tuple[tuple[str, str], ...]) -> dict:
    out: dict = {}
    for name, value in options:
        if name == "ssl_check_hostname":
            out[name] = value.lower() in ("1", "true", "yes")
        elif name == "ssl_cert_reqs":
            out[name] = value.lower()  # redis-py takes "none", "optional", "required"
        else:
            out[name] = value
    return out


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel(url: str) -> SentinelAddress:
    """The Sentinel form's parts; RedisAddressError says what is wrong and what it should be."""
    form = "redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB], a password before the hosts as in redis://"
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in SENTINEL_SCHEMES:
        raise RedisAddressError(f"not a Sentinel URL (expected {form})")
    # urlsplit cannot read a comma-separated host list as a netloc's port, so the parts are cut by hand
    parts = urlsplit(f"x://{rest}")
    netloc = parts.netloc
    auth, _, hosts = netloc.rpartition("@")
    username = password = None
    if auth:
        user, _, secret = auth.partition(":")  # as redis-py reads redis://USER:PASSWORD@
        username, password = unquote(user) or None, unquote(secret) or None
    sentinels = []
    for item in filter(None, hosts.split(",")):
        if item.endswith("]") or ":" not in item:  # no port: a name, or a bracketed IPv6 address
            host, port = item, str(SENTINEL_PORT)
        else:
            host, _, port = item.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit():
            raise RedisAddressError(f"sentinel {item!r} is not HOST:PORT (expected {form})")
        sentinels.append((host, int(port)))
    if not sentinels:
        raise RedisAddressError(f"no sentinel named (expected {form})")
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path:
        raise RedisAddressError(f"no master name: the URL's path names the primary the sentinels watch (expected {form})")
    if len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise RedisAddressError(f"the path {parts.path!r} should be /MASTER or /MASTER/DB (expected {form})")
    query = dict(parse_qsl(parts.query))
    unknown = set(query) - {"sentinel_password", *TLS_OPTIONS}
    if unknown:
        raise RedisAddressError(f"unknown option(s) {', '.join(sorted(unknown))} (known: sentinel_password, "
                                f"{', '.join(TLS_OPTIONS)})")
    tls = scheme.lower() == "rediss+sentinel"
    return SentinelAddress(
        sentinels=tuple(sentinels), master=path[0], db=int(path[1]) if len(path) == 2 else 0,
        username=username, password=password, sentinel_password=query.get("sentinel_password") or None,
        tls=tls, tls_options=tuple((k, v) for k, v in sorted(query.items()) if k in TLS_OPTIONS))


def _netloc_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def sentinel_url(sentinels: list[tuple[str, int]], master: str, db: int = 0, password: str | None = None) -> str:
    """The Sentinel form for these sentinels (what `brigade up --redis-ha` prints and sets)."""
    auth = f":{quote(password, safe='')}@" if password else ""
    hosts = ",".join(f"{_netloc_host(h)}:{p}" for h, p in sentinels)
    return f"redis+sentinel://{auth}{hosts}/{quote(master, safe='')}/{db}"


def kombu_broker(address: SentinelAddress) -> tuple[str, dict]:
    """Celery's broker URL and transport options for the same primary: one `sentinel://` URL
    (the first sentinel, with the data nodes' credentials and db), every sentinel in
    `sentinel_hosts` (ops/core/sentinel_transport.py says why not kombu's `;` list), and
    `master_name` / `sentinel_kwargs`, as kombu's SentinelChannel reads them."""
    auth = ""
    if address.password or address.username:
        auth = f"{quote(address.username or '', safe='')}:{quote(address.password or '', safe='')}@"
    host, port = address.sentinels[0]
    url = f"sentinel://{auth}{_netloc_host(host)}:{port}/{address.db}"
    options: dict = {"master_name": address.master, "sentinel_hosts": [list(s) for s in address.sentinels]}
    sentinel_kwargs = address.sentinel_kwargs()
    if sentinel_kwargs:
        options["sentinel_kwargs"] = sentinel_kwargs
    return url, options


def kombu_ssl(address: SentinelAddress) -> dict:
    """Celery's broker_use_ssl for a rediss+sentinel URL: the URL's ssl_* options, the certificate
    requirement as the ssl module's constant (kombu's form), required unless the URL says otherwise."""
    options = _tls_kwargs(address.tls_options)
    reqs = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
    options["ssl_cert_reqs"] = reqs.get(options.get("ssl_cert_reqs", "required"), ssl.CERT_REQUIRED)
    return options


def describe(url: str) -> str:
    """Where a Redis URL points, for messages: no password, and the Sentinel form in words."""
    if is_sentinel(url):
        try:
            return parse_sentinel(url).describe()
        except RedisAddressError:
            return "an unreadable Sentinel URL"
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    try:
        port = parts.port or 6379
    except ValueError:
        port = "?"
    return f"{parts.hostname}:{port}{parts.path or ''}"
