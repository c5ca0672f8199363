"""Engine errors, translated to HTTP statuses by the server.

EngineError
├── QueueFullError      the waiting queue is at `max_waiting` (server: 503 + Retry-After)
├── InvalidRequestError a prompt the engine cannot run: empty, too long, unknown token ids (400)
└── EngineStoppedError  the engine was stopped or its compute loop failed while the request ran (503)
"""

from __future__ import annotations


class EngineError(Exception):
    pass


class QueueFullError(EngineError):
    pass


class InvalidRequestError(EngineError, ValueError):
    pass


class EngineStoppedError(EngineError):
    pass
