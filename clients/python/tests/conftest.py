"""The suite runs against a real rollout service named by ROLLSERVE_URL (and ROLLSERVE_TOKEN),
whose policy is the scripted one of test/clients/python-client.test.ts (`pnpm exec vitest run
test/clients` starts both and runs this suite). The policy answers by the first user message:
"hang ..." never answers, "slow <ms> ..." answers after <ms>, "count ..." calls the counter tool
once, "coin ..." alternates heads/tails, anything else is echoed as "answer: <text>".
The environment "pyclient" rewards 1 when the policy's output contains the row's `expected`."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import rollserve  # noqa: E402

URL = os.environ.get("ROLLSERVE_URL")
TOKEN = os.environ.get("ROLLSERVE_TOKEN") or None


def pytest_collection_modifyitems(config: Any, items: Any) -> None:
    if not URL:
        skip = pytest.mark.skip(reason="ROLLSERVE_URL names no running service")
        for item in items:
            item.add_marker(skip)


@pytest.fixture
def client():
    with rollserve.Client(URL, token=TOKEN, timeout=60) as c:
        yield c


@pytest.fixture
def prefix() -> str:
    """A fresh id prefix per test: the service outlives the tests."""
    return uuid.uuid4().hex[:8]


def make_task(text: str, *, expected: Optional[str] = None, n: int = 1, id: Optional[str] = None, **extra: Any) -> Dict[str, Any]:
    task: Dict[str, Any] = {
        "env": "pyclient",
        "row": {"responses_create_params": {"input": text}, "expected": expected if expected is not None else text},
        "policy": {"model": "fake-policy"},
        "n": n,
        **extra,
    }
    if id is not None:
        task["id"] = id
    return task
