"""Where Brigade's Redis is: one URL, for one Redis or for a primary watched by Sentinel.

BRIGADE_REDIS_URL takes redis-py's forms for one Redis (redis://, rediss://, unix://) and a
Sentinel form for a primary with replicas and sentinels that promote a replica when it fails:

    redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?sentinel_password=P]
    rediss+sentinel://...  (TLS to the data nodes and the sentinels)

A TLS URL (rediss://, rediss+sentinel://) takes redis-py's TLS options in its query (ssl_ca_certs,
ssl_certfile, ssl_keyfile, ssl_cert_reqs, ssl_check_hostname); the settings' BRIGADE_REDIS_TLS_*
fill in those it leaves out (`with_tls_defaults`), so the URL carries everything a client needs and
every client, Celery's broker and Flower read TLS from it alone (`tls_options`).

PASSWORD (and USER) are the data nodes' (`requirepass`/ACL), as in redis-py's and kombu's
Sentinel support; sentinels that need a password of their own take `sentinel_password`. One
parse serves redis-py (ops/core/redis_clients.py) and Celery's broker (ops/core/queue.py, through
kombu's `sentinel://` list with the transport options `master_name` and `sentinel_kwargs`), so
every part of Brigade finds the same primary the same way, and finds the new one after a failover.
"""
from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
TLS_SCHEMES = ("rediss", "rediss+sentinel")
SENTINEL_PORT = 26379
TLS_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")
CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
# A TLS file a URL names, the setting that names it when the URL does not, and what that file is.
TLS_FILES = {
    "ssl_ca_certs": ("BRIGADE_REDIS_TLS_CA_FILE", "the PEM file of the certificate authority that signed the "
                     "Redis server's certificate (empty: the system's trust store)"),
    "ssl_certfile": ("BRIGADE_REDIS_TLS_CERT_FILE", "the PEM certificate Brigade presents to a Redis that asks "
                     "clients for one (tls-auth-clients), or empty"),
    "ssl_keyfile": ("BRIGADE_REDIS_TLS_KEY_FILE", "the PEM key of that certificate, or empty"),
}


class RedisAddressError(ValueError):
    """A Redis URL that cannot be used, said in one line with the form it should take."""


class RedisTLSError(RedisAddressError):
    """A TLS option that cannot be used (a file that is not there), said with the setting to change."""


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
            # as redis-py reads a rediss:// URL's (kombu, given them as broker_use_ssl, reads them so too)
            out[name] = value.upper() not in ("0", "F", "FALSE", "N", "NO", "OFF")
        elif name == "ssl_cert_reqs":
            out[name] = value.lower()  # redis-py takes "none", "optional", "required"
            if out[name] not in CERT_REQS:
                raise RedisTLSError(f"ssl_cert_reqs={value} in the Redis URL should be one of "
                                    f"{', '.join(CERT_REQS)}")
        else:
            out[name] = value
    return out


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def is_tls(url: str) -> bool:
    return url.split("://", 1)[0].lower() in TLS_SCHEMES


def with_tls_defaults(url: str, defaults: dict[str, str]) -> str:
    """A TLS URL with each of these ssl_* options that it does not name itself (empty ones left out);
    any other URL as it is. How the settings' BRIGADE_REDIS_TLS_* reach every client: in the URL."""
    if not is_tls(url):
        return url
    named = {name for name, _ in parse_qsl(urlsplit(url).query)}
    missing = {name: value for name, value in defaults.items() if value and name not in named}
    if not missing:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(missing, safe="/")


def tls_options(url: str) -> dict:
    """redis-py's TLS arguments from a TLS URL's ssl_* options ({} for a URL without TLS). A file it
    names that is not there is a RedisTLSError that says which setting to change: redis-py would only
    say "No such file or directory" at the first command."""
    if not is_tls(url):
        return {}
    options = _tls_kwargs(tuple((k, v) for k, v in parse_qsl(urlsplit(url).query) if k in TLS_OPTIONS))
    for name, (setting, meaning) in TLS_FILES.items():
        path = options.get(name)
        if path and not os.path.isfile(path):
            raise RedisTLSError(f"{path} is not a file ({setting}, or {name} in the Redis URL): set {setting} "
                                f"to {meaning}")
    return options


def without_tls_options(url: str) -> str:
    """The URL without its ssl_* options. For kombu, given them as broker_use_ssl (`kombu_ssl`): it
    would read the URL's over those, its own way (ssl_check_hostname=0 as true, NONE as an error)."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query) if k not in TLS_OPTIONS], safe="/")
    return parts._replace(query=query).geturl()


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


def sentinel_url(sentinels: list[tuple[str, int]], master: str, db: int = 0, password: str | None = None,
                 tls: dict[str, str] | None = None) -> str:
    """The Sentinel form for these sentinels (what `brigade up --redis-ha` prints and sets); with
    `tls` (redis-py's ssl_* options, perhaps none), the TLS form with them in its query."""
    auth = f":{quote(password, safe='')}@" if password else ""
    hosts = ",".join(f"{_netloc_host(h)}:{p}" for h, p in sentinels)
    url = f"redis+sentinel://{auth}{hosts}/{quote(master, safe='')}/{db}"
    return url if tls is None else with_tls_defaults("rediss" + url[len("redis"):], tls)


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


def kombu_ssl(options: dict) -> dict:
    """Celery's broker_use_ssl from a TLS URL's options (`tls_options`): the same options, the
    certificate requirement as the ssl module's constant (kombu's form), required unless the URL
    says otherwise, as redis-py's default is."""
    return {**options, "ssl_cert_reqs": CERT_REQS[options.get("ssl_cert_reqs", "required")]}


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
