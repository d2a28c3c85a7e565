"""API keys: who may use the gateway, with which limits, and what each key has used.

A key reads `brg_<id>_<secret>`: the id (8 lowercase hex) names its record, the secret proves
possession. Redis keeps only the sha256 digest of the whole key, so a copy of Redis does not
hold a usable key; the plain key is shown once, when it is created. Every character is a
letter, a digit or '_', so a key is a valid HTTP token, a valid WebSocket subprotocol token, and
one word to a double click.

Authentication reads the record on every call (one HGETALL), so a revoke takes effect on the
next request at every gateway. Revoking keeps the record, so that its usage stays visible.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from dataclasses import dataclass

import redis.asyncio as aioredis

from ops.core import redis_keys

KEY_PREFIX = "brg"
KEY_PATTERN = re.compile(r"brg_([0-9a-f]{8})_([A-Za-z0-9_]{32})")
ID_PATTERN = re.compile(r"[0-9a-f]{8}")
MAX_NAME_CHARS = 128
USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cache_hits")

UNAUTHORIZED = "unauthorized"
_HOW_TO = "send Authorization: Bearer KEY; create one with `brigade keys create --name NAME`"


class AuthError(Exception):
    """A request without a valid, live API key. `code` is stable; `message` says what to do."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class UnknownKey(LookupError):
    """An operator named an API key id that was never created."""


@dataclass(frozen=True)
class ApiKey:
    id: str
    name: str
    rpm: int  # requests per minute; 0: unlimited
    tpm: int  # tokens (prompt + completion) per minute; 0: unlimited
    max_concurrent: int  # requests running at once; 0: unlimited
    created: int  # unix seconds
    revoked: bool


def new_key() -> tuple[str, str]:
    """A fresh (id, whole key). token_urlsafe's '-' becomes '_' (63 symbols: ~190 bits of secret)."""
    key_id = secrets.token_hex(4)
    secret = secrets.token_urlsafe(24).replace("-", "_")
    return key_id, f"{KEY_PREFIX}_{key_id}_{secret}"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer KEY` header value, or None when there is none."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credentials.strip():
        return None
    return credentials.strip()


def key_id_of(id_or_key: str) -> str:
    """The id named by an id or by a whole key; ValueError for anything else."""
    id_or_key = id_or_key.strip()
    if ID_PATTERN.fullmatch(id_or_key):
        return id_or_key
    match = KEY_PATTERN.fullmatch(id_or_key)
    if match:
        return match.group(1)
    raise ValueError(f"{id_or_key!r} is neither an API key id (8 hex digits) nor an API key (brg_ID_SECRET)")


def _record(key_id: str, fields: dict[str, str]) -> ApiKey:
    return ApiKey(id=key_id, name=fields["name"], rpm=int(fields["rpm"]), tpm=int(fields["tpm"]),
                  max_concurrent=int(fields["max_concurrent"]), created=int(fields["created"]),
                  revoked=fields["revoked"] == "1")


def _limit(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a whole number >= 0 (0: unlimited), not {value!r}")
    return value


class KeyStore:
    def __init__(self, client: aioredis.Redis):
        self.redis = client  # from ops.core.redis_clients: replies are str

    async def create(self, name: str, rpm: int = 0, tpm: int = 0, max_concurrent: int = 0) -> tuple[str, ApiKey]:
        """A new key and its record. The plain key is returned here only: Redis keeps its digest."""
        name = name.strip()
        if not name or len(name) > MAX_NAME_CHARS:
            raise ValueError(f"a key's name must have 1 to {MAX_NAME_CHARS} characters, not {len(name)}")
        rpm, tpm, max_concurrent = _limit("rpm", rpm), _limit("tpm", tpm), _limit("max_concurrent", max_concurrent)
        while True:  # SADD reserves the id: two creates can never share one
            key_id, plain = new_key()
            if await self.redis.sadd(redis_keys.API_KEYS, key_id):
                break
        record = ApiKey(id=key_id, name=name, rpm=rpm, tpm=tpm, max_concurrent=max_concurrent,
                        created=int(time.time()), revoked=False)
        await self.redis.hset(redis_keys.api_key(key_id), mapping={
            "name": name, "digest": digest(plain), "rpm": rpm, "tpm": tpm, "max_concurrent": max_concurrent,
            "created": record.created, "revoked": 0,
        })
        return plain, record

    async def get(self, id_or_key: str) -> ApiKey | None:
        key_id = key_id_of(id_or_key)
        raw = await self.redis.hgetall(redis_keys.api_key(key_id))
        return _record(key_id, raw) if raw else None

    async def list(self) -> list[ApiKey]:
        """Every key ever created, revoked ones included, oldest first."""
        ids = sorted(await self.redis.smembers(redis_keys.API_KEYS))
        async with self.redis.pipeline(transaction=False) as pipe:
            for key_id in ids:
                pipe.hgetall(redis_keys.api_key(key_id))
            raws = await pipe.execute()
        # An id whose record is missing was reserved by a create that has not written it yet.
        found = [_record(key_id, raw) for key_id, raw in zip(ids, raws) if raw]
        return sorted(found, key=lambda k: (k.created, k.id))

    async def revoke(self, id_or_key: str) -> bool:
        """Refuse the key from the next request on. False when no such key exists."""
        key_id = key_id_of(id_or_key)
        if not await self.redis.exists(redis_keys.api_key(key_id)):
            return False  # HSET would create a record without a digest
        await self.redis.hset(redis_keys.api_key(key_id), "revoked", 1)
        return True

    async def usage(self, id_or_key: str) -> dict:
        """The key's counters: requests, prompt_tokens, completion_tokens, cache_hits."""
        key_id = key_id_of(id_or_key)
        if not await self.redis.exists(redis_keys.api_key(key_id)):
            raise UnknownKey(f"no API key {key_id}; `brigade keys list` shows them all")
        raw = {k: int(v) for k, v in (await self.redis.hgetall(redis_keys.api_key_usage(key_id))).items()}
        return {field: raw.get(field, 0) for field in USAGE_FIELDS}

    async def authenticate(self, presented: str | None) -> ApiKey:
        """The live key `presented` names, or AuthError(unauthorized) saying what to do."""
        if not presented:
            raise AuthError(UNAUTHORIZED, f"this gateway needs an API key: {_HOW_TO}")
        match = KEY_PATTERN.fullmatch(presented)
        if match is None:
            raise AuthError(UNAUTHORIZED, f"malformed API key (expected brg_ID_SECRET): {_HOW_TO}")
        key_id = match.group(1)
        fields = await self.redis.hgetall(redis_keys.api_key(key_id))
        stored = fields.get("digest", "")
        # Unknown and wrong-secret read the same, so the answer does not say which ids exist.
        if not stored or not hmac.compare_digest(stored.encode(), digest(presented).encode()):
            raise AuthError(UNAUTHORIZED, f"invalid API key: {_HOW_TO}")
        record = _record(key_id, fields)
        if record.revoked:
            raise AuthError(UNAUTHORIZED, "this API key was revoked; create a new one with "
                                          "`brigade keys create --name NAME`")
        return record

    async def record_usage(self, key_id: str, prompt_tokens: int, completion_tokens: int, cache_hit: bool) -> None:
        """Count one answered request against its key."""
        usage = redis_keys.api_key_usage(key_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(usage, "requests", 1)
            pipe.hincrby(usage, "prompt_tokens", prompt_tokens)
            pipe.hincrby(usage, "completion_tokens", completion_tokens)
            pipe.hincrby(usage, "cache_hits", 1 if cache_hit else 0)
            await pipe.execute()
