"""Weight versions, pauses for a weight update and staleness bounds, sync and asyncio, against the
real service. Each test leaves generation running (a pause is resumed however it ends)."""

from __future__ import annotations

import asyncio
import time

import pytest

import rollserve
from conftest import TOKEN, URL, make_task


def _until(check) -> None:
    # (no time limit of its own: the suite's runner bounds it)
    while not check():
        time.sleep(0.02)


def test_a_weight_update_pauses_generation_and_turns_keep_their_versions(client: rollserve.Client, prefix: str) -> None:
    start = client.weights.announce(100)
    assert start["newest"] >= 100 and start["default"] == 100 and start["pause"] is None
    assert all(backend["weight_version"] == 100 for backend in client.backends.list())
    assert client.status()["weights"]["newest"] == start["newest"]

    # three turns in flight when the update comes: aborted, then generated again on the new weights
    submitted = client.submit([make_task(f"slow 4000 update {i}", id=f"{prefix}-u{i}") for i in range(3)])
    _until(lambda: client.weights.state()["in_flight"] == 3)
    with client.weights.update(mode="abort") as update:
        assert update.paused["mode"] == "abort" and update.paused["aborted"] == 3
        assert client.weights.state()["pause"]["mode"] == "abort"
        update.version = 101
    assert update.resumed is not None and update.resumed["default"] == 101 and update.resumed["pause"] is None
    results = client.wait(submitted)
    assert [r.reward for r in results] == [1, 1, 1]
    assert all(r.weight_version_min == 101 and r.weight_version_max == 101 and not r.stale for r in results)
    assert all([turn["weight_version"] for turn in r.turns] == [101] for r in results)

    # a newer version: those samples are one behind
    client.weights.announce(102)
    flagged = client.wait(submitted, max_staleness=0)
    assert [r.stale for r in flagged] == [True, True, True]
    assert client.wait(submitted, max_staleness=0, stale="filter") == []
    assert [r.stale for r in client.wait(submitted, max_staleness=1, stale="filter")] == [False, False, False]
    views = list(client.iter_training(submitted, max_staleness=0))
    assert all(v.stale and v.weight_version_min == 101 for v in views)
    with pytest.raises(ValueError):
        client.wait(submitted, max_staleness=0, stale="drop")


def test_an_update_that_fails_goes_on_on_the_old_weights(client: rollserve.Client, prefix: str) -> None:
    before = client.weights.announce(200)
    with pytest.raises(RuntimeError):
        with client.weights.update(mode="finish") as update:
            assert update.paused["mode"] == "finish" and update.paused["aborted"] == 0
            raise RuntimeError("the weight sync failed")
    after = client.weights.state()
    assert after["pause"] is None and after["default"] == 200 and after["newest"] == before["newest"]
    [result] = client.wait(client.submit(make_task("after a failed update", id=f"{prefix}-f")))
    assert result.weight_version_min == 200 and result.weight_version_max == 200


def test_a_submit_staleness_bound_filters_stale_groups(client: rollserve.Client, prefix: str) -> None:
    client.weights.announce(300)
    submitted = client.submit([make_task(f"slow 3000 bound {i}", id=f"{prefix}-b{i}", n=2, staleness={"max_versions": 0, "action": "filter"}) for i in range(2)])
    _until(lambda: client.weights.state()["in_flight"] == 4)
    # announced without a pause: the turns under way keep the version they started on, and finish
    # when the newest is 301: stale, filtered (not an infrastructure failure)
    client.weights.announce(301)
    results = client.wait(submitted)
    assert all([turn["weight_version"] for turn in r.turns] == [300] for r in results)
    assert all(r.stale and r.filter and r.critical_error is None for r in results)
    assert list(client.iter_groups(submitted, stale="filter")) == []
    assert all(len(g) == 2 for g in client.iter_groups(submitted))


def test_the_async_client_pauses_and_resumes(prefix: str) -> None:
    async def main() -> None:
        async with rollserve.AsyncClient(URL, token=TOKEN) as client:
            await client.weights.announce(400)
            submitted = await client.submit([make_task(f"slow 3000 async update {i}", id=f"{prefix}-au{i}") for i in range(2)])
            while (await client.weights.state())["in_flight"] < 2:
                await asyncio.sleep(0.02)
            async with client.weights.update(mode="abort") as update:
                assert update.paused["aborted"] == 2
                update.version = 401
            results = await client.wait(submitted)
            assert all(r.weight_version_min == 401 and r.reward == 1 for r in results)
            assert [r.id for r in await client.wait(submitted, max_staleness=0, stale="filter")] == [r.id for r in results]
            await client.weights.announce(402)
            assert [r async for r in client.iter_results(submitted, max_staleness=0, stale="filter")] == []
            paused = await client.weights.pause("finish")
            assert paused["state"]["pause"]["mode"] == "finish"
            resumed = await client.weights.resume()
            assert resumed["pause"] is None and resumed["default"] == 402

    asyncio.run(main())
