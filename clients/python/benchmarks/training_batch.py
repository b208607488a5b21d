"""Time of ``rollserve.training.build_batch`` over synthetic training views shaped as the service's
(multi-turn: generations with logprobs, tool outputs between them, per-turn advantages), parsed
from JSON as the client holds them: ``python3 training_batch.py [samples] [tokens]`` builds the
batch five times and prints one JSON line. `pnpm bench training-batch` runs it with 1,024 samples
of 8k tokens."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rollserve.training import build_batch  # noqa: E402


def synthetic_view(index: int, tokens: int, rng: random.Random) -> dict:
    """A multi-turn view: a prompt of ~1/8 of the tokens, then turns of generation and tool output."""
    prompt_length = tokens // 8
    response_length = tokens - prompt_length - rng.randrange(0, tokens // 16)
    response_mask, response_turn, turns = [], [], []
    position, turn = 0, 0
    while position < response_length:
        generated = min(rng.randrange(200, 800), response_length - position)
        turns.append({"index": turn, "generation_span": [position, position + generated], "reward": 0.0, "advantage": rng.uniform(-1, 1)})
        response_mask += [1] * generated
        response_turn += [turn] * generated
        position += generated
        context = min(rng.randrange(50, 300), response_length - position)
        response_mask += [0] * context
        response_turn += [turn + 1] * context
        position += context
        turn += 1
    text = json.dumps({
        "id": f"r{index}", "task_id": f"t{index // 8}", "sample_index": index % 8, "reward": float(index % 2),
        "advantage": 0.5, "filter": False, "sequence_error": None,
        "prompt_ids": [rng.randrange(1, 150000) for _ in range(prompt_length)],
        "response_ids": [rng.randrange(1, 150000) for _ in range(response_length)],
        "response_mask": response_mask, "response_turn": response_turn,
        "response_logprobs": [-rng.random() if m else 0.0 for m in response_mask],
        "turns": turns,
    })
    return json.loads(text)


def main() -> None:
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    rng = random.Random(0)
    views = [synthetic_view(i, tokens, rng) for i in range(samples)]
    # CPU time beside wall time: on a busy machine the wall clock counts other processes' turns.
    seconds, cpu = [], []
    for _ in range(5):
        started, started_cpu = time.perf_counter(), time.process_time()
        batch = build_batch(views, max_prompt_length=tokens // 8, max_response_length=tokens - tokens // 8)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    shape = list(batch.batch["input_ids"].shape)
    print(json.dumps({"samples": samples, "tokens": tokens, "shape": shape, "seconds": seconds, "cpu_seconds": cpu}))


if __name__ == "__main__":
    main()
