"""Training batches (rollserve.training) built from the training views the service returned, checked
element by element against those views: multi-turn tool rollouts (tool outputs and template tokens
between the generations), single-turn ones of other lengths, a filtered sample with its tokens
(verify could not score it), a failed one that keeps the turn it made (the policy refused its second
turn), a failed one without tokens (a model the policy does not serve: no turn at all) and a
drifted one (ROLLSERVE_DRIFTING_POLICY_URL writes tool calls as json.dumps
does, so the chat conversation is re-tokenised differently)."""

from __future__ import annotations

import os
import uuid
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

import rollserve
from conftest import TOKEN, URL, make_task
from rollserve.training import TrainingBatch, build_batch, to_skyrl

PAD = -7  # not a token id, so that padding is told from a token 0


def counter_task(text: str, n: int, **extra: Any) -> Dict[str, Any]:
    return {
        "env": "counter",
        "row": {"responses_create_params": {"input": text}, "initial_count": 0, "expected_count": 2},
        "policy": {"model": "fake-policy"},
        "n": n,
        **extra,
    }


@pytest.fixture(scope="module")
def views() -> Dict[str, List[rollserve.TrainingView]]:
    """The views of each kind, by name; every finished sample of the submitted tasks."""
    prefix = uuid.uuid4().hex[:8]
    drifting = {"model": "fake-policy", "base_url": os.environ["ROLLSERVE_DRIFTING_POLICY_URL"]}
    tasks = {
        "tools": counter_task("count to two", 3, id=f"{prefix}-tools"),
        "tools-long": counter_task("count to two, and say so at some length " * 3, 2, id=f"{prefix}-tools-long"),
        "coin": make_task("coin flip", expected="heads", n=4, id=f"{prefix}-coin"),
        "short": make_task("hi", id=f"{prefix}-short"),
        "long": make_task("a longer question " * 12, id=f"{prefix}-long"),
        "filtered": make_task("judge me", expected="!judge-down", id=f"{prefix}-filtered"),
        "failed": counter_task("broken count", 1, id=f"{prefix}-failed"),
        "refused": counter_task("count", 1, id=f"{prefix}-refused", policy={"model": "no-such-model"}),
        "drifted": counter_task("count while drifting", 1, id=f"{prefix}-drifted", policy=drifting),
    }
    with rollserve.Client(URL, token=TOKEN) as client:
        submitted = client.submit(list(tasks.values()))
        client.wait(submitted)
        out = {}
        for name, task in tasks.items():
            got = client.training(task["id"])  # a task of one sample has the sample's id: its view
            out[name] = [got] if isinstance(got, rollserve.TrainingView) else [v for v in got if v is not None]
    assert {name: len(v) for name, v in out.items()} == {name: task["n"] for name, task in tasks.items()}
    return out


def expected_row(view: rollserve.TrainingView, P: int, R: int, *, advantages: str = "turn") -> Dict[str, List[Any]]:
    """What one batch row must hold, written out from the view token by token (its per-turn
    advantages through `response_turn`, where build_batch goes through `generation_span`)."""
    prompt, response = list(view.prompt_ids or []), list(view.response_ids or [])
    prompt = prompt[max(0, len(prompt) - P) :]
    n = min(len(response), R)
    mask = list(view.response_mask or [])[:n]
    turn_advantage = {t["index"]: t["advantage"] for t in view.turns}
    token_advantages = []
    for k in range(n):
        if not mask[k]:
            token_advantages.append(0.0)
            continue
        value = turn_advantage.get(view.response_turn[k]) if advantages == "turn" else None
        token_advantages.append(value if value is not None else (view.advantage or 0.0))
    attention = [0] * (P - len(prompt)) + [1] * (len(prompt) + n) + [0] * (R - n)
    positions, seen = [], 0
    for a in attention:
        seen += a
        positions.append(max(seen - 1, 0))
    return {
        "prompts": [PAD] * (P - len(prompt)) + prompt,
        "responses": response[:n] + [PAD] * (R - n),
        "input_ids": [PAD] * (P - len(prompt)) + prompt + response[:n] + [PAD] * (R - n),
        "attention_mask": attention,
        "position_ids": positions,
        "response_mask": mask + [0] * (R - n),
        "rollout_log_probs": list(view.response_logprobs or [])[:n] + [0.0] * (R - n),
        "token_level_scores": [0.0] * (n - 1) + [view.reward] + [0.0] * (R - n),
        "advantages": token_advantages + [0.0] * (R - n),
    }


