"""The gateway's error tree; every error leaves as OpenAI-style JSON with the right status.

    GatewayError                      (status, type, code)
    ├── BadRequest                    400 invalid_request_error
    │   └── ContextTooLong            400 context_length_exceeded
    ├── Unauthorized                  401 authentication_error
    ├── NotFound                      404 not_found_error
    ├── MethodNotAllowed              405 invalid_request_error (Allow)
    ├── PayloadTooLarge               413 invalid_request_error
    ├── UnsupportedMediaType          415 invalid_request_error
    ├── RateLimited                   429 rate_limit_error (Retry-After)
    ├── UpstreamError                 502 upstream_error            (bad gateway: protocol error, reset)
    │   ├── UpstreamUnavailable       502 upstream_unavailable      (connection refused / DNS)
    │   └── UpstreamTimeout           504 upstream_timeout          (connect or per-read timeout)
    ├── NotCached                     504 only_if_cached            (RFC 9111 §5.2.1.7)
    └── ServiceUnavailable            503 service_unavailable

aiohttp client errors are translated once, in `gateway.upstream.http`; handlers raise these and the error middleware
renders them. Anything else that escapes a handler is a gateway bug: it is logged and rendered as a JSON 500,
never as a bare error page.
"""

from __future__ import annotations

import orjson
from aiohttp import web


class GatewayError(Exception):
    status = 500
    type = "internal_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def to_response(self, extra_headers: dict[str, str] | None = None) -> web.Response:
        return error_response(
            self.status,
            self.message,
            type_=self.type,
            code=self.code,
            param=self.param,
            headers={**self.headers, **(extra_headers or {})},
        )


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class ContextTooLong(BadRequest):
    code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class NotFound(GatewayError):
    status = 404
    type = "not_found_error"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class RateLimited(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class UpstreamError(GatewayError):
    status = 502
    type = "upstream_error"
    code = "bad_gateway"


class UpstreamUnavailable(UpstreamError):
    code = "upstream_unavailable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class NotCached(GatewayError):
    status = 504
    type = "cache_miss"
    code = "only_if_cached"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "service_unavailable"


def error_body(message: str, *, type_: str, code: str | None = None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def error_response(
    status: int,
    message: str,
    *,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    # RFC 9111 §5.2.2.5 / RFC 9213: the gateway's own error answers are about this request and this caller (a 404
    # for another tenant's alias, a 401, a 429): no cache in front may keep one and answer others with it.
    return web.Response(
        status=status,
        body=error_body(message, type_=type_, code=code, param=param),
        content_type="application/json",
        headers={**_NOT_STORED, **(headers or {})},
    )


_NOT_STORED = {"Cache-Control": "no-store", "CDN-Cache-Control": "no-store", "Surrogate-Control": "no-store"}
