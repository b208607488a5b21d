"""Training views as a trainer's batch: padded arrays in the names and padding of verl's DataProto
(``build_batch``), and SkyRL's ``GeneratorOutput`` (``to_skyrl``).

numpy is imported when a batch is built, torch only when asked for (``return_tensors="pt"``), so
``import rollserve`` needs neither. Fields the service adds over time (``weight_version_min``/
``_max``, ``finish_reason``, ``truncated``) are read when present and default to None / False."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .models import TrainingView

ViewLike = Union[TrainingView, Mapping[str, Any]]

OVERLONG = ("error", "truncate", "drop")
UNUSABLE = ("drop", "error")
ADVANTAGES = ("turn", "sample")


def _raw(view: ViewLike) -> Mapping[str, Any]:
    return view.raw if isinstance(view, TrainingView) else view


def num_turns_of(raw: Mapping[str, Any]) -> int:
    """verl's ``num_turns``: the user message, each assistant message and each tool answer."""
    turns = raw.get("turns") or []
    return 1 + len(turns) + sum(len(t.get("tool_calls") or []) for t in turns)


# Lists of Python numbers become arrays through the array module (a C loop over the list, about
# twice as fast as numpy's own conversion) and 0/1 masks through bytes (faster again): 1,024
# samples of 8k tokens are some 25 million numbers (`pnpm bench training-batch`).
def _ints(np: Any, values: Sequence[int]) -> Any:
    return np.frombuffer(array("q", values), dtype=np.int64)


def _floats(np: Any, values: Sequence[float]) -> Any:
    return np.frombuffer(array("d", values), dtype=np.float64)


def _flags(np: Any, values: Sequence[int]) -> Any:
    try:
        return np.frombuffer(bytes(values), dtype=np.uint8)
    except (ValueError, TypeError):
        return _ints(np, values)


@dataclass
class TrainingBatch:
    """A batch shaped as verl's ``DataProto``: ``batch`` (arrays of one row per sample, numpy or
    torch), ``non_tensor_batch`` (numpy object arrays, one entry per sample) and ``meta_info``
    (``pad_token_id``, ``prompt_length``, ``response_length``, and ``dropped``: each sample left
    out, with its id and why). ``to_dataproto()`` gives verl's own object when verl is installed."""

    batch: Dict[str, Any]
    non_tensor_batch: Dict[str, Any]
    meta_info: Dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.non_tensor_batch["rollout_id"])

    def __getitem__(self, key: str) -> Any:
        return self.batch[key] if key in self.batch else self.non_tensor_batch[key]

    def to_torch(self) -> "TrainingBatch":
        """The same batch with torch tensors (torch must be installed)."""
        import torch

        tensors = {k: v if isinstance(v, torch.Tensor) else torch.from_numpy(v) for k, v in self.batch.items()}
        return TrainingBatch(tensors, dict(self.non_tensor_batch), dict(self.meta_info))

    def to_dataproto(self) -> Any:
        """verl's ``DataProto`` (``verl.protocol.DataProto.from_dict``); needs verl and torch."""
        from verl.protocol import DataProto

        return DataProto.from_dict(tensors=self.to_torch().batch, non_tensors=dict(self.non_tensor_batch), meta_info=dict(self.meta_info))