def check_batch(batch: TrainingBatch, rows: List[rollserve.TrainingView], *, advantages: str = "turn") -> None:
    P, R = batch.meta_info["prompt_length"], batch.meta_info["response_length"]
    assert len(batch) == len(rows)
    for name, array in batch.batch.items():
        width = P + R if name in ("input_ids", "attention_mask", "position_ids") else P if name == "prompts" else R
        assert array.shape == (len(rows), width), name
        assert array.dtype == (np.float32 if name in ("rollout_log_probs", "token_level_scores", "advantages") else np.int64), name
    for i, view in enumerate(rows):
        want = expected_row(view, P, R, advantages=advantages)
        for name, values in want.items():
            got = batch.batch[name][i].tolist()
            if name in ("rollout_log_probs", "token_level_scores", "advantages"):
                assert got == pytest.approx(values, abs=1e-6), (view.id, name)
            else:
                assert got == values, (view.id, name)
        assert batch.non_tensor_batch["uid"][i] == view.task_id
        assert batch.non_tensor_batch["rollout_id"][i] == view.id
        assert batch.non_tensor_batch["sample_index"][i] == view.sample_index
        assert batch.non_tensor_batch["score"][i] == view.reward
        assert batch.non_tensor_batch["advantage"][i] == view.advantage
        assert batch.non_tensor_batch["filter"][i] is view.filter
        for name in ("weight_version_min", "weight_version_max", "finish_reason"):
            assert batch.non_tensor_batch[name][i] == view.raw.get(name), name
        cut = len(view.prompt_ids or []) > P or len(view.response_ids or []) > R
        assert batch.non_tensor_batch["truncated"][i] is (bool(view.raw.get("truncated")) or cut)
        tool_answers = sum(len(t["tool_calls"]) for t in view.turns)
        assert batch.non_tensor_batch["__num_turns__"][i] == 1 + len(view.turns) + tool_answers


def test_the_views_are_what_the_batches_are_tested_on(views: Dict[str, List[rollserve.TrainingView]]) -> None:
    for view in views["tools"] + views["tools-long"]:
        assert view.sequence_error is None and len(view.turns) == 2 and view.turns[0]["tool_calls"]
        first, second = view.turns[0]["generation_span"], view.turns[1]["generation_span"]
        assert second[0] > first[1]  # tool output and template tokens between the generations
        assert view.response_mask[first[1] : second[0]] == [0] * (second[0] - first[1])
        assert any(t["advantage"] not in (None, view.advantage) for t in view.turns)
    assert len({len(v.prompt_ids) for vs in views.values() for v in vs if v.prompt_ids}) >= 3
    assert {v.reward for v in views["coin"]} == {0.0, 1.0} and all(v.advantage for v in views["coin"])
    [filtered] = views["filtered"]
    assert filtered.filter and filtered.prompt_ids is not None and len(filtered.turns) == 1
    [failed] = views["failed"]
    # a failed sample keeps the turns it made before the failure
    assert failed.filter and failed.prompt_ids is not None and len(failed.turns) == 1 and failed.sequence_error is None
    [refused] = views["refused"]
    assert refused.filter and refused.prompt_ids is None and refused.sequence_error == "the rollout has no turns"
    [drifted] = views["drifted"]
    assert drifted.prompt_ids is None and "drift" in drifted.sequence_error and not drifted.filter


