"""Submits N single-turn tasks through the client and reads their results from the stream;
prints {"seconds", "submit_ms", "results", "rewards"} as JSON. Used by `pnpm bench python-client`.

    python3 benchmarks/throughput.py '{"url": "...", "count": 1000, "mode": "sync"|"async", "task": {...}}'

``task["row"]["responses_create_params"]["input"]`` may hold "{i}", replaced by the task's index."""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import rollserve  # noqa: E402


def tasks(template: dict, count: int) -> list:
    out = []
    for i in range(count):
        task = copy.deepcopy(template)
        rcp = task["row"]["responses_create_params"]
        rcp["input"] = rcp["input"].replace("{i}", str(i))
        out.append(task)
    return out


def run_sync(options: dict, batch: list) -> dict:
    with rollserve.Client(options["url"], token=options.get("token")) as client:
        started = time.perf_counter()
        cpu = time.process_time()
        submitted = client.submit(batch)
        submit_ms = (time.perf_counter() - started) * 1000
        rewards = [r.reward for r in client.iter_results(submitted)]
        return {"seconds": time.perf_counter() - started, "submit_ms": submit_ms, "results": len(rewards), "rewards": sum(rewards), "cpu_seconds": time.process_time() - cpu}


async def run_async(options: dict, batch: list) -> dict:
    async with rollserve.AsyncClient(options["url"], token=options.get("token")) as client:
        started = time.perf_counter()
        cpu = time.process_time()
        submitted = await client.submit(batch)
        submit_ms = (time.perf_counter() - started) * 1000
        rewards = [r.reward async for r in client.iter_results(submitted)]
        return {"seconds": time.perf_counter() - started, "submit_ms": submit_ms, "results": len(rewards), "rewards": sum(rewards), "cpu_seconds": time.process_time() - cpu}


def main() -> None:
    options = json.loads(sys.argv[1])
    batch = tasks(options["task"], options["count"])
    if options.get("mode") == "async":
        report = asyncio.run(run_async(options, batch))
    else:
        report = run_sync(options, batch)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
