"""Retries against a stand-in server (http.server) that fails on purpose: a submit retried after a
503 or a timeout sends the same ids; a 4xx is not retried."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, List

import pytest

import rollserve
from conftest import make_task


class Flaky:
    def __init__(self, plan: List[str]) -> None:
        self.plan = plan  # per request: "503", "slow", "422" or "ok"
        self.bodies: List[Any] = []


@pytest.fixture
def flaky() -> Iterator[Callable[[List[str]], tuple]]:
    servers: List[ThreadingHTTPServer] = []

    def start(plan: List[str]) -> tuple:
        state = Flaky(plan)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                state.bodies.append(body)
                step = state.plan[len(state.bodies) - 1] if len(state.bodies) <= len(state.plan) else "ok"
                if step == "slow":
                    time.sleep(1.0)  # past the client's timeout
                status, answer = {
                    "503": (503, {"error": {"code": "UNAVAILABLE", "message": "busy", "retryable": True}}),
                    "422": (422, {"error": {"code": "UNPROCESSABLE", "message": "bad task", "retryable": False, "details": [{"path": ["env"]}]}}),
                }.get(step, (202, {"tasks": [{"task_id": t["id"], "rollout_ids": [t["id"]], "existing": len(state.bodies) > 1} for t in body["tasks"]]}))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}", state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_a_submit_retried_after_503_and_timeout_sends_the_same_ids(flaky: Callable[[List[str]], tuple]) -> None:
    url, state = flaky(["503", "slow", "ok"])
    with rollserve.Client(url, timeout=0.3, backoff=0.01) as client:
        submitted = client.submit([make_task("a"), make_task("b")])
    assert len(state.bodies) == 3
    ids = [[t["id"] for t in body["tasks"]] for body in state.bodies]
    assert ids[0] == ids[1] == ids[2] == submitted.task_ids


def test_client_errors_are_not_retried(flaky: Callable[[List[str]], tuple]) -> None:
    url, state = flaky(["422"])
    with rollserve.Client(url, backoff=0.01) as client:
        with pytest.raises(rollserve.RolloutServiceError) as error:
            client.submit(make_task("a"))
    assert len(state.bodies) == 1
    assert (error.value.status, error.value.code, error.value.message) == (422, "UNPROCESSABLE", "bad task")
    assert error.value.details == [{"path": ["env"]}]


def test_retries_give_up_with_the_last_answer(flaky: Callable[[List[str]], tuple]) -> None:
    url, state = flaky(["503"] * 10)
    with rollserve.Client(url, retries=2, backoff=0.01) as client:
        with pytest.raises(rollserve.RolloutServiceError) as error:
            client.submit(make_task("a"))
    assert len(state.bodies) == 3
    assert error.value.status == 503 and error.value.retryable
