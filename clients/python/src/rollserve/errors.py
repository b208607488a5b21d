"""The client's exceptions."""

from __future__ import annotations

from typing import Any, List, Optional


class RolloutServiceError(Exception):
    """An error answered by the rollout service, or the service could not be reached.

    ``status`` is the HTTP status (None when no answer came), ``code`` the service's error code
    (``UNAUTHORIZED``, ``NOT_FOUND``, ``UNPROCESSABLE``, ... or ``CONNECTION`` / ``PROTOCOL`` for
    failures on this side), ``message`` its message, ``retryable`` and ``details`` as the service
    sent them (``details`` holds the schema issues of a 422).
    """

    def __init__(
        self,
        status: Optional[int],
        code: str,
        message: str,
        *,
        retryable: bool = False,
        details: Any = None,
        method: Optional[str] = None,
        path: Optional[str] = None,
    ) -> None:
        where = f"{method} {path}: " if method and path else ""
        head = f"{status} {code}" if status is not None else code
        super().__init__(f"{where}{head}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retryable = retryable
        self.details = details
        self.method = method
        self.path = path


class ServiceConnectionError(RolloutServiceError):
    """The service could not be reached (refused, reset, timed out), after the retries allowed."""

    def __init__(self, message: str, *, method: Optional[str] = None, path: Optional[str] = None) -> None:
        super().__init__(None, "CONNECTION", message, retryable=True, method=method, path=path)


class ServiceWarning(UserWarning):
    """A warning the service gave (a submit's 202, ``/v1/status``): something will keep rollouts
    from running, e.g. no LLM backend to run the policy on. Issued with :func:`warnings.warn`."""


class DriftWarning(UserWarning):
    """A training view's sequence fields are None for a re-tokenisation drift (chat mode: a
    turn's prompt re-tokenised differently from the previous prompt and generation). Issued with
    :func:`warnings.warn` by the training iterators, once per drifted sample; the sample is also
    marked (``TrainingView.drifted``, ``Group.drifted``). ``policy.generation: "tokens"`` avoids it."""


class ServiceWarningError(RolloutServiceError):
    """A result stream waited on rollouts that the service says cannot run (``/v1/status``
    warnings, e.g. no policy backend), instead of waiting for ever. Fix the cause (add a backend)
    and iterate again: the rollouts are still there. ``warnings`` are the service's."""

    def __init__(self, warnings: List[str], *, method: Optional[str] = None, path: Optional[str] = None) -> None:
        super().__init__(None, "SERVICE_WARNING", "; ".join(warnings), retryable=True, method=method, path=path)
        self.warnings = list(warnings)
