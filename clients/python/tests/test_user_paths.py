"""What a trainer meets when something is off: a service with no policy backend, a typo in the
sampling parameters, the client pointed at the wrong server or at one that is down, and a long
list of ids, a policy server that does not serve the model named, a sample whose turns drifted.
ROLLSERVE_BARE_URL is a service without LLM backends; ROLLSERVE_ENV_URL an environment's
resources server; ROLLSERVE_DRIFTING_POLICY_URL the scripted policy with re-tokenisation drift
(all started by test/clients/python-client.test.ts)."""

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
DRIFTING_POLICY_URL = os.environ.get("ROLLSERVE_DRIFTING_POLICY_URL")


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


def test_a_model_the_backend_does_not_serve_fails_the_samples_saying_so_not_as_reward_0(client: rollserve.Client, prefix: str) -> None:
    task = make_task("What is 3+5?", n=4, id=f"{prefix}-unknown-model")
    task["policy"] = {"model": "Qwen/Qwen3-8B"}  # the scripted policy serves fake-policy only
    groups = list(client.iter_groups(client.submit([task])))
    assert len(groups) == 1
    group = groups[0]
    assert [r.state for r in group] == ["failed"] * 4
    assert group.failures == group.results  # every sample an infrastructure failure: not to train on
    assert group.advantages == [None] * 4
    for result in group.failures:
        assert result.filter is True and result.critical_error == "run"
        assert result.error["code"] == "LLM_BACKEND"
        assert "Qwen/Qwen3-8B" in result.error["message"] and "does not exist" in result.error["message"]
    assert "failures=4" in repr(group)


def test_a_drifted_sample_is_counted_in_status_marked_in_its_group_and_warned(client: rollserve.Client, prefix: str) -> None:
    assert DRIFTING_POLICY_URL, "ROLLSERVE_DRIFTING_POLICY_URL names no policy"
    before = client.status()["rollouts"]["drifted"]
    task = {
        "id": f"{prefix}-drift",
        "env": "counter",
        "n": 2,
        "row": {"responses_create_params": {"input": "count to two"}, "initial_count": 0, "expected_count": 2},
        "policy": {"model": "fake-policy", "base_url": DRIFTING_POLICY_URL},  # chat mode, the default
    }
    submitted = client.submit([task])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups = list(client.iter_training_groups(submitted))
    assert len(groups) == 1
    group = groups[0]
    assert len(group) == 2
    assert group.drifted == group.results  # members still, each marked
    for view in group:
        assert view.drifted is True
        assert view.response_ids is None and view.sequence_error.startswith("re-tokenisation drift")
        assert view.filter is False and view.reward == 1  # a scored sample, only its sequence is gone
    drift = [w for w in caught if issubclass(w.category, rollserve.DriftWarning)]
    assert sorted(str(w.message).split()[1] for w in drift) == sorted(v.id for v in group)
    assert client.status()["rollouts"]["drifted"] == before + 2
    # the same task's views one by one: marked and warned too
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        views = list(client.iter_training(submitted))
    assert [v.drifted for v in views] == [True, True]
    assert len([w for w in caught if issubclass(w.category, rollserve.DriftWarning)]) == 2
    # a drift-free sample is not marked
    plain = client.submit([make_task("hello", id=f"{prefix}-plain")])
    (view,) = list(client.iter_training(plain))
    assert view.drifted is False and view.response_ids is not None


def test_the_async_client_marks_and_warns_drift_too(prefix: str) -> None:
    assert DRIFTING_POLICY_URL
    task = {
        "id": f"{prefix}-adrift",
        "env": "counter",
        "row": {"responses_create_params": {"input": "count to two"}, "initial_count": 0, "expected_count": 2},
        "policy": {"model": "fake-policy", "base_url": DRIFTING_POLICY_URL},
    }

    async def main() -> list:
        async with rollserve.AsyncClient(URL, token=TOKEN, timeout=60) as client:
            submitted = await client.submit([task])
            return [g async for g in client.iter_training_groups(submitted)]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        groups = asyncio.run(main())
    assert [len(g.drifted) for g in groups] == [1]
    assert len([w for w in caught if issubclass(w.category, rollserve.DriftWarning)]) == 1
