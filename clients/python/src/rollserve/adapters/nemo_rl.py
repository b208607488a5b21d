"""NeMo-RL over the service's NeMo Gym agent face.

NeMo-RL's GRPO with ``env.should_use_nemo_gym: true`` hands each dataset row to NeMo Gym's
rollout collection, which posts it to the agent server's ``POST /run`` (``agent_ref.name`` picks
the server) and turns each verify response into NeMo-RL's ``message_log``
(``NemoGym._postprocess_nemo_gym_to_nemo_rl_result`` in ``nemo_rl/environments/nemo_gym.py``).
The service answers ``/run`` as NeMo Gym's simple_agent does, with the token ids on each model
call's last output item, so NeMo-RL reaches it by configuration: the agent's host is the
service's, written ``rollserve:<token>@<host>`` when the service has a token (NeMo Gym's aiohttp
client sends a URL's credentials as HTTP Basic, which the agent face takes, the token as the
password).

This module is that path without Ray or NeMo Gym, for a trainer that drives NeMo-RL's loss
itself or to check a deployment: ``NemoGymAgentClient.run_rollouts(rows)`` posts the rows to
``/run`` with the URL's credentials as HTTP Basic (as aiohttp does) and returns
``(results, timing_metrics)`` as NeMo-RL's ``NemoGym.run_rollouts`` does, each result
``{"message_log", "input_message_log", "full_result"}`` built by ``to_nemo_rl_result`` the way
NeMo-RL builds it (token ids as torch tensors when torch is installed, lists otherwise).
``nemo_gym_agent_config`` writes the NeMo Gym config block naming the service as the agent."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote, unquote, urlsplit

from ..errors import RolloutServiceError, ServiceConnectionError


def _tensor(values: Sequence[Any]) -> Any:
    try:
        import torch
    except ImportError:
        return list(values)
    return torch.tensor(values)


def to_nemo_rl_result(gym_result: Mapping[str, Any]) -> Dict[str, Any]:
    """NeMo-RL's result of one ``/run`` answer: for each output item with token ids, a ``user``
    message with the prompt tokens not seen before and an ``assistant`` message with the generated
    tokens and their ``generation_logprobs``; raises ValueError where a prompt does not extend the
    tokens seen so far (NeMo-RL asserts the same: "Non-contiguous messages found")."""
    message_log: List[Dict[str, Any]] = []
    seen: List[int] = []
    for item in gym_result["response"]["output"]:
        if "generation_token_ids" not in item:
            continue
        prompt = list(item["prompt_token_ids"])
        if prompt[: len(seen)] != seen:
            raise ValueError(f"Non-contiguous messages found: a prompt of {len(prompt)} tokens does not extend the {len(seen)} seen before (re-tokenisation drift?)")
        generated = list(item["generation_token_ids"])
        message_log.append({"role": "user", "content": "", "token_ids": _tensor(prompt[len(seen) :])})
        message_log.append({"role": "assistant", "content": "", "token_ids": _tensor(generated), "generation_logprobs": _tensor(list(item["generation_log_probs"]))})
        seen.extend(prompt[len(seen) :])
        seen.extend(generated)
    return {"message_log": message_log, "input_message_log": message_log[:1], "full_result": dict(gym_result)}


def nemo_gym_agent_config(url: str, *, token: Optional[str] = None, name: str = "rollserve_agent", agent: str = "simple_agent", datasets: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
    """The NeMo Gym config entry of an agent server that is the service: ``{name:
    {"responses_api_agents": {agent: {"host": "rollserve:<token>@<host>", "port": <port>, ...}}}}``
    (the token percent-encoded), for NeMo-RL's ``env.nemo_gym`` config; rows name it in
    ``agent_ref.name``. The service serves the agent, so nothing is started for it."""
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"the service's URL needs a host and a port: {url!r}")
    host = parts.hostname if token is None else f"rollserve:{quote(token, safe='')}@{parts.hostname}"
    block: Dict[str, Any] = {"host": host, "port": parts.port}
    if datasets is not None:
        block["datasets"] = datasets
    return {name: {"responses_api_agents": {agent: block}}}


class NemoGymAgentClient:
    """Posts NeMo Gym rows to the service's ``/run`` as NeMo Gym's client does. ``url`` is
    ``http://host:port`` or ``http://rollserve:<token>@host:port``; ``token`` is the same given
    apart. ``concurrency`` bounds the rollouts in flight (NeMo Gym's aiohttp connector limit)."""

    def __init__(self, url: str, *, token: Optional[str] = None, timeout: Optional[float] = None, concurrency: int = 256) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.hostname is None:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        password = token if token is not None else (unquote(parts.password) if parts.password is not None else None)
        user = unquote(parts.username) if parts.username else "rollserve"
        self.authorization = None if password is None else "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout
        self.concurrency = concurrency

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        connection_class = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        connection = connection_class(self.host, self.port, timeout=self.timeout)
        headers = {"content-type": "application/json"}
        if self.authorization is not None:
            headers["authorization"] = self.authorization
        try:
            connection.request("POST", self.prefix + path, body=json.dumps(body), headers=headers)
            response = connection.getresponse()
            data = response.read()
        except OSError as error:
            raise ServiceConnectionError(f"POST {path} to {self.host}:{self.port} failed: {error}", method="POST", path=path) from error
        finally:
            connection.close()
        if response.status != 200:
            raise RolloutServiceError(response.status, f"HTTP_{response.status}", data.decode("utf-8", "replace")[:500], method="POST", path=path)
        return json.loads(data)

    async def run(self, row: Mapping[str, Any]) -> Dict[str, Any]:
        """``POST /run``: the verify response of one rollout of ``row``."""
        body = {k: v for k, v in row.items() if k != "_rowidx"}
        return await asyncio.to_thread(self._post, "/run", body)

    async def run_rollouts(self, examples: Sequence[Mapping[str, Any]]) -> Tuple[List[Dict[str, Any]], Dict[str, float]]:
        """What NeMo-RL's ``NemoGym.run_rollouts`` returns: one NeMo-RL result per row, in the
        rows' order (``_rowidx`` when the rows carry it), and timing metrics."""
        started = time.perf_counter()
        limit = asyncio.Semaphore(self.concurrency)

        async def one(row: Mapping[str, Any]) -> Dict[str, Any]:
            async with limit:
                return await self.run(row)

        answers = await asyncio.gather(*(one(row) for row in examples))
        ran = time.perf_counter()
        results: List[Optional[Dict[str, Any]]] = [None] * len(examples)
        for position, (row, answer) in enumerate(zip(examples, answers)):
            results[row.get("_rowidx", position)] = to_nemo_rl_result(answer)
        done = time.perf_counter()
        timing = {"rollserve/run_rollouts": ran - started, "rollserve/postprocess_results": done - ran}
        return [r for r in results if r is not None], timing
