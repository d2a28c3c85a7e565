"""Who is asking: the caller's API key, for every door, checked the same way.

With keys on (`BRIGADE_AUTH_REQUIRED`), each door hands over the `Authorization` value it got
(a header, or the WebSocket subprotocol a browser can set) and gets the key's record back, or a
ProtocolError with a stable code: `unauthorized` for a missing, unknown or revoked key,
`unavailable` when Redis cannot say. With keys off every caller is anonymous (None).
"""
from __future__ import annotations

import redis.asyncio as aioredis

from gateway.admission.api_keys import ApiKey, AuthError, KeyStore, bearer_key
from gateway.request import ProtocolError
from ops.core.redis_clients import through_failover
from ops.core.settings import Settings


class Authenticator:
    def __init__(self, settings: Settings, key_store: KeyStore):
        self.settings = settings
        self.key_store = key_store

    async def authenticate(self, authorization: str | None) -> ApiKey | None:
        """The caller's API key from an `Authorization: Bearer KEY` value; None when keys are off."""
        if not self.settings.auth_required:
            return None
        try:
            # through a Sentinel failover (settings.failover_budget_s), not refused at its first moment
            return await through_failover(lambda: self.key_store.authenticate(bearer_key(authorization)),
                                          self.settings.failover_budget_s)
        except AuthError as err:
            raise ProtocolError("unauthorized", err.message) from None
        except aioredis.RedisError:
            raise self._unavailable() from None

    async def still_valid(self, key: ApiKey | None) -> ApiKey | None:
        """The key's record as it is now (a revoke or a new limit reaches open connections too)."""
        if key is None:
            return None
        try:
            current = await through_failover(lambda: self.key_store.get(key.id), self.settings.failover_budget_s)
        except aioredis.RedisError:
            raise self._unavailable() from None
        if current is None or current.revoked:
            raise ProtocolError("unauthorized", "this API key was revoked; create a new one with "
                                "`brigade keys create --name NAME`")
        return current

    def _unavailable(self) -> ProtocolError:
        return ProtocolError("unavailable", "keys cannot be checked now; try again shortly",
                             retry_after_s=self.settings.retry_after_s)
