"""Engine errors, translated to HTTP statuses by the server.

EngineError
├── QueueFullError      the waiting queue is at `max_waiting` (server: 503 + Retry-After)
├── InvalidRequestError a request the engine cannot take, e.g. a duplicate request id (400)
│   └── InvalidPromptError  a prompt that breaks PromptLimits (backend/engine/prompt.py): checked once, at entry
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
