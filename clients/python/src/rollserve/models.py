"""Typed views of the service's JSON. Every object keeps the whole JSON it came from in ``raw``
(unknown fields included, so a newer service loses nothing) and answers ``obj["field"]`` from it.
The service's keys are snake_case, as are these attributes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence


class _Raw:
    raw: Dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.raw

    def to_dict(self) -> Dict[str, Any]:
        """The JSON object as the service sent it."""
        return self.raw


@dataclass(repr=False)
class Result(_Raw):
    """One finished rollout (a sample). ``turns`` and ``messages`` are the service's dicts."""

    id: str
    task_id: str
    sample_index: int
    env: str
    state: str
    reward: float
    advantage: Optional[float]
    filter: bool
    critical_error: Optional[str]
    error: Optional[Dict[str, Any]]
    reward_components: Optional[Dict[str, float]]
    verify_extras: Dict[str, Any]
    turns: List[Dict[str, Any]]
    messages: List[Dict[str, Any]]
    response: Optional[Dict[str, Any]]
    timing: Dict[str, Any]
    metadata: Optional[Dict[str, Any]]
    finished_at: str
    raw: Dict[str, Any] = field(default_factory=dict)
    #: How the turns' rewards, returns and advantages were computed (settings, components, shaping,
    #: group statistics); None until the service has it.
    credit: Optional[Dict[str, Any]] = None
    #: The oldest and newest weight version of its turns (each turn's ``weight_version``): None when
    #: the trainer announced none (``Client.announce_weights``), or from a service before versions.
    weight_version_min: Optional[int] = None
    weight_version_max: Optional[int] = None
    #: Judged stale by a staleness bound (too many versions behind the newest): not an infrastructure
    #: failure (those have a ``critical_error``).
    stale: bool = False

    @classmethod
    def from_json(cls, raw: Dict[str, Any]) -> "Result":
        return cls(
            id=raw["id"],
            task_id=raw.get("task_id"),
            sample_index=raw.get("sample_index", 0),
            env=raw.get("env", ""),
            state=raw.get("state", ""),
            reward=raw.get("reward", 0.0),
            advantage=raw.get("advantage"),
            filter=bool(raw.get("filter", False)),
            critical_error=raw.get("critical_error"),
            error=raw.get("error"),
            reward_components=raw.get("reward_components"),
            verify_extras=raw.get("verify_extras") or {},
            turns=raw.get("turns") or [],
            messages=raw.get("messages") or [],
            response=raw.get("response"),
            timing=raw.get("timing") or {},
            metadata=raw.get("metadata"),
            finished_at=raw.get("finished_at", ""),
            raw=raw,
            credit=raw.get("credit"),
            weight_version_min=raw.get("weight_version_min"),
            weight_version_max=raw.get("weight_version_max"),
            stale=bool(raw.get("stale", False)),
        )

    @property
    def ok(self) -> bool:
        """Finished without a critical error."""
        return self.critical_error is None and self.state == "done"

    def __repr__(self) -> str:
        return f"Result(id={self.id!r}, state={self.state!r}, reward={self.reward!r}, advantage={self.advantage!r}, filter={self.filter!r})"


# How the service's ``sequence_error`` begins for a re-tokenisation drift (protocol/training-view.ts).
DRIFT_ERROR_PREFIX = "re-tokenisation drift"


