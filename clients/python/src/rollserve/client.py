"""The synchronous client."""

from __future__ import annotations

import contextlib
import json
import queue
import time
import uuid
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ._transport import _NETWORK, ResultStream, Transport
from .errors import DriftWarning, RolloutServiceError, ServiceConnectionError, ServiceWarning, ServiceWarningError
from .models import Group, Page, Result, Rollout, Sampling, Submission, SubmittedTask, TaskRollouts, TrainingView, as_id_list, materialize, warned

Task = Mapping[str, Any]
Ids = Union[str, SubmittedTask, Iterable[Union[str, SubmittedTask]]]

# The service accepts up to 10,000 tasks per body.
MAX_BATCH = 10_000


def prepare_tasks(tasks: Union[Task, Iterable[Task]]) -> List[Dict[str, Any]]:
    """Copies of the tasks, each with an ``id`` (a uuid4 where it had none), so that sending
    them again (a retry after a timeout) can not start them twice."""
    items = [tasks] if isinstance(tasks, Mapping) else list(tasks)
    prepared: List[Dict[str, Any]] = []
    for task in items:
        if not isinstance(task, Mapping):
            raise TypeError(f"a task is a mapping (env, row, policy, ...), not {type(task).__name__}")
        task = dict(task)
        if not task.get("id"):
            task["id"] = str(uuid.uuid4())
        prepared.append(task)
    if not prepared:
        raise ValueError("submit needs at least one task")
    return prepared


def parse_view(raw: Dict[str, Any]) -> Union[Rollout, TaskRollouts]:
    return TaskRollouts.from_json(raw) if "rollouts" in raw and "id" not in raw else Rollout.from_json(raw)


def parse_training(raw: Dict[str, Any]) -> Union[TrainingView, List[Optional[TrainingView]]]:
    """GET ?view=training: a rollout's view, or for a task its samples' (None: not finished)."""
    if "rollouts" in raw and "id" not in raw:
        return [None if v is None else TrainingView.from_json(v) for v in raw["rollouts"]]
    return TrainingView.from_json(raw)


def warn_drift(views: Iterable[Any]) -> None:
    """A DriftWarning per drifted training view: it is a member like the others, with None
    where its sequence would be, so a trainer should hear of it rather than trip on it."""
    for view in views:
        if getattr(view, "drifted", False):
            warnings.warn(
                f"sample {view.id} of task {view.task_id} has no sequence: {view.sequence_error} "
                '(TrainingView.drifted; policy.generation "tokens" avoids it)',
                DriftWarning,
                stacklevel=3,
            )


class Grouper:
    """Collects streamed results into whole groups, given each task's rollout ids."""

    def __init__(self, members: Mapping[str, List[str]]) -> None:
        self.members = {task: set(ids) for task, ids in members.items()}
        self.buckets: Dict[str, Dict[str, Union[Result, TrainingView]]] = {task: {} for task in members}

    def add(self, result: Union[Result, TrainingView]) -> Optional[Group]:
        bucket = self.buckets.get(result.task_id)
        if bucket is None or result.id not in self.members[result.task_id]:
            return None
        bucket[result.id] = result
        if len(bucket) < len(self.members[result.task_id]):
            return None
        del self.buckets[result.task_id]
        return Group(result.task_id, sorted(bucket.values(), key=lambda r: r.sample_index))

    @staticmethod
    def lacks_advantages(group: Group) -> bool:
        # Streamed before the group was complete, a sample may not carry the advantage the
        # service has filled in since; GET gives the finished group as the service has it.
        return len(group) > 1 and any(r.advantage is None for r in group.results)

    @staticmethod
    def fresh(group: Group, drop_stale: bool) -> Optional[Group]:
        """The group without its stale samples when they are dropped (None when none is left)."""
        if not drop_stale:
            return group
        kept = [sample for sample in group.results if not sample.stale]
        if not kept:
            return None
        return group if len(kept) == len(group.results) else Group(task_id=group.task_id, results=kept)

    @staticmethod
    def refreshed_training(group: Group, views: Union[TrainingView, List[Optional[TrainingView]]]) -> Group:
        if isinstance(views, list) and len(views) == len(group) and all(v is not None for v in views):
            return Group(group.task_id, sorted((v for v in views if v is not None), key=lambda v: v.sample_index))
        return group

    @staticmethod
    def refreshed(group: Group, view: Union[Rollout, TaskRollouts]) -> Group:
        if isinstance(view, TaskRollouts):
            results = [r.result for r in view.rollouts]
            if len(results) == len(group) and all(r is not None for r in results):
                return Group(group.task_id, sorted((r for r in results if r is not None), key=lambda r: r.sample_index))
        return group


