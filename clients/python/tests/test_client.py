from __future__ import annotations

import os
import threading
import uuid

import pytest

import rollserve
from conftest import TOKEN, URL, make_task
from rollserve.client import prepare_tasks


def test_submit_a_batch_and_iterate_results(client: rollserve.Client) -> None:
    tasks = [make_task(f"question {i} {uuid.uuid4().hex}") for i in range(5)]
    tasks.append(make_task("wrong answer", expected="something else"))
    submitted = client.submit(tasks)
    assert isinstance(submitted, rollserve.Submission)
    assert len(submitted) == 6
    assert all(not t.existing for t in submitted)
    # ids were generated client-side (uuid4) and the caller's dicts were left alone
    assert all("id" not in t for t in tasks)
    assert all(uuid.UUID(t.task_id) for t in submitted)
    assert submitted.rollout_ids == submitted.task_ids

    results = list(client.iter_results(submitted))
    assert sorted(r.id for r in results) == sorted(submitted.rollout_ids)
    by_id = {r.id: r for r in results}
    assert [by_id[t.task_id].reward for t in submitted] == [1, 1, 1, 1, 1, 0]
    first = by_id[submitted[0].task_id]
    assert isinstance(first, rollserve.Result)
    assert first.ok and first.state == "done" and first.critical_error is None and first.filter is False
    assert first.env == "pyclient" and first.task_id == submitted[0].task_id and first.sample_index == 0
    assert first.advantage is None  # n = 1
    assert len(first.turns) == 1 and first.turns[0]["generation_token_ids"]
    # forward compatible: the whole JSON is kept, fields the client does not model included
    assert first["finished_at"] == first.finished_at and "timing" in first.raw

    # a finished result iterates again (already finished results come first)
    again = list(client.iter_results(submitted[0].task_id))
    assert [r.id for r in again] == [submitted[0].task_id]


def test_get_and_list_with_cursor(client: rollserve.Client, prefix: str) -> None:
    submitted = client.submit([make_task("listed", id=f"{prefix}-l{i}") for i in range(3)] + [make_task("listed group", id=f"{prefix}-g", n=2)])
    client.wait(submitted)
    view = client.get(f"{prefix}-l1")
    assert isinstance(view, rollserve.Rollout)
    assert view.state == "done" and view.finished and view.result is not None and view.result.reward == 1
    group = client.get(f"{prefix}-g")
    assert isinstance(group, rollserve.TaskRollouts)
    assert [r.id for r in group.rollouts] == [f"{prefix}-g:0", f"{prefix}-g:1"]
    assert [r.id for r in client.get_task(f"{prefix}-l0")] == [f"{prefix}-l0"]

    page = client.list_page(limit=2, task_id=f"{prefix}-g")
    assert [r.id for r in page.items] == [f"{prefix}-g:0", f"{prefix}-g:1"]
    # every rollout, two per page: follows the cursor to the end
    everything = [r.id for r in client.list(page_size=2)]
    assert len(everything) == len(set(everything))
    assert {f"{prefix}-l0", f"{prefix}-l1", f"{prefix}-l2", f"{prefix}-g:0", f"{prefix}-g:1"} <= set(everything)
    done = [r.id for r in client.list(state="done", page_size=3)]
    assert f"{prefix}-l2" in done


def test_resubmitting_an_id_is_idempotent(client: rollserve.Client, prefix: str) -> None:
    task = make_task("idempotent", id=f"{prefix}-idem", n=2)
    first = client.submit(task)
    second = client.submit(task)
    assert first[0].existing is False and second[0].existing is True
    assert first[0].rollout_ids == second[0].rollout_ids == [f"{prefix}-idem:0", f"{prefix}-idem:1"]
    # the ids generated for a retry are those of the first attempt: a prepared batch is sent as is
    prepared = prepare_tasks([make_task("retry me")])
    once = client.submit(prepared)
    twice = client.submit(prepared)
    assert once.task_ids == twice.task_ids and twice[0].existing
    assert len(client.wait(twice)) == 1
    assert len(client.get_task(f"{prefix}-idem")) == 2