def build_batch(
    views: Iterable[ViewLike],
    *,
    pad_token_id: int = 0,
    max_prompt_length: Optional[int] = None,
    max_response_length: Optional[int] = None,
    overlong: str = "error",
    drop_filtered: bool = True,
    unusable: str = "drop",
    advantages: str = "turn",
    mask_truncated: bool = False,
    return_tensors: str = "np",
) -> TrainingBatch:
    """Pad training views into one batch the way verl's agent loop does (``_postprocess``):

    - ``prompts`` [B, P]: left-padded with ``pad_token_id``; ``responses`` [B, R]: right-padded;
      ``input_ids`` = prompts ‖ responses; ``attention_mask`` 1 on every real token (prompt,
      generation, tool output), 0 on padding; ``position_ids`` = ``clip(cumsum(attention_mask) - 1,
      0)`` (verl's ``compute_position_id_with_mask``: 0 on the left padding, the last position
      repeated on the right); ``response_mask`` 1 on generated tokens only;
    - ``rollout_log_probs`` [B, R] float32 (0 off the mask and on padding);
    - ``token_level_scores`` [B, R] float32: the sample's reward on its last response token
      (``attention_mask`` sum − 1, as verl's reward managers put it), 0 elsewhere;
    - ``advantages`` [B, R] float32, on the response mask only: each generated token's turn
      advantage (``turns[t].advantage``, over ``generation_span``; the sample's advantage where the
      turn has none) with ``advantages="turn"``, the sample's advantage everywhere with ``"sample"``;
      0 where neither exists (a group of one);
    - ``non_tensor_batch``: ``uid`` (the task id: verl's GRPO groups by it), ``rollout_id``,
      ``sample_index``, ``score``, ``advantage``, ``filter``, ``weight_version_min``,
      ``weight_version_max``, ``finish_reason``, ``truncated``, ``__num_turns__``.

    P and R are ``max_prompt_length`` / ``max_response_length`` when given (fixed shapes, as
    verl's ``prompt_length`` / ``response_length``), else the longest in the batch. A longer sample
    is refused (``overlong="error"``, the default: ValueError naming it), dropped (``"drop"``) or
    truncated (``"truncate"``: the prompt keeps its last P tokens, the response its first R, as
    verl's agent loops cut it; the sample's ``truncated`` is then True and its reward sits on its
    last kept token). Filtered samples (infrastructure failures) are dropped unless
    ``drop_filtered=False``; samples without a token sequence (``sequence_error``: drift, no token
    ids) are dropped (``unusable="drop"``) or refused (``"error"``). Every dropped sample is
    listed in ``meta_info["dropped"]``. ``mask_truncated=True`` zeroes the response mask (and so
    the advantages) of every truncated sample: overlong filtering, as SkyRL's
    ``apply_overlong_filtering`` and DAPO do (the service's ``overlong=mask`` on the training view is
    the same). ``return_tensors="pt"`` gives torch tensors."""
    if overlong not in OVERLONG:
        raise ValueError(f"overlong must be one of {OVERLONG}, not {overlong!r}")
    if unusable not in UNUSABLE:
        raise ValueError(f"unusable must be one of {UNUSABLE}, not {unusable!r}")
    if advantages not in ADVANTAGES:
        raise ValueError(f"advantages must be one of {ADVANTAGES}, not {advantages!r}")
    if return_tensors not in ("np", "pt"):
        raise ValueError(f"return_tensors must be 'np' or 'pt', not {return_tensors!r}")
    import numpy as np

    kept: List[Mapping[str, Any]] = []
    dropped: List[Dict[str, Any]] = []
    for view in views:
        raw = _raw(view)
        if raw.get("filter") and drop_filtered:
            dropped.append({"id": raw["id"], "reason": "filtered (infrastructure failure)"})
            continue
        if raw.get("response_ids") is None or raw.get("prompt_ids") is None:
            reason = raw.get("sequence_error") or "no token sequence"
            if unusable == "error":
                raise ValueError(f"rollout {raw['id']} has no token sequence: {reason}")
            dropped.append({"id": raw["id"], "reason": reason})
            continue
        too_long = (max_prompt_length is not None and len(raw["prompt_ids"]) > max_prompt_length) or (
            max_response_length is not None and len(raw["response_ids"]) > max_response_length
        )
        if too_long and overlong == "error":
            raise ValueError(
                f"rollout {raw['id']} has {len(raw['prompt_ids'])} prompt and {len(raw['response_ids'])} response tokens, "
                f"over max_prompt_length={max_prompt_length} / max_response_length={max_response_length} "
                "(overlong='truncate' or 'drop' to take it anyway)"
            )
        if too_long and overlong == "drop":
            dropped.append({"id": raw["id"], "reason": "overlong"})
            continue
        kept.append(raw)

    count = len(kept)
    P = max_prompt_length if max_prompt_length is not None else max((len(r["prompt_ids"]) for r in kept), default=0)
    R = max_response_length if max_response_length is not None else max((len(r["response_ids"]) for r in kept), default=0)
    prompts = np.full((count, P), pad_token_id, dtype=np.int64)
    responses = np.full((count, R), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((count, P + R), dtype=np.int64)
    response_mask = np.zeros((count, R), dtype=np.int64)
    log_probs = np.zeros((count, R), dtype=np.float32)
    scores = np.zeros((count, R), dtype=np.float32)
    token_advantages = np.zeros((count, R), dtype=np.float32)
    truncated: List[bool] = []

    for i, raw in enumerate(kept):
        prompt = raw["prompt_ids"]
        response = raw["response_ids"]
        cut = len(prompt) > P or len(response) > R
        if len(prompt) > P:
            prompt = prompt[len(prompt) - P :]
        n = min(len(response), R)
        if prompt:
            prompts[i, P - len(prompt) :] = _ints(np, prompt)
        attention_mask[i, P - len(prompt) : P + n] = 1
        if n:
            responses[i, :n] = _ints(np, response[:n] if n < len(response) else response)
            mask = raw["response_mask"]
            response_mask[i, :n] = _flags(np, mask[:n] if n < len(mask) else mask)
            logprobs = raw.get("response_logprobs")
            if logprobs is not None:
                log_probs[i, :n] = _floats(np, logprobs[:n] if n < len(logprobs) else logprobs)
            scores[i, n - 1] = raw.get("reward") or 0.0
        sample_advantage = raw.get("advantage")
        if advantages == "sample" or not raw.get("turns"):
            token_advantages[i, :n] = sample_advantage or 0.0
        else:
            for turn in raw["turns"]:
                span = turn.get("generation_span")
                if span is None:
                    continue
                start, end = span[0], min(span[1], n)
                if start < end:
                    value = turn.get("advantage")
                    token_advantages[i, start:end] = (value if value is not None else sample_advantage) or 0.0
        truncated.append(bool(raw.get("truncated")) or cut)
        if mask_truncated and truncated[-1]:
            # overlong filtering (SkyRL's apply_overlong_filtering, DAPO's): in the batch, out of the loss
            response_mask[i, :] = 0

    # Spans are the generated tokens, so this only matters where the service masked some of them.
    np.multiply(token_advantages, response_mask, out=token_advantages, casting="unsafe")
    input_ids = np.concatenate([prompts, responses], axis=1)
    position_ids = np.cumsum(attention_mask, axis=1)
    position_ids -= 1
    np.maximum(position_ids, 0, out=position_ids)

    def objects(values: Sequence[Any]) -> Any:
        out = np.empty(len(values), dtype=object)
        out[:] = list(values)
        return out

    batch: Dict[str, Any] = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "rollout_log_probs": log_probs,
        "token_level_scores": scores,
        "advantages": token_advantages,
    }
    non_tensor_batch = {
        "uid": objects([r.get("task_id") for r in kept]),
        "rollout_id": objects([r["id"] for r in kept]),
        "sample_index": objects([r.get("sample_index", 0) for r in kept]),
        "score": objects([r.get("reward") for r in kept]),
        "advantage": objects([r.get("advantage") for r in kept]),
        "filter": objects([bool(r.get("filter")) for r in kept]),
        "weight_version_min": objects([r.get("weight_version_min") for r in kept]),
        "weight_version_max": objects([r.get("weight_version_max") for r in kept]),
        "finish_reason": objects([r.get("finish_reason") for r in kept]),
        "truncated": objects(truncated),
        "__num_turns__": np.array([num_turns_of(r) for r in kept], dtype=np.int32),
    }
    result = TrainingBatch(batch, non_tensor_batch, {"pad_token_id": pad_token_id, "prompt_length": P, "response_length": R, "dropped": dropped})
    return result.to_torch() if return_tensors == "pt" else result


