"""What stands before the routes: the API key, body size and read-time limits, and slow-header connections.

``Auth`` and ``BodyGuard`` are plain ASGI middleware, so the key is checked before a byte of the body is
read, and a body over the size limit or slower than the read deadline is refused while it arrives.
uvicorn (0.54) has no deadline for a request's headers, so ``header_deadline_protocol`` gives its h11
protocol one: a connection that has not completed a request's headers in time is closed.
"""

from __future__ import annotations

import asyncio
import hmac

from uvicorn.protocols.http.h11_impl import H11Protocol

from tokmem.serve.protocol import ApiError

CLOSE = {
    "connection": "close"
}  # after a body too slow to wait for (not after 413: a client still sending would get a reset)


class Auth:
    """Refuse requests to protected paths without ``Authorization: Bearer KEY`` (401), before the body is read."""

    def __init__(self, app, api_key: str | None, protect: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode() if api_key else None
        self.prefix = "/v1/banks" if protect == "manage" else "/v1/"

    async def __call__(self, scope, receive, send):
        if self.expected is not None and scope["type"] == "http" and scope["path"].startswith(self.prefix):
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                error = ApiError(
                    401,
                    "this route needs the header 'Authorization: Bearer <api key>'",
                    "authentication_error",
                    code="invalid_api_key",
                )
                return await error.response()(scope, receive, send)
        await self.app(scope, receive, send)


class BodyGuard:
    """Refuse a request body over ``limit`` bytes (413, by Content-Length or while reading) or one that takes
    longer than ``seconds`` to arrive (408)."""

    def __init__(self, app, limit: int, seconds: float):
        self.app, self.limit, self.seconds = app, limit, seconds

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._too_large().response()(scope, receive, send)
        loop = asyncio.get_running_loop()
        deadline, seen, complete = loop.time() + self.seconds, 0, False

        async def guarded():
            nonlocal seen, complete
            if complete:  # after the body: waiting for a disconnect has no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise ApiError(
                    408,
                    f"the request body took longer than this server's limit of {self.seconds:g} s",
                    code="request_timeout",
                    headers=CLOSE,
                ) from None
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise self._too_large()
            complete = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, guarded, send)

    def _too_large(self) -> ApiError:
        return ApiError(
            413, f"the request body is over this server's limit of {self.limit} bytes", code="request_too_large"
        )


def header_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request's headers within ``seconds``
    of opening or of its last response."""

    class HeaderDeadline(H11Protocol):
        _timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def connection_lost(self, exc) -> None:
            if self._timer is not None:
                self._timer.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(seconds, self._expire, self.cycle)

        def _expire(self, cycle) -> None:
            if self.cycle is cycle and not self.transport.is_closing():  # no request has begun since the timer was set
                self.transport.close()

    return HeaderDeadline