def test_groups_of_four(client: rollserve.Client, prefix: str) -> None:
    submitted = client.submit([make_task(f"coin {i}", expected="heads", n=4, id=f"{prefix}-coin{i}") for i in range(3)])
    groups = list(client.iter_groups(submitted))
    assert sorted(g.task_id for g in groups) == sorted(submitted.task_ids)
    for group in groups:
        assert isinstance(group, rollserve.Group)
        assert len(group) == 4
        assert [r.sample_index for r in group] == [0, 1, 2, 3]
        assert all(r.task_id == group.task_id for r in group)
        assert set(group.rewards) <= {0, 1}
        # the service's group advantages, every sample's filled in
        assert all(isinstance(a, float) or isinstance(a, int) for a in group.advantages)
        mean = sum(group.rewards) / 4
        for r in group:
            assert (r.advantage > 0) == (r.reward > mean) or r.reward == mean

    # by task id (the client asks each task's n), finished groups come at once
    again = list(client.iter_groups(submitted.task_ids))
    assert sorted(g.task_id for g in again) == sorted(submitted.task_ids)
    assert {g.task_id: g.advantages for g in again} == {g.task_id: g.advantages for g in groups}
    # without refresh the streamed samples are yielded as they are
    plain = list(client.iter_groups(submitted[0], refresh=False))
    assert len(plain) == 1 and len(plain[0]) == 4


def test_training_views_stream_alone_and_in_groups(client: rollserve.Client, prefix: str) -> None:
    submitted = client.submit([make_task(f"coin train {i}", expected="heads", n=4, id=f"{prefix}-tv{i}") for i in range(2)] + [make_task("train one", id=f"{prefix}-tv-one")])
    groups = list(client.iter_training_groups(submitted[:2]))
    assert sorted(g.task_id for g in groups) == sorted(submitted.task_ids[:2])
    for group in groups:
        assert len(group) == 4 and all(isinstance(v, rollserve.TrainingView) for v in group)
        assert [v.sample_index for v in group] == [0, 1, 2, 3]
        assert all(a is not None for a in group.advantages)
        for view in group:
            assert view.sequence_error is None
            assert view.prompt_ids and view.response_ids
            assert len(view.response_mask) == len(view.response_ids) == len(view.response_logprobs) == len(view.response_turn)
        # as GET ?view=training has them
        assert [v.raw for v in group] == [v.raw for v in client.training(group.task_id)]
    [one] = list(client.iter_training(submitted[2]))
    assert one.id == f"{prefix}-tv-one" and one.reward == 1
    assert client.training(one.id).raw == one.raw
    # a view, not the result: no response, messages or per-turn prompts
    assert "response" not in one and "messages" not in one and "prompt_token_ids" not in str(one.turns)


def test_tool_rollouts_carry_their_turns(client: rollserve.Client, prefix: str) -> None:
    task = {
        "id": f"{prefix}-count",
        "env": "counter",
        "row": {"responses_create_params": {"input": "count to two"}, "initial_count": 0, "expected_count": 2},
        "policy": {"model": "fake-policy"},
    }
    [result] = client.wait(client.submit(task))
    assert result.reward == 1
    assert len(result.turns) == 2
    assert result.turns[0]["tool_calls"][0]["name"] == "increment_counter"


def test_cancel(client: rollserve.Client, prefix: str) -> None:
    client.submit(make_task("hang forever", id=f"{prefix}-hang"))
    results = []
    thread = threading.Thread(target=lambda: results.extend(client.iter_results(f"{prefix}-hang")))
    thread.start()
    view = client.cancel(f"{prefix}-hang")
    assert isinstance(view, rollserve.Rollout)
    assert view.state == "cancelled"
    assert view.result is not None and view.result.critical_error == "cancelled" and view.result.filter is True
    thread.join()
    assert [r.state for r in results] == ["cancelled"]

    # a whole task's group
    client.submit(make_task("hang as a group", id=f"{prefix}-hangs", n=2))
    group = client.cancel(f"{prefix}-hangs")
    assert isinstance(group, rollserve.TaskRollouts)
    assert [r.state for r in group.rollouts] == ["cancelled", "cancelled"]


