"""The asyncio client: request/response calls run the sync client's in worker threads
(``asyncio.to_thread``); result streams are read by threads feeding an asyncio.Queue, so nothing
blocks the event loop."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from ._transport import ResultStream
from .client import Client, Grouper, Ids, SampledGroups, Task, WeightUpdate, _stale_filter, warn_drift
from .models import Group, Page, Result, Rollout, Sampling, Submission, TaskRollouts, TrainingView, as_id_list, materialize, warned


class AsyncBackends:
    def __init__(self, client: Client) -> None:
        self._c = client

    async def list(self) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(self._c.backends.list)

    async def add(self, base_url: str, **options: Any) -> str:
        return await asyncio.to_thread(lambda: self._c.backends.add(base_url, **options))

    async def remove(self, id: str) -> None:
        await asyncio.to_thread(self._c.backends.remove, id)


class AsyncWeights:
    """The asyncio twin of :class:`rollserve.client.Weights`.

    >>> async with client.weights.update(mode="abort") as update:
    ...     await sync_weights_into_vllm(step)
    ...     update.version = step
    """

    def __init__(self, client: Client) -> None:
        self._c = client

    async def state(self) -> Dict[str, Any]:
        return await asyncio.to_thread(self._c.weights.state)

    async def announce(self, version: int, backends: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self._c.weights.announce, version, backends)

    async def pause(self, mode: str = "abort") -> Dict[str, Any]:
        return await asyncio.to_thread(self._c.weights.pause, mode)

    async def resume(self, version: Optional[int] = None, backends: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        return await asyncio.to_thread(self._c.weights.resume, version, backends)

    @contextlib.asynccontextmanager
    async def update(self, mode: str = "abort") -> AsyncIterator[WeightUpdate]:
        update = WeightUpdate(await self.pause(mode))
        try:
            yield update
        except BaseException:
            update.resumed = await self.resume()
            raise
        update.resumed = await self.resume(update.version, update.backends)


class AsyncClient:
    """The asyncio twin of :class:`rollserve.Client` (same arguments, same methods, awaited;
    ``iter_results``/``iter_groups``/``list`` are async iterators).

    >>> async with AsyncClient(url) as client:
    ...     submitted = await client.submit(tasks)
    ...     async for group in client.iter_groups(submitted):
    ...         train_on(group)
    """

    def __init__(self, url: str, token: Optional[str] = None, timeout: Optional[float] = 60.0, **options: Any) -> None:
        self.sync = Client(url, token, timeout, **options)
        self.url = url
        self.backends = AsyncBackends(self.sync)
        self.weights = AsyncWeights(self.sync)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        self.sync.close()

    @property
    def reconnects(self) -> int:
        return self.sync.reconnects

    async def health(self) -> bool:
        return await asyncio.to_thread(self.sync.health)

    async def status(self) -> Dict[str, Any]:
        return await asyncio.to_thread(self.sync.status)

    async def submit(self, tasks: Union[Task, Iterable[Task]], **options: Any) -> Submission:
        return await asyncio.to_thread(lambda: self.sync.submit(tasks, **options))

    async def submit_sampling(self, tasks: Iterable[Task], **options: Any) -> Sampling:
        """As :meth:`Client.submit_sampling` (``groups=``, ``max_groups=``, ...)."""
        return await asyncio.to_thread(lambda: self.sync.submit_sampling(tasks, **options))

    async def sampling(self, id: Union[str, Sampling]) -> Sampling:
        return await asyncio.to_thread(self.sync.sampling, id)

    async def stop_sampling(self, id: Union[str, Sampling]) -> Sampling:
        return await asyncio.to_thread(self.sync.stop_sampling, id)

    def iter_sampled_groups(self, sampling: Union[str, Sampling], *, view: Optional[str] = None, max_response_tokens: Optional[int] = None) -> "AsyncSampledGroups":
        """As :meth:`Client.iter_sampled_groups`, an async iterator (read by a worker thread);
        its ``sampling`` holds the final counts once it ends."""
        return AsyncSampledGroups(self.sync.iter_sampled_groups(sampling, view=view, max_response_tokens=max_response_tokens))

    async def get(self, id: str) -> Union[Rollout, TaskRollouts]:
        return await asyncio.to_thread(self.sync.get, id)

    async def get_task(self, task_id: str) -> List[Rollout]:
        return await asyncio.to_thread(self.sync.get_task, task_id)

    async def list_page(self, **query: Any) -> Page:
        return await asyncio.to_thread(lambda: self.sync.list_page(**query))

    async def list(self, *, state: Optional[str] = None, task_id: Optional[str] = None, page_size: int = 500, cursor: Optional[str] = None) -> AsyncIterator[Rollout]:
        while True:
            page = await self.list_page(cursor=cursor, limit=page_size, state=state, task_id=task_id)
            for item in page.items:
                yield item
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel(self, id: str, *, wait: bool = True) -> Union[Rollout, TaskRollouts]:
        return await asyncio.to_thread(lambda: self.sync.cancel(id, wait=wait))

    async def _stream(self, ids: List[str], view: Optional[str] = None, watch: bool = False, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None) -> AsyncIterator[Dict[str, Any]]:
        """As :meth:`Client._stream`: ``/v1/status`` asked after every ``warning_check`` seconds
        without a result (at once with ``watch``); with ``watch`` its warnings raise."""
        if watch:
            await asyncio.to_thread(self.sync._check_warnings)
        loop = asyncio.get_running_loop()
        said: set = set()
        items: "asyncio.Queue[Tuple[str, Any]]" = asyncio.Queue()

        def emit(item: Tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(items.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody is listening
                pass

        stream = ResultStream(self.sync._t, ids, emit, view, max_response_tokens, max_staleness).start()
        remaining = len(stream.chunks)
        try:
            while remaining:
                try:
                    kind, value = await asyncio.wait_for(items.get(), self.sync.warning_check)
                except asyncio.TimeoutError:
                    await asyncio.to_thread(self.sync._check_warnings, watch, said)
                    continue
                if kind == "result":
                    yield value
                elif kind == "done":
                    remaining -= 1
                else:
                    raise value
        finally:
            stream.stop()
            self.sync.reconnects += stream.reconnects

    async def iter_results(self, ids: Ids, *, max_staleness: Optional[int] = None, stale: str = "flag") -> AsyncIterator[Result]:
        """As :meth:`Client.iter_results`, without blocking the loop."""
        ids = materialize(ids)
        drop = _stale_filter(stale)
        async for raw in self._stream(as_id_list(ids), None, warned(ids), max_staleness=max_staleness):
            if not (drop and raw.get("stale")):
                yield Result.from_json(raw)

    async def wait(self, ids: Ids, *, max_staleness: Optional[int] = None, stale: str = "flag") -> List[Result]:
        results = [r async for r in self.iter_results(ids, max_staleness=max_staleness, stale=stale)]
        return sorted(results, key=lambda r: (r.task_id, r.sample_index))

    async def training(self, id: str, *, max_response_tokens: Optional[int] = None) -> Union[TrainingView, List[Optional[TrainingView]]]:
        return await asyncio.to_thread(lambda: self.sync.training(id, max_response_tokens=max_response_tokens))

    async def iter_training(self, ids: Ids, *, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None, stale: str = "flag") -> AsyncIterator[TrainingView]:
        """As :meth:`Client.iter_training`, without blocking the loop."""
        ids = materialize(ids)
        drop = _stale_filter(stale)
        async for raw in self._stream(as_id_list(ids), "training", warned(ids), max_response_tokens=max_response_tokens, max_staleness=max_staleness):
            if drop and raw.get("stale"):
                continue
            view = TrainingView.from_json(raw)
            warn_drift([view])
            yield view

    def iter_training_groups(self, tasks: Ids, *, refresh: bool = True, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None, stale: str = "flag") -> AsyncIterator[Group]:
        """As :meth:`Client.iter_training_groups`, without blocking the loop."""
        return self._groups(tasks, refresh, "training", max_response_tokens=max_response_tokens, max_staleness=max_staleness, drop_stale=_stale_filter(stale))

    def iter_groups(self, tasks: Ids, *, refresh: bool = True, max_staleness: Optional[int] = None, stale: str = "flag") -> AsyncIterator[Group]:
        """As :meth:`Client.iter_groups`, without blocking the loop."""
        return self._groups(tasks, refresh, None, max_staleness=max_staleness, drop_stale=_stale_filter(stale))

    async def _groups(self, tasks: Ids, refresh: bool, view: Optional[str], *, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None, drop_stale: bool = False) -> AsyncIterator[Group]:
        tasks = materialize(tasks)
        grouper = Grouper(await asyncio.to_thread(self.sync._members, tasks))
        async for raw in self._stream(list(grouper.members), view, warned(tasks), max_response_tokens=max_response_tokens, max_staleness=max_staleness):
            group = grouper.add(TrainingView.from_json(raw) if view else Result.from_json(raw))
            if group is None:
                continue
            if refresh and Grouper.lacks_advantages(group):
                group = Grouper.refreshed_training(group, await self.training(group.task_id, max_response_tokens=max_response_tokens)) if view else Grouper.refreshed(group, await self.get(group.task_id))
            group = Grouper.fresh(group, drop_stale)
            if group is not None:
                warn_drift(group.results)
                yield group


class AsyncSampledGroups:
    """A dynamic sampling's kept groups as an async iterator: the sync reader runs in a worker
    thread, one group at a time; ``sampling`` holds the final counts once it ends."""

    def __init__(self, groups: SampledGroups) -> None:
        self._groups = groups

    @property
    def sampling(self) -> Optional[Sampling]:
        return self._groups.sampling

    def __aiter__(self) -> "AsyncSampledGroups":
        return self

    async def __anext__(self) -> Group:
        group = await asyncio.to_thread(next, self._groups, None)
        if group is None:
            raise StopAsyncIteration
        return group

    async def aclose(self) -> None:
        await asyncio.to_thread(self._groups.close)
