from __future__ import annotations

import asyncio

import pytest

import rollserve
from conftest import TOKEN, URL, make_task


def test_async_client_submits_streams_groups_and_cancels(prefix: str) -> None:
    async def main() -> None:
        async with rollserve.AsyncClient(URL, token=TOKEN) as client:
            assert await client.health()
            status = await client.status()
            assert "pyclient" in status["environments"]

            submitted = await client.submit([make_task(f"slow {10 * i} async {i}", id=f"{prefix}-a{i}") for i in range(6)])
            # the loop stays free while results stream: a ticker runs alongside
            ticks = 0
            streaming = True

            async def ticker() -> None:
                nonlocal ticks
                while streaming:
                    ticks += 1
                    await asyncio.sleep(0.001)

            tick_task = asyncio.create_task(ticker())
            results = [r async for r in client.iter_results(submitted)]
            streaming = False
            await tick_task
            assert sorted(r.id for r in results) == sorted(submitted.rollout_ids)
            assert all(r.reward == 1 for r in results)
            assert ticks > 0

            groups_submitted = await client.submit([make_task(f"coin async {i}", expected="heads", n=4, id=f"{prefix}-ag{i}") for i in range(2)])
            groups = [g async for g in client.iter_groups(groups_submitted)]
            assert sorted(g.task_id for g in groups) == sorted(groups_submitted.task_ids)
            assert all(len(g) == 4 and all(a is not None for a in g.advantages) for g in groups)
            training = [g async for g in client.iter_training_groups(groups_submitted)]
            assert sorted(g.task_id for g in training) == sorted(groups_submitted.task_ids)
            assert all(len(g) == 4 and all(isinstance(v, rollserve.TrainingView) and v.advantage is not None for v in g) for g in training)
            views = [v async for v in client.iter_training(submitted)]
            assert sorted(v.id for v in views) == sorted(submitted.rollout_ids)
            assert (await client.training(views[0].id)).raw == views[0].raw

            view = await client.get(f"{prefix}-a0")
            assert isinstance(view, rollserve.Rollout) and view.state == "done"
            listed = [r.id async for r in client.list(task_id=f"{prefix}-ag0", page_size=3)]
            assert listed == [f"{prefix}-ag0:{i}" for i in range(4)]

            await client.submit(make_task("hang async", id=f"{prefix}-ahang"))
            waiting = asyncio.create_task(client.wait(f"{prefix}-ahang"))
            cancelled = await client.cancel(f"{prefix}-ahang")
            assert cancelled.state == "cancelled"
            [result] = await waiting
            assert result.critical_error == "cancelled"

            backends = await client.backends.list()
            assert backends
            with pytest.raises(rollserve.RolloutServiceError) as missing:
                await client.get("missing-async")
            assert missing.value.status == 404

    asyncio.run(main())


def test_async_streams_run_side_by_side(prefix: str) -> None:
    async def main() -> None:
        async with rollserve.AsyncClient(URL, token=TOKEN) as client:
            hung = await client.submit(make_task("hang side", id=f"{prefix}-side-hang"))
            fast = await client.submit(make_task("fast side", id=f"{prefix}-side-fast"))
            order: list = []

            async def collect(ids: rollserve.Submission) -> None:
                async for r in client.iter_results(ids):
                    order.append(r.id)

            async def fast_then_cancel() -> None:
                await collect(fast)
                await client.cancel(f"{prefix}-side-hang")

            # one stream waits on a rollout that never ends until the other has finished
            await asyncio.gather(collect(hung), fast_then_cancel())
            assert order == [f"{prefix}-side-fast", f"{prefix}-side-hang"]

    asyncio.run(main())


def test_async_dynamic_sampling_and_training_cap(prefix: str) -> None:
    async def main() -> None:
        async with rollserve.AsyncClient(URL, token=TOKEN) as client:
            pool = [make_task(f"same ads {i}", n=2, id=f"{prefix}-ads{i}") for i in range(2)] + [make_task("coin ads", expected="heads", n=2, id=f"{prefix}-ads-coin")]
            sampling = await client.submit_sampling(pool, groups=1, max_in_flight=1, metric="reward")
            groups = client.iter_sampled_groups(sampling)
            kept = [g async for g in groups]
            assert [g.task_id for g in kept] == [f"{prefix}-ads-coin"]
            assert all(isinstance(r, rollserve.Result) for r in kept[0])
            assert groups.sampling is not None and groups.sampling.state == "done"
            assert (groups.sampling.tried, groups.sampling.kept, groups.sampling.dropped_all_equal) == (3, 1, 2)
            assert (await client.sampling(sampling.id)).raw == groups.sampling.raw

            # a sampling stopped while its group runs: cancelled, and its stream ends with the counts
            hanging = await client.submit_sampling([make_task("hang ads", n=2, id=f"{prefix}-ads-hang")], groups=1)
            stopped = await client.stop_sampling(hanging)
            assert (stopped.state, stopped.cancelled) == ("stopped", 1)
            rest = client.iter_sampled_groups(hanging.id)
            assert [g async for g in rest] == [] and rest.sampling is not None and rest.sampling.state == "stopped"

            view = await client.training(f"{prefix}-ads0:0", max_response_tokens=1)
            assert view.truncated is True and len(view.response_ids) == 1

    asyncio.run(main())