@dataclass(repr=False)
class TrainingView(_Raw):
    """A finished rollout ready for a loss (the service's ``view=training``): the first prompt,
    then one response sequence (each turn's generation with mask 1 and its logprobs, then the
    tokens the next prompt added with mask 0), each token's turn, and per turn its span, status
    and credit. Each token id once, where a Result repeats the conversation in every turn. The
    sequence fields are None when ``sequence_error`` says why (no token ids, re-tokenisation drift)."""

    id: str
    task_id: str
    sample_index: int
    reward: float
    advantage: Optional[float]
    filter: bool
    prompt_ids: Optional[List[int]]
    response_ids: Optional[List[int]]
    response_mask: Optional[List[int]]
    response_logprobs: Optional[List[float]]
    response_turn: Optional[List[int]]
    sequence_error: Optional[str]
    #: The last turn's finish reason ("stop", "length", "tool_calls"); each of ``turns`` has its own.
    finish_reason: Optional[str]
    #: Cut by ``max_response_tokens``, or the last generation stopped on "length" (no EOS at the end).
    truncated: bool
    turns: List[Dict[str, Any]]
    credit: Optional[Dict[str, Any]]
    raw: Dict[str, Any] = field(default_factory=dict)
    #: The oldest and newest weight version of its turns (each turn's ``weight_version``).
    weight_version_min: Optional[int] = None
    weight_version_max: Optional[int] = None
    #: Judged stale by a staleness bound.
    stale: bool = False

    @classmethod
    def from_json(cls, raw: Dict[str, Any]) -> "TrainingView":
        return cls(
            id=raw["id"],
            task_id=raw.get("task_id"),
            sample_index=raw.get("sample_index", 0),
            reward=raw.get("reward", 0.0),
            advantage=raw.get("advantage"),
            filter=bool(raw.get("filter", False)),
            prompt_ids=raw.get("prompt_ids"),
            response_ids=raw.get("response_ids"),
            response_mask=raw.get("response_mask"),
            response_logprobs=raw.get("response_logprobs"),
            response_turn=raw.get("response_turn"),
            sequence_error=raw.get("sequence_error"),
            finish_reason=raw.get("finish_reason"),
            truncated=bool(raw.get("truncated", False)),
            turns=raw.get("turns") or [],
            credit=raw.get("credit"),
            raw=raw,
            weight_version_min=raw.get("weight_version_min"),
            weight_version_max=raw.get("weight_version_max"),
            stale=bool(raw.get("stale", False)),
        )

    @property
    def drifted(self) -> bool:
        """True when the sequence fields are None because a turn's prompt was re-tokenised
        differently from the previous prompt and generation (chat mode; ``policy.generation:
        "tokens"`` avoids it): train on it from ``turns`` or drop it, but not as a sequence."""
        return (self.sequence_error or "").startswith(DRIFT_ERROR_PREFIX)

    def __repr__(self) -> str:
        length = None if self.response_ids is None else len(self.response_ids)
        return f"TrainingView(id={self.id!r}, reward={self.reward!r}, advantage={self.advantage!r}, response_ids={length} ids, truncated={self.truncated!r}, sequence_error={self.sequence_error!r})"


@dataclass(repr=False)
class Rollout(_Raw):
    """A rollout as ``GET /v1/rollouts/:id`` shows it: its state, and its result once finished."""

    id: str
    task_id: str
    sample_index: int
    env: str
    state: str
    active: bool
    result: Optional[Result]
    raw: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Dict[str, Any]) -> "Rollout":
        result = raw.get("result")
        return cls(
            id=raw["id"],
            task_id=raw.get("task_id"),
            sample_index=raw.get("sample_index", 0),
            env=raw.get("env", ""),
            state=raw.get("state", ""),
            active=bool(raw.get("active", False)),
            result=Result.from_json(result) if isinstance(result, dict) else None,
            raw=raw,
        )

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")

    def __repr__(self) -> str:
        return f"Rollout(id={self.id!r}, state={self.state!r}, active={self.active!r}, result={self.result!r})"


@dataclass(repr=False)
class TaskRollouts(_Raw):
    """A task's rollouts (its group), as ``GET`` or ``DELETE /v1/rollouts/<task id>`` answer for n > 1."""

    task_id: str
    rollouts: List[Rollout]
    raw: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Dict[str, Any]) -> "TaskRollouts":
        return cls(task_id=raw["task_id"], rollouts=[Rollout.from_json(r) for r in raw.get("rollouts", []) if r], raw=raw)

    def __repr__(self) -> str:
        return f"TaskRollouts(task_id={self.task_id!r}, rollouts={self.rollouts!r})"


@dataclass
class SubmittedTask:
    """One task of a submission: its id, its rollouts' ids (one per sample) and whether the
    service knew it already (a resubmitted id; also true when a retried submit got through twice)."""

    task_id: str
    rollout_ids: List[str]
    existing: bool
    #: The service's warnings of the submit that concern this task (e.g. no policy backend).
    warnings: List[str] = field(default_factory=list)