def test_status(client: rollserve.Client) -> None:
    assert client.health()
    status = client.status()
    assert set(status["environments"]) >= {"pyclient", "counter"}
    assert {"init", "run", "eval"} <= set(status["stages"])
    assert status["llm_backends"]


def test_backends_add_list_remove(client: rollserve.Client, prefix: str) -> None:
    policy = os.environ["ROLLSERVE_POLICY_URL"]
    added = client.backends.add(policy, id=f"{prefix}-extra", max_concurrency=4)
    assert added == f"{prefix}-extra"
    assert policy in str(client.backends.list())
    assert f"{prefix}-extra" in str(client.backends.list())
    client.backends.remove(added)
    assert f"{prefix}-extra" not in str(client.backends.list())
    with pytest.raises(rollserve.RolloutServiceError) as missing:
        client.backends.remove(added)
    assert missing.value.status == 404 and missing.value.code == "NOT_FOUND"
    with pytest.raises(rollserve.RolloutServiceError) as invalid:
        client.backends.add("not a url")
    assert invalid.value.status == 422 and invalid.value.code == "UNPROCESSABLE"


def test_errors_carry_status_code_and_message(client: rollserve.Client) -> None:
    with pytest.raises(rollserve.RolloutServiceError) as missing:
        client.get("no-such-rollout")
    assert missing.value.status == 404
    assert missing.value.code == "NOT_FOUND"
    assert "no-such-rollout" in missing.value.message
    with pytest.raises(rollserve.RolloutServiceError) as unknown_env:
        client.submit({"env": "chess", "row": {"responses_create_params": {"input": "e4"}}, "policy": {"model": "fake-policy"}})
    assert unknown_env.value.status == 404
    with pytest.raises(rollserve.RolloutServiceError) as invalid:
        client.submit({"env": "pyclient", "row": {}, "policy": {}})
    assert invalid.value.status == 422 and invalid.value.details
    with pytest.raises(rollserve.RolloutServiceError) as stream:
        list(client.iter_results(["no-such-task"]))
    assert stream.value.status == 404


def test_token_is_required() -> None:
    assert TOKEN, "the suite runs against a service with a token"
    for token in (None, "wrong-token"):
        with rollserve.Client(URL, token=token) as anonymous:
            assert anonymous.health()  # /health needs no token
            with pytest.raises(rollserve.RolloutServiceError) as denied:
                anonymous.status()
            assert denied.value.status == 401
            assert denied.value.code == "UNAUTHORIZED"
            assert "token" in denied.value.message
            with pytest.raises(rollserve.RolloutServiceError) as stream_denied:
                list(anonymous.iter_results(["anything"]))
            assert stream_denied.value.status == 401


def test_unreachable_service_is_a_connection_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with rollserve.Client(f"http://127.0.0.1:{port}", retries=2, backoff=0.01) as dead:
        with pytest.raises(rollserve.ServiceConnectionError) as error:
            dead.status()
    assert error.value.status is None and error.value.code == "CONNECTION"
    assert isinstance(error.value, rollserve.RolloutServiceError)


def test_a_dropped_stream_is_reopened_without_repeats(prefix: str) -> None:
    flaky = os.environ["ROLLSERVE_FLAKY_URL"]  # cuts result streams in the middle of a line
    with rollserve.Client(flaky, token=TOKEN, backoff=0.01) as client:
        submitted = client.submit([make_task(f"slow {20 * i} #{i}", id=f"{prefix}-drop{i}") for i in range(8)])
        results = list(client.iter_results(submitted))
        assert sorted(r.id for r in results) == sorted(submitted.rollout_ids)
        assert len(results) == len({r.id for r in results})
        assert all(r.reward == 1 for r in results)
        assert client.reconnects >= 1