def test_a_batch_pads_and_masks_every_view_as_verl_does(views: Dict[str, List[rollserve.TrainingView]]) -> None:
    every = [v for vs in views.values() for v in vs]
    batch = build_batch(every, pad_token_id=PAD)
    kept = [v for v in every if not v.filter and v.prompt_ids is not None]
    check_batch(batch, kept)
    assert batch.meta_info["prompt_length"] == max(len(v.prompt_ids) for v in kept)
    assert batch.meta_info["response_length"] == max(len(v.response_ids) for v in kept)
    [filtered], [failed], [refused], [drifted] = views["filtered"], views["failed"], views["refused"], views["drifted"]
    assert batch.meta_info["dropped"] == [
        {"id": filtered.id, "reason": "filtered (infrastructure failure)"},
        {"id": failed.id, "reason": "filtered (infrastructure failure)"},
        {"id": refused.id, "reason": "filtered (infrastructure failure)"},
        {"id": drifted.id, "reason": drifted.sequence_error},
    ]
    # the sample's advantage everywhere on its generated tokens
    check_batch(build_batch(every, pad_token_id=PAD, advantages="sample"), kept, advantages="sample")


def test_filtered_samples_can_be_kept_and_drifted_ones_refused(views: Dict[str, List[rollserve.TrainingView]]) -> None:
    rows = views["tools"] + views["filtered"] + views["failed"]
    batch = build_batch(rows + views["refused"] + views["drifted"], pad_token_id=PAD, drop_filtered=False)
    check_batch(batch, rows)
    assert batch.non_tensor_batch["filter"].tolist() == [False, False, False, True, True]
    # a filtered sample without tokens can not be kept
    assert batch.meta_info["dropped"] == [{"id": v.id, "reason": v.sequence_error} for v in views["refused"] + views["drifted"]]
    with pytest.raises(ValueError, match=f"rollout {views['drifted'][0].id} has no token sequence: re-tokenisation drift"):
        build_batch(rows + views["drifted"], unusable="error")


