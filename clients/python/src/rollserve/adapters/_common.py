"""What the adapters share: a task from a prompt and a row, the training view of each submitted
sample in the caller's order."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ..aio import AsyncClient
from ..models import Submission, TrainingView

# The sampling names a task takes are vLLM's (the service refuses others); a framework's own
# names are mapped or left out.
SAMPLING_NAMES = frozenset(
    "presence_penalty frequency_penalty repetition_penalty temperature top_p top_k min_p seed stop stop_token_ids "
    "bad_words ignore_eos max_tokens min_tokens skip_special_tokens".split()
)
RENAMED = {"max_generate_length": "max_tokens", "max_new_tokens": "max_tokens"}


def sampling(params: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in (params or {}).items():
        name = RENAMED.get(key, key)
        if name in SAMPLING_NAMES and value is not None:
            out[name] = value
    return out


def make_task(env: str, row: Optional[Mapping[str, Any]], prompt: Any, policy: Mapping[str, Any], sampling_params: Optional[Mapping[str, Any]], n: int = 1) -> Dict[str, Any]:
    """A task whose row is ``row`` with ``responses_create_params.input`` set to ``prompt`` (a
    string or chat messages) when the row has none."""
    row = dict(row or {})
    create = dict(row.get("responses_create_params") or {})
    if "input" not in create:
        create["input"] = list(prompt) if isinstance(prompt, (list, tuple)) else prompt
    row["responses_create_params"] = create
    task_policy = dict(policy)
    merged = {**dict(task_policy.get("sampling") or {}), **sampling(sampling_params)}
    if merged:
        task_policy["sampling"] = merged
    return {"env": env, "row": row, "policy": task_policy, "n": n}


async def training_views(client: AsyncClient, submitted: Submission) -> List[TrainingView]:
    """The training view of every rollout of ``submitted``, in submission order (a task's samples
    by sample index), once all have finished."""
    by_id: Dict[str, TrainingView] = {}
    async for view in client.iter_training(submitted):
        by_id[view.id] = view
    return [by_id[rollout_id] for rollout_id in submitted.rollout_ids]


def usable(view: TrainingView) -> Optional[str]:
    """Why the view can not be trained on as tokens, or None."""
    if view.filter:
        return f"rollout {view.id} was filtered (infrastructure failure): {view.raw.get('error') or 'see GET /v1/rollouts/' + view.id}"
    if view.response_ids is None or view.prompt_ids is None:
        return f"rollout {view.id} has no token sequence: {view.sequence_error}"
    return None