def test_long_id_lists_are_split_over_several_streams(client: rollserve.Client) -> None:
    # 400 uuid ids are ~15 KB of query string: more than one stream reads them
    submitted = client.submit([make_task(f"many {i}") for i in range(400)])
    results = list(client.iter_results(submitted))
    assert len(results) == 400 and len({r.id for r in results}) == 400


def test_leaving_a_stream_early_closes_it(client: rollserve.Client, prefix: str) -> None:
    client.submit([make_task("finished early", id=f"{prefix}-early"), make_task("hang early", id=f"{prefix}-early-hang")])
    results = client.iter_results([f"{prefix}-early", f"{prefix}-early-hang"])
    first = next(results)
    assert first.id == f"{prefix}-early"
    readers = [t for t in threading.enumerate() if t.name.startswith("rollserve-stream-")]
    assert readers
    results.close()  # as a `break` out of the loop does
    for thread in readers:
        thread.join()
    client.cancel(f"{prefix}-early-hang")


def test_dynamic_sampling_keeps_the_informative_groups(client: rollserve.Client, prefix: str) -> None:
    # "same" groups score 1 in every sample (all-equal), "coin" groups alternate heads and tails
    kinds = ["same", "coin", "same", "coin", "coin"]
    pool = [make_task(f"{kind} ds {i}" if kind == "coin" else f"same ds {i}", expected="heads" if kind == "coin" else None, n=2, id=f"{prefix}-ds{i}") for i, kind in enumerate(kinds)]
    sampling = client.submit_sampling(pool, groups=2, max_in_flight=1)
    assert isinstance(sampling, rollserve.Sampling)
    assert sampling.groups == 2 and sampling.max_groups == 5 and sampling.pool == 5 and sampling.tried == 1
    groups = client.iter_sampled_groups(sampling, view="training", max_response_tokens=2)
    kept = list(groups)
    assert [g.task_id for g in kept] == [f"{prefix}-ds1", f"{prefix}-ds3"]
    for group in kept:
        assert sorted(group.rewards) == [0, 1]
        assert all(isinstance(v, rollserve.TrainingView) and len(v.response_ids) <= 2 for v in group)
    end = groups.sampling
    assert end is not None and end.state == "done" and end.finished
    assert (end.tried, end.kept, end.dropped_all_equal, end.filtered, end.cancelled) == (4, 2, 2, 0, 0)
    assert end.kept_task_ids == [f"{prefix}-ds1", f"{prefix}-ds3"]
    assert client.sampling(sampling.id).raw == end.raw
    # the group never tried was never started; every group tried is readable
    with pytest.raises(rollserve.RolloutServiceError) as missing:
        client.get(f"{prefix}-ds4")
    assert missing.value.status == 404
    assert all(r.finished for r in client.get_task(f"{prefix}-ds0"))
    # stopping a finished sampling answers it as it is; an unknown one is a 404
    assert client.stop_sampling(sampling).state == "done"
    with pytest.raises(rollserve.RolloutServiceError) as unknown:
        client.sampling(f"{prefix}-nope")
    assert unknown.value.status == 404
    with pytest.raises(rollserve.RolloutServiceError) as bad:
        client.submit_sampling(pool, groups=6)
    assert bad.value.status == 422


def test_training_view_cap_and_truncation(client: rollserve.Client, prefix: str) -> None:
    [task] = client.submit(make_task("a rather long answer to cut", id=f"{prefix}-cap"))
    client.wait(task)
    whole = client.training(task.task_id)
    assert isinstance(whole, rollserve.TrainingView)
    assert whole.finish_reason == "stop" and whole.truncated is False
    assert [t["finish_reason"] for t in whole.turns] == ["stop"]
    cut = client.training(task.task_id, max_response_tokens=3)
    assert cut.truncated is True and cut.response_ids == whole.response_ids[:3] and cut.response_mask == whole.response_mask[:3]
    assert cut.turns[0]["generation_span"] == [0, 3]
    [streamed] = list(client.iter_training(task, max_response_tokens=3))
    assert streamed.raw == cut.raw