def test_fixed_lengths_pad_further_and_overlong_samples_are_refused_dropped_or_cut(views: Dict[str, List[rollserve.TrainingView]]) -> None:
    rows = views["tools"] + views["tools-long"] + views["short"] + views["long"]
    P = max(len(v.prompt_ids) for v in rows)
    R = max(len(v.response_ids) for v in rows)
    wide = build_batch(rows, pad_token_id=PAD, max_prompt_length=P + 5, max_response_length=R + 3)
    assert wide.meta_info["prompt_length"] == P + 5 and wide.meta_info["response_length"] == R + 3
    check_batch(wide, rows)

    # a cap under the longest: every sample over it is refused, dropped or cut
    cap_p = min(len(v.prompt_ids) for v in rows) + 1
    cap_r = sorted(len(v.response_ids) for v in rows)[len(rows) // 2]
    over = [v for v in rows if len(v.prompt_ids) > cap_p or len(v.response_ids) > cap_r]
    assert 0 < len(over) < len(rows)
    with pytest.raises(ValueError, match=f"rollout {over[0].id} has .* over max_prompt_length={cap_p} / max_response_length={cap_r}"):
        build_batch(rows, max_prompt_length=cap_p, max_response_length=cap_r)
    dropped = build_batch(rows, pad_token_id=PAD, max_prompt_length=cap_p, max_response_length=cap_r, overlong="drop")
    check_batch(dropped, [v for v in rows if v not in over])
    assert [d["id"] for d in dropped.meta_info["dropped"]] == [v.id for v in over]
    cut = build_batch(rows, pad_token_id=PAD, max_prompt_length=cap_p, max_response_length=cap_r, overlong="truncate")
    check_batch(cut, rows)  # prompts keep their last tokens, responses their first; the reward on the last one kept
    assert cut.non_tensor_batch["truncated"].tolist() == [v in over for v in rows]
    # overlong filtering: the cut samples stay in the batch, out of the loss (mask and advantages 0)
    masked = build_batch(rows, pad_token_id=PAD, max_prompt_length=cap_p, max_response_length=cap_r, overlong="truncate", mask_truncated=True)
    for i, view in enumerate(rows):
        if view in over:
            assert masked.batch["response_mask"][i].tolist() == [0] * cap_r and not masked.batch["advantages"][i].any()
            assert masked.batch["responses"][i].tolist() == cut.batch["responses"][i].tolist()
        else:
            assert masked.batch["response_mask"][i].tolist() == cut.batch["response_mask"][i].tolist()
    assert any(masked.batch["response_mask"][i].any() for i, v in enumerate(rows) if v not in over)


def test_skyrl_generator_output_keeps_each_view_unpadded(views: Dict[str, List[rollserve.TrainingView]]) -> None:
    rows = views["tools"] + views["coin"] + views["filtered"]
    out = to_skyrl(rows)
    assert out["prompt_token_ids"] == [v.prompt_ids for v in rows]
    assert out["response_ids"] == [v.response_ids for v in rows]
    assert out["loss_masks"] == [v.response_mask if not v.filter else [0] * len(v.response_ids) for v in rows]
    assert out["rollout_logprobs"] == [v.response_logprobs for v in rows]
    assert out["rewards"] == [v.reward for v in rows]
    assert [(t.instance_id, t.repetition_id) for t in out["trajectory_ids"]] == [(v.task_id, v.sample_index) for v in rows]
    assert out["is_last_step"] is None and out["sampling_masks"] is None
    assert out["rollout_metrics"]["generate/max_num_tokens"] == max(len(v.response_ids) for v in rows)

    per_token = to_skyrl(rows, rewards="token")["rewards"]
    assert per_token == [[0.0] * (len(v.response_ids) - 1) + [v.reward] for v in rows]
    per_turn = to_skyrl(views["tools"], rewards="turn")["rewards"]
    for view, values in zip(views["tools"], per_turn):
        ends = {t["generation_span"][1] - 1: t["reward"] for t in view.turns}
        assert values == pytest.approx([ends.get(k, 0.0) for k in range(len(view.response_ids))])

    # a view the service flagged truncated (cut by max_response_tokens, or stopped on "length")
    flagged = [dict(rows[0].raw, truncated=True)] + [v.raw for v in rows[1:]]
    masked = to_skyrl(flagged, mask_truncated=True)["loss_masks"]
    assert masked[0] == [0] * len(rows[0].response_ids) and masked[1:] == out["loss_masks"][1:]
    assert to_skyrl(flagged)["loss_masks"] == out["loss_masks"]

    with pytest.raises(ValueError, match="has no token sequence"):
        to_skyrl(views["drifted"])
    masked = to_skyrl(views["drifted"], unusable="mask", pad_token_id=PAD)
    assert masked["response_ids"] == [[PAD]] and masked["loss_masks"] == [[0]] and masked["rewards"] == [0.0]


def _torch() -> Optional[Any]:
    try:
        import torch
    except ImportError:
        return None
    return torch


@pytest.mark.skipif(_torch() is None, reason="torch is not installed for this python3 (the batches are numpy; torch is asked for with return_tensors='pt')")
def test_torch_tensors_hold_the_same_batch(views: Dict[str, List[rollserve.TrainingView]]) -> None:
    torch = _torch()
    rows = views["tools"] + views["short"]
    as_numpy = build_batch(rows, pad_token_id=PAD)
    as_torch = build_batch(rows, pad_token_id=PAD, return_tensors="pt")
    for name, array in as_numpy.batch.items():
        assert isinstance(as_torch.batch[name], torch.Tensor) and as_torch.batch[name].tolist() == array.tolist()


def test_the_client_imports_without_numpy() -> None:
    import subprocess
    import sys

    code = "import sys; sys.modules['numpy'] = None; import rollserve, rollserve.training, rollserve.adapters.nemo_rl; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ})
    assert out.stdout.strip() == "ok", out.stderr
