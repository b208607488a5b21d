"""What a trainer meets when something is off: a service with no policy backend, a typo in the
sampling parameters, the client pointed at the wrong server or at one that is down, and a long
list of ids. ROLLSERVE_BARE_URL is a service without LLM backends; ROLLSERVE_ENV_URL an
environment's resources server (both started by test/clients/python-client.test.ts)."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import warnings

import pytest

import rollserve
from conftest import TOKEN, URL, make_task

BARE_URL = os.environ.get("ROLLSERVE_BARE_URL")
ENV_URL = os.environ.get("ROLLSERVE_ENV_URL")


def test_no_backend_is_said_and_iter_groups_fails_fast_instead_of_waiting(prefix: str) -> None:
    with rollserve.Client(BARE_URL, token=TOKEN, warning_check=0.2) as client:
        with pytest.warns(rollserve.ServiceWarning, match="no policy backend"):
            submitted = client.submit([make_task("nobody runs this", id=f"{prefix}-nb", n=2)])
        assert len(submitted.warnings) == 1 and "POST /v1/llm-backends" in submitted.warnings[0]
        assert submitted[0].warnings == submitted.warnings
        with pytest.warns(rollserve.ServiceWarning, match="no policy backend"):
            status = client.status()
        assert status["warnings"]

        # before: the stream waited for ever (or, with stream_timeout, "the result stream dropped")
        with pytest.raises(rollserve.ServiceWarningError, match="no policy backend") as raised:
            list(client.iter_groups(submitted))
        assert raised.value.code == "SERVICE_WARNING" and raised.value.warnings == status["warnings"]
        with pytest.raises(rollserve.ServiceWarningError):
            list(client.iter_results(submitted))

        # a task naming its own policy server is not warned, nor held up by others' warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            own = client.submit(make_task("own", id=f"{prefix}-own", policy={"model": "fake-policy", "base_url": os.environ["ROLLSERVE_POLICY_URL"]}))
        assert own.warnings == [] and own[0].warnings == []
        assert [r.reward for r in client.iter_results(own)] == [1]
        client.cancel(f"{prefix}-nb")


def test_no_backend_fails_fast_in_the_async_client_too(prefix: str) -> None:
    async def main() -> None:
        async with rollserve.AsyncClient(BARE_URL, token=TOKEN, warning_check=0.2) as client:
            with pytest.warns(rollserve.ServiceWarning):
                submitted = await client.submit(make_task("nobody async", id=f"{prefix}-anb"))
            with pytest.raises(rollserve.ServiceWarningError, match="no policy backend"):
                [g async for g in client.iter_groups(submitted)]
            await client.cancel(f"{prefix}-anb")

    asyncio.run(main())


def test_a_typo_in_sampling_is_refused_naming_the_name_meant(client: rollserve.Client, prefix: str) -> None:
    with pytest.raises(rollserve.RolloutServiceError) as raised:
        client.submit(make_task("typo", id=f"{prefix}-typo", policy={"model": "fake-policy", "sampling": {"temprature": 0.7}}))
    assert raised.value.status == 422 and raised.value.code == "UNPROCESSABLE"
    assert '"temprature" (did you mean "temperature"?)' in raised.value.message
    assert raised.value.details[0]["path"] == ["tasks", 0, "policy", "sampling"]
    # nothing was started
    with pytest.raises(rollserve.RolloutServiceError) as missing:
        client.get(f"{prefix}-typo")
    assert missing.value.status == 404


def test_a_client_pointed_at_an_environment_server_says_where_and_what_to_do() -> None:
    with rollserve.Client(ENV_URL, token=TOKEN, retries=0) as wrong:
        with pytest.raises(rollserve.RolloutServiceError) as raised:
            wrong.submit(make_task("wrong port"))
    message = str(raised.value)
    assert raised.value.status == 404
    assert f"{ENV_URL}/v1/rollouts" in message
    assert "not as the rollserve rollout service" in message and "rollserve start" in message


def test_health_is_false_when_the_service_is_down() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # nothing listens there now
    with rollserve.Client(f"http://127.0.0.1:{port}", token=TOKEN) as down:
        assert down.health() is False
    with rollserve.Client(ENV_URL) as other:
        assert isinstance(other.health(), bool)  # answers, without raising
    with rollserve.Client(URL, token=TOKEN) as up:
        assert up.health() is True


def test_a_long_id_list_streams_through_one_post(client: rollserve.Client, prefix: str) -> None:
    # ~40 characters each: 300 ids are past what the client sends in a query string
    ids = [f"{prefix}-a-long-task-id-of-a-trainer-{i:04d}" for i in range(300)]
    submitted = client.submit([make_task(f"long list {i}", id=id_) for i, id_ in enumerate(ids)])
    results = list(client.iter_results(submitted))
    assert sorted(r.id for r in results) == sorted(ids)
    assert all(r.reward == 1 for r in results)
    groups = list(client.iter_groups(submitted))
    assert sorted(g.task_id for g in groups) == sorted(ids)


def test_ids_alone_get_the_warning_issued_while_they_wait_then_stream_once_a_backend_is_added(prefix: str) -> None:
    with rollserve.Client(BARE_URL, token=TOKEN, warning_check=0.2) as client:
        with pytest.warns(rollserve.ServiceWarning):
            client.submit(make_task("waits for a backend", id=f"{prefix}-later"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            def add_backend_once_warned() -> None:
                # the trainer reacts to the warning: a policy server comes up
                while not any("no policy backend" in str(w.message) for w in list(caught)):
                    threading.Event().wait(0.05)
                client.backends.add(os.environ["ROLLSERVE_POLICY_URL"], id=f"{prefix}-policy")

            adder = threading.Thread(target=add_backend_once_warned, daemon=True)
            adder.start()
            # an id alone: nothing says its submit was warned, so the stream warns and waits on
            results = list(client.iter_results(f"{prefix}-later"))
        adder.join()
        assert [r.reward for r in results] == [1]
        warned = [w for w in caught if issubclass(w.category, rollserve.ServiceWarning)]
        assert len(warned) == 1 and "no policy backend" in str(warned[0].message)
        client.backends.remove(f"{prefix}-policy")
