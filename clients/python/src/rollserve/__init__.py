"""Client of the rollserve rollout service: ``Client`` (sync) and ``AsyncClient`` (asyncio).
Standard library only."""

from .aio import AsyncClient
from .client import Client
from .errors import DriftWarning, RolloutServiceError, ServiceConnectionError, ServiceWarning, ServiceWarningError
from .models import Group, Page, Result, Rollout, Sampling, Submission, SubmittedTask, TaskRollouts, TrainingView

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "DriftWarning",
    "Group",
    "Page",
    "Result",
    "Rollout",
    "RolloutServiceError",
    "Sampling",
    "ServiceConnectionError",
    "ServiceWarning",
    "ServiceWarningError",
    "Submission",
    "SubmittedTask",
    "TaskRollouts",
    "TrainingView",
]
