"""The one error vocabulary of the proxy, and the one function that turns it into OpenAI's error JSON.

Everything the proxy raises on purpose is an ``OpenClawError`` with an HTTP status; ``error_body``
renders it as ``{"error": {"message", "type", "param", "code"}}``. Anything else is a bug: the route
layer logs its traceback and answers a sanitised 500.
"""

from __future__ import annotations

from typing import Any


class CommandError(RuntimeError):
    """A command's failure that its message explains (a server it needs is down, say): the CLI prints it
    as one line and exits 1, without a traceback."""


class OpenClawError(Exception):
    """Base class: a failure with a status code and an OpenAI error type."""

    status: int = 500
    error_type: str = "internal_error"
    code: str | None = None  # OpenAI's string error code when it has one; else the status is sent

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}
        if code is not None:
            self.code = code


class BadRequest(OpenClawError, ValueError):
    """The client sent something we cannot serve (400)."""

    status = 400
    error_type = "invalid_request_error"


class ContextLengthExceeded(BadRequest):
    """The prompt leaves no room for a single new token in the policy's context: OpenAI's own 400, whose
    ``code`` OpenClaw reacts to by compacting its history."""

    code = "context_length_exceeded"


class Unauthorized(OpenClawError):
    status = 401
    error_type = "authentication_error"


class Forbidden(OpenClawError):
    """A valid key asks for something it may not do (deleting a user it does not own)."""

    status = 403
    error_type = "permission_error"


class NotFound(OpenClawError):
    status = 404
    error_type = "not_found_error"


class PayloadTooLarge(OpenClawError):
    status = 413
    error_type = "invalid_request_error"


class RequestTimeout(OpenClawError):
    """The client sent its body too slowly (408)."""

    status = 408
    error_type = "invalid_request_error"


class ClientGone(OpenClawError):
    """The client hung up before its request body was complete (499, nginx's code: nobody reads the answer).
    No turn exists yet, so nothing is dropped; the request is counted under status 499."""

    status = 499
    error_type = "invalid_request_error"


class RateLimited(OpenClawError):
    status = 429
    error_type = "rate_limit_error"


class SubmissionPaused(OpenClawError):
    """Training is syncing weights; the client should retry shortly (503 + Retry-After)."""

    status = 503
    error_type = "service_unavailable"


class Overloaded(OpenClawError):
    """The spool and its in-memory overflow are full: back-pressure until the trainer catches up (503)."""

    status = 503
    error_type = "service_unavailable"


class NotDurable(OpenClawError):
    """The turn could not be committed to the spool in time (a full disk, the spool file deleted, a stuck
    disk): the reply is refused, since a 200 promises the turn is saved (503 + Retry-After)."""

    status = 503
    error_type = "service_unavailable"


class ShuttingDown(OpenClawError):
    """The server stopped while the request was still running (503; the client may retry elsewhere/later)."""

    status = 503
    error_type = "service_unavailable"


class BackendUnavailable(OpenClawError, ConnectionError):
    """The policy/judge backend is down or answered garbage (502)."""

    status = 502
    error_type = "backend_error"


class BackendResponseTooLarge(BackendUnavailable):
    """A backend answer (a whole body, one stream event, or a stream's content) over its size cap
    (``openclaw_proxy_max_response_bytes`` / ``openclaw_judge_max_response_bytes``): a 502, read no further."""


class GenerationAborted(BackendUnavailable):
    """The policy server aborted the generation, and it could not be resumed (502; the turn is dropped
    as ``aborted``)."""


class BackendTimeout(OpenClawError, TimeoutError):
    """The backend did not answer in time (504)."""

    status = 504
    error_type = "backend_timeout"


def error_body(exc: OpenClawError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": exc.error_type, "param": exc.param,
                      "code": exc.code if exc.code is not None else exc.status}}


def internal_error_body() -> dict[str, Any]:
    return {"error": {"message": "internal error in the openclaw-rl proxy (see its log)",
                      "type": "internal_error", "param": None, "code": 500}}
