"""OpenAI-style errors, translated once at the HTTP boundary.

ApiError                 -> {"error": {"message", "type", "param", "code"}} with its status
├── 400 invalid_request_error  bad JSON, wrong types, out-of-range values, prompt too long
├── 404 not_found_error        unknown model or route
├── 503 server_overloaded      the engine's waiting queue is full (Retry-After)
├── 503 server_error           engine_stopped: the engine was stopped or its step failed (Retry-After)
└── 500 server_error           anything unexpected: still JSON, never a bare 500
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from backend.engine.errors import EngineError, EngineStoppedError, InvalidRequestError, QueueFullError


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def translate_engine_error(exc: Exception, retry_after_s: int) -> ApiError:
    if isinstance(exc, QueueFullError):
        return ApiError(
            503,
            "the server is overloaded, retry later",
            type="server_overloaded",
            code="queue_full",
            headers={"Retry-After": str(retry_after_s)},
        )
    if isinstance(exc, InvalidRequestError):
        return bad_request(str(exc))
    if isinstance(exc, EngineStoppedError):
        return ApiError(
            503,
            "the engine is not running",
            type="server_error",
            code="engine_stopped",
            headers={"Retry-After": str(retry_after_s)},
        )
    return ApiError(500, "internal error", type="server_error")


def _http_error(exc: web.HTTPException) -> ApiError:
    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
    return ApiError(
        exc.status,
        exc.reason,
        type=kind,
        headers={k: v for k, v in exc.headers.items() if k.lower() == "allow"},
    )


@web.middleware
async def error_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _http_error(exc).response()
    except EngineError as exc:
        return translate_engine_error(exc, retry_after_s=1).response()
    except Exception:
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return ApiError(500, "internal error", type="server_error").response()
