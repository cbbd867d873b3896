"""Optional token authentication (``--auth-token``, ``MILLISERVE_AUTH__TOKEN``).

With a token set, every inference, metadata and repository call must carry it, as
``Authorization: Bearer <token>`` or ``x-api-key: <token>`` (HTTP headers, or gRPC
metadata under the same lower-case keys: tritonclient passes both through its
``headers`` argument). Health and metrics stay open unless the settings close them
too, so load balancers and Prometheus keep working. Tokens are compared in constant
time.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from typing import Literal

from milliserve.errors import UnauthorizedError

__all__ = ["Auth", "Route"]

Route = Literal["api", "health", "metrics"]


class Auth:
    def __init__(
        self, token: str | None, protect_health: bool = False, protect_metrics: bool = False
    ) -> None:
        self._token = token.encode() if token else None
        self._open: set[str] = set()
        if not protect_health:
            self._open.add("health")
        if not protect_metrics:
            self._open.add("metrics")

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def _ok(self, presented: bytes) -> bool:
        assert self._token is not None
        return hmac.compare_digest(presented, self._token)

    def check(self, headers: Iterable[tuple[bytes, bytes]], route: Route) -> None:
        """Raise UnauthorizedError unless ``headers`` (lower-case names) carry the token."""
        if self._token is None or route in self._open:
            return
        found = False
        for key, value in headers:
            if key == b"authorization":
                scheme, _, credential = value.partition(b" ")
                if scheme.lower() == b"bearer" and self._ok(credential.strip()):
                    return
                found = True
            elif key == b"x-api-key":
                if self._ok(value.strip()):
                    return
                found = True
        raise UnauthorizedError(
            "the token is not valid"
            if found
            else "this server requires a token: send 'Authorization: Bearer <token>' or 'x-api-key: <token>'"
        )

    def check_grpc(self, metadata: Iterable[tuple[str, str | bytes]] | None, route: Route) -> None:
        if self._token is None or route in self._open:
            return
        pairs = [(k.lower().encode(), v if isinstance(v, bytes) else v.encode()) for k, v in (metadata or ())]
        self.check(pairs, route)