class Submission(List[SubmittedTask]):
    """What ``submit`` answers: the submitted tasks, in the order given, and ``warnings``: what
    the service said will keep them from running (also issued as :class:`ServiceWarning`)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.warnings: List[str] = []

    @property
    def task_ids(self) -> List[str]:
        return [t.task_id for t in self]

    @property
    def rollout_ids(self) -> List[str]:
        return [r for t in self for r in t.rollout_ids]


@dataclass(repr=False)
class Group:
    """All samples of one task, finished, ordered by sample index: Results, or TrainingViews
    from ``iter_training_groups``. ``advantages`` are the service's (None where it gave none)."""

    task_id: str
    results: List[Any]

    @property
    def rewards(self) -> List[float]:
        return [r.reward for r in self.results]

    @property
    def advantages(self) -> List[Optional[float]]:
        return [r.advantage for r in self.results]

    @property
    def failures(self) -> List[Any]:
        """The samples that failed on infrastructure (``filter``: a policy backend that refused
        the model, a sandbox that did not start, ...): their reward 0 is no score, their
        ``error`` says why. Do not train on them."""
        return [r for r in self.results if r.filter]

    @property
    def drifted(self) -> List[Any]:
        """TrainingViews whose sequence fields are None for a re-tokenisation drift
        (``TrainingView.drifted``); none among Results."""
        return [r for r in self.results if getattr(r, "drifted", False)]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, index: int) -> Any:
        return self.results[index]

    def __repr__(self) -> str:
        failed = f", failures={len(self.failures)}" if self.failures else ""
        drifted = f", drifted={len(self.drifted)}" if self.drifted else ""
        return f"Group(task_id={self.task_id!r}, rewards={self.rewards!r}, advantages={self.advantages!r}{failed}{drifted})"


@dataclass(repr=False)
class Sampling(_Raw):
    """A dynamic sampling (DAPO) as the service counts it: ``state`` ("running", "done": ``groups``
    kept, "exhausted": ``max_groups`` tried or the pool ran out first, "stopped"), the groups
    ``tried``, ``kept`` (in ``kept_task_ids`` order), ``dropped_all_equal``, ``filtered`` (fewer
    than two samples not filtered), ``cancelled`` (still running when it ended), ``running``, and
    each group tried with its outcome in ``tasks``."""

    id: str
    state: str
    groups: int
    max_groups: int
    max_in_flight: int
    metric: str
    pool: int
    tried: int
    kept: int
    dropped_all_equal: int
    filtered: int
    cancelled: int
    running: int
    kept_task_ids: List[str]
    tasks: List[Dict[str, Any]]
    error: Optional[str]
    raw: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, raw: Dict[str, Any]) -> "Sampling":
        return cls(
            id=raw["id"],
            state=raw["state"],
            groups=raw["groups"],
            max_groups=raw["max_groups"],
            max_in_flight=raw["max_in_flight"],
            metric=raw.get("metric", "reward"),
            pool=raw["pool"],
            tried=raw["tried"],
            kept=raw["kept"],
            dropped_all_equal=raw["dropped_all_equal"],
            filtered=raw["filtered"],
            cancelled=raw["cancelled"],
            running=raw["running"],
            kept_task_ids=list(raw.get("kept_task_ids") or []),
            tasks=list(raw.get("tasks") or []),
            error=raw.get("error"),
            raw=raw,
        )

    @property
    def finished(self) -> bool:
        return self.state != "running"

    def __repr__(self) -> str:
        return (
            f"Sampling(id={self.id!r}, state={self.state!r}, tried={self.tried}, kept={self.kept}/{self.groups}, "
            f"dropped_all_equal={self.dropped_all_equal}, filtered={self.filtered}, cancelled={self.cancelled}, running={self.running})"
        )


@dataclass
class Page:
    """One page of ``GET /v1/rollouts``; ``next_cursor`` is None on the last."""

    items: List[Rollout]
    next_cursor: Optional[str]


def as_id_list(ids: Any) -> List[str]:
    """Ids from a string, a SubmittedTask, a Submission or an iterable of those (task ids of
    submitted tasks)."""
    if isinstance(ids, str):
        return [ids]
    if isinstance(ids, SubmittedTask):
        return [ids.task_id]
    out: List[str] = []
    for item in ids:
        if isinstance(item, SubmittedTask):
            out.append(item.task_id)
        elif isinstance(item, str):
            out.append(item)
        else:
            raise TypeError(f"ids are strings or SubmittedTask, not {type(item).__name__}")
    return out


__all__: Sequence[str] = ["Result", "Rollout", "TaskRollouts", "SubmittedTask", "Submission", "Group", "Page", "Sampling"]


def warned(ids: Any) -> bool:
    """Whether any SubmittedTask among ``ids`` came back with warnings."""
    if isinstance(ids, SubmittedTask):
        return bool(ids.warnings)
    if isinstance(ids, str):
        return False
    return any(isinstance(item, SubmittedTask) and bool(item.warnings) for item in ids)


def materialize(ids: Any) -> Any:
    """``ids`` as given, a one-shot iterable made a list (it is read more than once)."""
    return ids if isinstance(ids, (str, SubmittedTask, list, tuple)) else list(ids)