class SampledGroups:
    """The kept groups of a dynamic sampling as the service keeps them (an iterator of Group:
    Results, or TrainingViews with ``view="training"``); once it ends, ``sampling`` holds its
    final counts (None until then). A dropped stream is reopened and groups seen are skipped."""

    def __init__(self, transport: Transport, id: str, view: Optional[str], max_response_tokens: Optional[int]) -> None:
        self._t = transport
        self.id = id
        self.view = view
        self.max_response_tokens = max_response_tokens
        #: The sampling's final status, once its stream has ended.
        self.sampling: Optional[Sampling] = None
        self.reconnects = 0
        self._seen: set = set()
        self._conn: Any = None
        self._response: Any = None
        self._failures = 0

    def __iter__(self) -> "SampledGroups":
        return self

    def __next__(self) -> Group:
        while self.sampling is None:
            try:
                if self._response is None:
                    self._conn, self._response = self._t.open_sampling_stream(self.id, self.view, self.max_response_tokens)
                line = self._response.readline()
                if not line:
                    raise ConnectionError("the sampling stream ended before its counts")
                if not line.strip():
                    continue
                item = json.loads(line)
            except RolloutServiceError as error:
                self.close()
                if error.status is None or error.status < 500 or self._failures >= self._t.retries:
                    raise
                self._retry()
                continue
            except _NETWORK as error:  # (a ConnectionError too: the stream ended early)
                self.close()
                if self._failures >= self._t.retries:
                    raise ServiceConnectionError(f"the sampling stream dropped: {type(error).__name__}: {error}", method="GET", path=f"/v1/rollouts/sampling/{self.id}/stream") from error
                self._retry()
                continue
            self._failures = 0
            if "sampling" in item and "task_id" not in item:
                self.sampling = Sampling.from_json(item["sampling"])
                self.close()
                break
            if item["task_id"] in self._seen:
                continue
            self._seen.add(item["task_id"])
            parse = TrainingView.from_json if self.view else Result.from_json
            return Group(item["task_id"], [parse(r) for r in item["results"]])
        raise StopIteration

    def _retry(self) -> None:
        self.reconnects += 1
        time.sleep(self._t.delay(self._failures))
        self._failures += 1

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._response = None

    def __enter__(self) -> "SampledGroups":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Backends:
    """The service's LLM backends (the policy's inference servers), managed at run time."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def list(self) -> List[Dict[str, Any]]:
        return list(self._t.request("GET", "/v1/llm-backends")["backends"])

    def add(self, base_url: str, *, id: Optional[str] = None, model: Optional[str] = None, api_key: Optional[str] = None, max_concurrency: Optional[int] = None) -> str:
        """Adds an OpenAI-compatible server (``http://host:port/v1``); returns its id. Retried
        on connection errors only when ``id`` is given (then a repeat names the same backend)."""
        body = {"base_url": base_url, "id": id, "model": model, "api_key": api_key, "max_concurrency": max_concurrency}
        answer = self._t.request("POST", "/v1/llm-backends", {k: v for k, v in body.items() if v is not None}, retry=id is not None)
        return str(answer["id"])

    def remove(self, id: str) -> None:
        self._t.request("DELETE", f"/v1/llm-backends/{_seg(id)}", retry=False)


def _sampling_id(sampling: Union[str, Sampling]) -> str:
    return sampling.id if isinstance(sampling, Sampling) else sampling


class WeightUpdate:
    """A weight update under way (:meth:`Weights.update`): set ``version`` to the version the
    backends serve once the new weights are loaded; generation resumes on it. Left None (or on an
    exception), the update failed and generation resumes on the old weights."""

    def __init__(self, paused: Dict[str, Any]) -> None:
        #: What the pause answered: its mode, the generations in flight, how many were aborted.
        self.paused = paused
        self.version: Optional[int] = None
        self.backends: Optional[Sequence[str]] = None
        #: What the resume answered (the weight state and ``paused_ms``), once it has.
        self.resumed: Optional[Dict[str, Any]] = None


def _stale_filter(stale: str) -> bool:
    if stale not in ("flag", "filter"):
        raise ValueError(f"stale is 'flag' or 'filter', not {stale!r}")
    return stale == "filter"


class Weights:
    """Weight versions and pauses of generation for a weight update (asynchronous RL): the
    trainer says which integer version the backends serve after each weight sync, and every
    turn of every rollout records the version that generated it (``turn["weight_version"]``,
    ``Result.weight_version_min``/``max``).

    >>> with client.weights.update(mode="abort") as update:   # generation paused, in-flight aborted
    ...     sync_weights_into_vllm(step)
    ...     update.version = step                             # resumed on it; an exception: on the old
    """

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def state(self) -> Dict[str, Any]:
        """The versions announced (``default``, per backend), the ``newest``, the ``pause`` if any."""
        return dict(self._t.request("GET", "/v1/weights"))

    def announce(self, version: int, backends: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """The backends named (all, and any added later, when none) serve ``version`` now."""
        body: Dict[str, Any] = {"version": version, **({"backends": list(backends)} if backends else {})}
        return dict(self._t.request("POST", "/v1/weights", body))

    def pause(self, mode: str = "abort") -> Dict[str, Any]:
        """Pauses generation: no new policy call starts; those in flight are aborted (redone on the
        new weights after the resume) or, with ``mode="finish"``, end on the old ones. Answers once
        none is in flight: then load the new weights. The pause outlives a restart of the service."""
        return dict(self._t.request("POST", "/v1/weights/pause", {"mode": mode}))

    def resume(self, version: Optional[int] = None, backends: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Resumes generation: with ``version``, on the new weights (announced first); without, the
        update failed and the old weights go on."""
        body: Dict[str, Any] = {}
        if version is not None:
            body["version"] = version
            if backends:
                body["backends"] = list(backends)
        return dict(self._t.request("POST", "/v1/weights/resume", body))

    @contextlib.contextmanager
    def update(self, mode: str = "abort") -> Iterator[WeightUpdate]:
        """Pauses generation for the block, then resumes it on ``update.version`` (see WeightUpdate)."""
        update = WeightUpdate(self.pause(mode))
        try:
            yield update
        except BaseException:
            update.resumed = self.resume()
            raise
        update.resumed = self.resume(update.version, update.backends)


def _seg(id: str) -> str:
    from urllib.parse import quote

    return quote(id, safe=":")


class Client:
    """A client of the rollserve rollout service.

    >>> client = Client("http://127.0.0.1:8100", token=None)
    >>> submitted = client.submit([task, ...])          # ids generated where absent
    >>> for result in client.iter_results(submitted):  # as they finish
    ...     print(result.id, result.reward)

    ``timeout`` bounds each request/response call (seconds; the result stream has none unless
    ``stream_timeout``); ``retries`` and ``backoff`` govern the retries of calls safe to repeat
    (connection errors, timeouts, 5xx). ``warning_check``: how often (seconds) a result stream
    waiting on tasks whose submit was warned (e.g. no policy backend) asks ``/v1/status``
    whether the warning still holds; it then raises :class:`ServiceWarningError`.
    """

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        timeout: Optional[float] = 60.0,
        *,
        retries: int = 5,
        backoff: float = 0.25,
        stream_timeout: Optional[float] = None,
        warning_check: float = 5.0,
    ) -> None:
        self._t = Transport(url, token, timeout, retries=retries, backoff=backoff, stream_timeout=stream_timeout)
        self.url = url
        self.warning_check = warning_check
        self.backends = Backends(self._t)
        self.weights = Weights(self._t)
        #: Reconnections of result streams so far (dropped connections).
        self.reconnects = 0

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._t.close()

    # calls ---------------------------------------------------------------------------------

    def health(self) -> bool:
        """Whether the service answers ``/health`` (False when it is down or something else
        answers; tried once, no retries)."""
        try:
            answer = self._t.request("GET", "/health", retry=False)
        except RolloutServiceError:
            return False
        return isinstance(answer, dict) and answer.get("status") == "ok"

    def status(self) -> Dict[str, Any]:
        """Per stage queued/active/pool, rollouts, environments, LLM backends and ``warnings``
        (each also issued as a :class:`ServiceWarning`)."""
        answer = self._t.request("GET", "/v1/status")
        for warning in answer.get("warnings") or []:
            warnings.warn(warning, ServiceWarning, stacklevel=2)
        return answer

    def _check_warnings(self, fail: bool = True, said: Optional[set] = None) -> None:
        """While ``/v1/status`` has warnings: raises ServiceWarningError with ``fail``, else
        issues each as a ServiceWarning once (``said`` keeps those issued)."""
        held = self._t.request("GET", "/v1/status").get("warnings") or []
        if held and fail:
            raise ServiceWarningError(held, method="GET", path="/v1/status")
        for warning in held:
            if said is not None and warning not in said:
                said.add(warning)
                warnings.warn(warning, ServiceWarning, stacklevel=4)

    def submit(self, tasks: Union[Task, Iterable[Task]], *, batch_size: int = MAX_BATCH) -> Submission:
        """Submits one task or many (``{"env", "row", "policy", "n", ...}``); answers once the
        service has them (202), before they run. Tasks without ``id`` get a uuid4, so the
        retries after a timeout or a dropped connection can not run a task twice; a task whose
        id the service knows answers ``existing=True`` with its rollouts."""
        prepared = prepare_tasks(tasks)
        submission = Submission()
        for start in range(0, len(prepared), batch_size):
            batch = prepared[start : start + batch_size]
            answer = self._t.request("POST", "/v1/rollouts", {"tasks": batch})
            said = [str(w) for w in answer.get("warnings") or []]
            for warning in said:
                warnings.warn(warning, ServiceWarning, stacklevel=2)
            submission.warnings.extend(said)
            for task, item in zip(batch, answer["tasks"]):
                # the service's warnings are of tasks that use its backends (no policy.base_url)
                concern = said if said and not (task.get("policy") or {}).get("base_url") else []
                submission.append(SubmittedTask(task_id=item["task_id"], rollout_ids=list(item["rollout_ids"]), existing=bool(item.get("existing", False)), warnings=list(concern)))
        return submission

    def submit_sampling(
        self,
        tasks: Iterable[Task],
        *,
        groups: int,
        max_groups: Optional[int] = None,
        max_in_flight: Optional[int] = None,
        metric: Optional[str] = None,
        id: Optional[str] = None,
    ) -> Sampling:
        """Dynamic sampling (DAPO): ``tasks`` are a pool whose groups the service starts in
        order until ``groups`` are informative (the ``metric``, "reward" or "return", not the
        same for all samples of the group), trying at most ``max_groups`` (default: the whole
        pool), ``max_in_flight`` at once (default: ``groups``). Answers the sampling once its
        first groups are stored; read its groups with :meth:`iter_sampled_groups`. The sampling
        and its tasks get uuid4 ids where they have none, so a retried submit starts nothing
        twice."""
        pool = prepare_tasks(tasks)
        if len(pool) > MAX_BATCH:
            raise ValueError(f"a sampling's pool is at most {MAX_BATCH} tasks, not {len(pool)}")
        options = {"id": id or str(uuid.uuid4()), "groups": groups, "max_groups": max_groups, "max_in_flight": max_in_flight, "metric": metric}
        answer = self._t.request("POST", "/v1/rollouts", {"tasks": pool, "dynamic_sampling": {k: v for k, v in options.items() if v is not None}})
        for warning in answer.get("warnings") or []:
            warnings.warn(str(warning), ServiceWarning, stacklevel=2)
        return Sampling.from_json(answer["sampling"])

    def sampling(self, id: Union[str, Sampling]) -> Sampling:
        """A dynamic sampling's state and counts."""
        return Sampling.from_json(self._t.request("GET", f"/v1/rollouts/sampling/{_seg(_sampling_id(id))}"))

    def stop_sampling(self, id: Union[str, Sampling]) -> Sampling:
        """Stops a dynamic sampling: nothing more starts, its running groups are cancelled."""
        return Sampling.from_json(self._t.request("DELETE", f"/v1/rollouts/sampling/{_seg(_sampling_id(id))}"))

    def iter_sampled_groups(self, sampling: Union[str, Sampling], *, view: Optional[str] = None, max_response_tokens: Optional[int] = None) -> SampledGroups:
        """The informative groups of a dynamic sampling as they are kept, advantages filled
        (``view="training"``: as TrainingViews, cut at ``max_response_tokens`` when given); the
        iterator's ``sampling`` holds the final counts once it ends."""
        return SampledGroups(self._t, _sampling_id(sampling), view, max_response_tokens)

    def get(self, id: str) -> Union[Rollout, TaskRollouts]:
        """A rollout, or for the id of a task with n > 1, its group (TaskRollouts)."""
        return parse_view(self._t.request("GET", f"/v1/rollouts/{_seg(id)}"))

    def get_task(self, task_id: str) -> List[Rollout]:
        """A task's rollouts, whatever its n."""
        view = self.get(task_id)
        return view.rollouts if isinstance(view, TaskRollouts) else [view]

    def list_page(self, *, cursor: Optional[str] = None, limit: Optional[int] = None, state: Optional[str] = None, task_id: Optional[str] = None) -> Page:
        answer = self._t.request("GET", "/v1/rollouts", query={"cursor": cursor, "limit": limit, "state": state, "task_id": task_id})
        return Page(items=[Rollout.from_json(r) for r in answer["items"]], next_cursor=answer.get("next_cursor"))

    def list(self, *, state: Optional[str] = None, task_id: Optional[str] = None, page_size: int = 500, cursor: Optional[str] = None) -> Iterator[Rollout]:
        """Every rollout (optionally of one state or task), page after page."""
        while True:
            page = self.list_page(cursor=cursor, limit=page_size, state=state, task_id=task_id)
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def cancel(self, id: str, *, wait: bool = True) -> Union[Rollout, TaskRollouts]:
        """Cancels a rollout, or every rollout of a task; with ``wait`` answers once they have
        left their stage (their sandboxes freed)."""
        return parse_view(self._t.request("DELETE", f"/v1/rollouts/{_seg(id)}", query=None if wait else {"wait": "false"}))

    # streams -------------------------------------------------------------------------------

    def _stream(self, ids: List[str], view: Optional[str] = None, watch: bool = False, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None) -> Iterator[Tuple[str, Any]]:
        """The results of ``ids``. ``/v1/status`` is asked after every ``warning_check`` seconds
        without a result (and at once with ``watch``: tasks whose submit was warned). With
        ``watch``, its warnings raise ServiceWarningError: the stream would wait for ever. Else
        (ids alone do not say whether the warnings concern them) each is issued once as a
        ServiceWarning."""
        if watch:
            self._check_warnings()
        said: set = set()
        items: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        stream = ResultStream(self._t, ids, items.put, view, max_response_tokens, max_staleness).start()
        remaining = len(stream.chunks)
        try:
            while remaining:
                try:
                    kind, value = items.get(timeout=self.warning_check)
                except queue.Empty:
                    self._check_warnings(watch, said)
                    continue
                if kind == "result":
                    yield kind, value
                elif kind == "done":
                    remaining -= 1
                else:
                    raise value
        finally:
            stream.stop()
            self.reconnects += stream.reconnects

    def iter_results(self, ids: Ids, *, max_staleness: Optional[int] = None, stale: str = "flag") -> Iterator[Result]:
        """Results of rollouts or tasks (ids, a SubmittedTask or a Submission) as they finish,
        those already finished first, each once; ends when all are finished. A dropped stream
        is reopened and the results seen before are skipped. With ``max_staleness`` (k): a result
        whose oldest turn is more than k weight versions behind the newest announced is stale:
        ``stale="flag"`` yields it with ``stale`` True, ``"filter"`` leaves it out."""
        ids = materialize(ids)
        drop = _stale_filter(stale)
        for _, raw in self._stream(as_id_list(ids), None, warned(ids), max_staleness=max_staleness):
            if not (drop and raw.get("stale")):
                yield Result.from_json(raw)

    def wait(self, ids: Ids, *, max_staleness: Optional[int] = None, stale: str = "flag") -> List[Result]:
        """All results of ``ids``, once finished, in the order of their rollout ids (a staleness
        bound as :meth:`iter_results`)."""
        results = list(self.iter_results(ids, max_staleness=max_staleness, stale=stale))
        return sorted(results, key=lambda r: (r.task_id, r.sample_index))

    def _members(self, tasks: Ids) -> Dict[str, List[str]]:
        if isinstance(tasks, SubmittedTask):
            tasks = [tasks]
        elif isinstance(tasks, str):
            tasks = [tasks]
        members: Dict[str, List[str]] = {}
        for task in tasks:
            if isinstance(task, SubmittedTask):
                members[task.task_id] = list(task.rollout_ids)
            else:
                members[task] = task_members(task, self.get(task))
        return members

    def training(self, id: str, *, max_response_tokens: Optional[int] = None) -> Union[TrainingView, List[Optional[TrainingView]]]:
        """The training view of a finished rollout; for a task id, its samples' (None for one
        not finished). A rollout not finished yet is a RolloutServiceError with status 409.
        ``max_response_tokens`` cuts each response to that many tokens (``truncated`` then says
        whether it was longer, or its last generation stopped on "length")."""
        query: Dict[str, Any] = {"view": "training", "max_response_tokens": max_response_tokens}
        return parse_training(self._t.request("GET", f"/v1/rollouts/{_seg(id)}", query=query))

    def iter_training(self, ids: Ids, *, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None, stale: str = "flag") -> Iterator[TrainingView]:
        """As :meth:`iter_results`, as training views: what a loss needs, each token id once (a
        Result repeats the conversation in every turn; at working sizes most of its bytes)."""
        ids = materialize(ids)
        drop = _stale_filter(stale)
        for _, raw in self._stream(as_id_list(ids), "training", warned(ids), max_response_tokens=max_response_tokens, max_staleness=max_staleness):
            if drop and raw.get("stale"):
                continue
            view = TrainingView.from_json(raw)
            warn_drift([view])
            yield view

    def iter_training_groups(self, tasks: Ids, *, refresh: bool = True, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None, stale: str = "flag") -> Iterator[Group]:
        """As :meth:`iter_groups`, each group's samples as TrainingViews."""
        return self._groups(tasks, refresh, "training", max_response_tokens=max_response_tokens, max_staleness=max_staleness, drop_stale=_stale_filter(stale))

    def iter_groups(self, tasks: Ids, *, refresh: bool = True, max_staleness: Optional[int] = None, stale: str = "flag") -> Iterator[Group]:
        """Whole groups (all n samples of a task) as each task's last sample finishes. Task
        ids or SubmittedTasks (a Submission: no extra call to learn each task's n). With
        ``refresh``, a group whose streamed samples lack advantages is read again from the
        service (which fills them once the group is complete); else it is yielded as is.
        Tasks whose submit was warned (no policy backend) raise ServiceWarningError while the
        warning holds, instead of waiting for ever. A staleness bound as :meth:`iter_results`:
        ``"filter"`` leaves a group's stale samples out (a group with none left is not yielded)."""
        return self._groups(tasks, refresh, None, max_staleness=max_staleness, drop_stale=_stale_filter(stale))

    def _groups(self, tasks: Ids, refresh: bool, view: Optional[str], *, max_response_tokens: Optional[int] = None, max_staleness: Optional[int] = None, drop_stale: bool = False) -> Iterator[Group]:
        tasks = materialize(tasks)
        grouper = Grouper(self._members(tasks))
        for _, raw in self._stream(list(grouper.members), view, warned(tasks), max_response_tokens=max_response_tokens, max_staleness=max_staleness):
            group = grouper.add(TrainingView.from_json(raw) if view else Result.from_json(raw))
            if group is None:
                continue
            if refresh and Grouper.lacks_advantages(group):
                group = Grouper.refreshed_training(group, self.training(group.task_id, max_response_tokens=max_response_tokens)) if view else Grouper.refreshed(group, self.get(group.task_id))
            group = Grouper.fresh(group, drop_stale)
            if group is not None:
                warn_drift(group.results)
                yield group


def task_members(task_id: str, view: Union[Rollout, TaskRollouts]) -> List[str]:
    if isinstance(view, TaskRollouts):
        return [r.id for r in view.rollouts]
    if view.task_id != task_id:
        raise ValueError(f"{task_id!r} is a rollout of task {view.task_id!r}, not a task id")
    return [view.id]