@dataclass
class TrajectoryID:
    """SkyRL's ``TrajectoryID`` (``skyrl_train.generators.base``), used when SkyRL is not installed."""

    instance_id: str
    repetition_id: int

    def to_string(self) -> str:
        return f"{self.instance_id}_{self.repetition_id}"


def _trajectory_id(instance_id: str, repetition_id: int) -> Any:
    try:
        from skyrl_train.generators.base import TrajectoryID as SkyRLTrajectoryID
    except ImportError:
        return TrajectoryID(instance_id, repetition_id)
    return SkyRLTrajectoryID(instance_id=instance_id, repetition_id=repetition_id)


def to_skyrl(
    views: Iterable[ViewLike],
    *,
    rewards: str = "sample",
    unusable: str = "error",
    pad_token_id: int = 0,
    mask_truncated: bool = False,
) -> Dict[str, Any]:
    """SkyRL's ``GeneratorOutput`` (a TypedDict: plain lists, unpadded, one entry per view in
    order; SkyRL pads itself): ``prompt_token_ids``, ``response_ids``, ``loss_masks`` (the
    response mask), ``rollout_logprobs``, ``rewards``, ``stop_reasons`` (each view's
    ``finish_reason``, ``"length"`` for a truncated one; None when the service gives none),
    ``rollout_metrics``, ``trajectory_ids`` (``TrajectoryID(instance_id=task id, repetition_id=
    sample index)``), ``is_last_step`` and ``sampling_masks`` None (not step-wise).

    ``rewards="sample"``: one float per sample (SkyRL then treats it as the outcome reward);
    ``"token"``: per-token lists with the reward on the last response token; ``"turn"``: per-token
    lists with each turn's reward (``turns[t].reward``, the service's turn-level credit) on that
    turn's last generated token. A filtered sample keeps its tokens with an all-zero loss mask
    (SkyRL wants one output per input). A view without a token sequence is refused
    (``unusable="error"``) or becomes one ``pad_token_id`` with a zero loss mask and reward 0
    (``unusable="mask"``)."""
    if rewards not in ("sample", "token", "turn"):
        raise ValueError(f"rewards must be 'sample', 'token' or 'turn', not {rewards!r}")
    if unusable not in ("error", "mask"):
        raise ValueError(f"unusable must be 'error' or 'mask', not {unusable!r}")
    prompt_token_ids: List[List[int]] = []
    response_ids: List[List[int]] = []
    loss_masks: List[List[int]] = []
    logprobs: List[List[float]] = []
    reward_values: List[Any] = []
    stop_reasons: List[Optional[str]] = []
    trajectory_ids: List[Any] = []
    for view in views:
        raw = _raw(view)
        trajectory_ids.append(_trajectory_id(raw.get("task_id"), raw.get("sample_index", 0)))
        reason = raw.get("finish_reason") or ("length" if raw.get("truncated") else None)
        stop_reasons.append(reason)
        if raw.get("response_ids") is None or raw.get("prompt_ids") is None:
            if unusable == "error":
                raise ValueError(f"rollout {raw['id']} has no token sequence: {raw.get('sequence_error')}")
            prompt_token_ids.append(list(raw.get("prompt_ids") or [pad_token_id]))
            response_ids.append([pad_token_id])
            loss_masks.append([0])
            logprobs.append([0.0])
            reward_values.append(0.0 if rewards == "sample" else [0.0])
            continue
        response = list(raw["response_ids"])
        mask = [0] * len(response) if raw.get("filter") or (mask_truncated and raw.get("truncated")) else list(raw["response_mask"])
        prompt_token_ids.append(list(raw["prompt_ids"]))
        response_ids.append(response)
        loss_masks.append(mask)
        logprobs.append(list(raw.get("response_logprobs") or [0.0] * len(response)))
        reward = float(raw.get("reward") or 0.0)
        if rewards == "sample":
            reward_values.append(reward)
        else:
            per_token = [0.0] * len(response)
            if rewards == "token":
                if response:
                    per_token[-1] = reward
            else:
                for turn in raw.get("turns") or []:
                    span = turn.get("generation_span")
                    if span is not None and span[1] > span[0]:
                        per_token[span[1] - 1] += float(turn.get("reward") or 0.0)
            reward_values.append(per_token)
    lengths = [len(r) for r in response_ids]
    sample_rewards = [sum(r) if isinstance(r, list) else r for r in reward_values]
    non_zero = [r for r in sample_rewards if r != 0]
    metrics: Dict[str, Any] = {}
    if lengths:
        mean = sum(lengths) / len(lengths)
        metrics = {
            "generate/min_num_tokens": min(lengths),
            "generate/max_num_tokens": max(lengths),
            "generate/avg_num_tokens": mean,
            "generate/std_num_tokens": (sum((x - mean) ** 2 for x in lengths) / len(lengths)) ** 0.5,
            "generate/avg_rewards": sum(sample_rewards) / len(sample_rewards),
            "generate/avg_non_zero_rewards": sum(non_zero) / len(non_zero) if non_zero else 0.0,
        }
    return {
        "prompt_token_ids": prompt_token_ids,
        "response_ids": response_ids,
        "rewards": reward_values,
        "loss_masks": loss_masks,
        "stop_reasons": stop_reasons if any(s is not None for s in stop_reasons) else None,
        "rollout_metrics": metrics,
        "rollout_logprobs": logprobs,
        "trajectory_ids": trajectory_ids,
        "is_last_step": None,
        "sampling_masks": None,
    }
