"""The OpenAI-compatible HTTP server in front of the engine."""

from backend.server.app import create_app
from backend.server.state import ServedModel, ServerLimits

__all__ = ["ServedModel", "ServerLimits", "create_app"]
