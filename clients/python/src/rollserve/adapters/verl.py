"""A verl agent loop that runs each sample as a rollout of the service: ``RolloutServiceAgentLoop``,
registered as ``"rollserve"`` the way verl registers its own (``@register`` in
``verl.experimental.agent_loop.agent_loop``). verl pads its ``AgentLoopOutput`` into the
DataProto itself (``_postprocess``): this returns the service's training view as that output.

Configure it in verl's agent loop config file (``actor_rollout_ref.rollout.agent.
agent_loop_config_path``), whose extra keys verl passes to the loop::

    - name: rollserve
      _target_: rollserve.adapters.verl.RolloutServiceAgentLoop
      url: http://service-host:8100
      token: ${oc.env:ROLLSERVE_TOKEN}
      env: math
      policy: {model: Qwen/Qwen3-8B}

or rely on the registration (``agent_name: rollserve`` in the dataset) and ``ROLLSERVE_URL``,
``ROLLSERVE_TOKEN``, ``ROLLSERVE_ENV``, ``ROLLSERVE_MODEL`` in the environment. Add verl's rollout
servers (``AgentLoopManager.server_addresses``) as the service's backends so that the policy
being trained generates: ``client.backends.add(f"http://{address}/v1")``.

Without verl installed the module defines the same names over stand-ins with the shapes verl
declares (``AgentLoopBase.__init__(trainer_config, server_manager, tokenizer, processor,
**kwargs)``, ``async run(sampling_params, **kwargs) -> AgentLoopOutput``), so that it imports and
can be driven without verl."""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Mapping, Optional

from ..aio import AsyncClient
from ..models import TrainingView
from ..training import num_turns_of
from ._common import make_task, training_views, usable

try:
    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

    VERL_INSTALLED = True
except ImportError:
    VERL_INSTALLED = False
    _agent_loop_registry: Dict[str, Dict[str, Any]] = {}

    @dataclass
    class AgentLoopMetrics:  # type: ignore[no-redef]
        """verl's ``AgentLoopMetrics`` (a pydantic model there)."""

        generate_sequences: float = 0.0
        tool_calls: float = 0.0

    @dataclass
    class AgentLoopOutput:  # type: ignore[no-redef]
        """verl's ``AgentLoopOutput`` (a pydantic model there)."""

        prompt_ids: List[int]
        response_ids: List[int]
        response_mask: List[int]
        metrics: AgentLoopMetrics
        response_logprobs: Optional[List[float]] = None
        multi_modal_data: Optional[Dict[str, Any]] = None
        reward_score: Optional[float] = None
        num_turns: int = 0
        extra_fields: Dict[str, Any] = field(default_factory=dict)

    class AgentLoopBase(ABC):  # type: ignore[no-redef]
        """verl's ``AgentLoopBase``: one instance per sample, ``init_class`` once per class."""

        _class_initialized = False

        def __init__(self, trainer_config: Any, server_manager: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
            self.init_class(config=trainer_config.config, tokenizer=tokenizer, processor=processor, **kwargs)
            self.config = trainer_config.config
            self.server_manager = server_manager
            self.tokenizer = tokenizer
            self.processor = processor

        @classmethod
        def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
            if cls._class_initialized:
                return
            cls._class_initialized = True

        @abstractmethod
        async def run(self, sampling_params: Dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            raise NotImplementedError

    def register(agent_name: str) -> Any:  # type: ignore[no-redef]
        def decorator(subclass: type) -> type:
            _agent_loop_registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
            return subclass

        return decorator


def _response_length(config: Any) -> Optional[int]:
    try:
        return int(config.actor_rollout_ref.rollout.response_length)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


@register("rollserve")
class RolloutServiceAgentLoop(AgentLoopBase):
    """Runs the sample on the rollout service (one task, n=1: verl repeats a prompt ``rollout.n``
    times itself) and returns its training view as verl's ``AgentLoopOutput``: ``prompt_ids``,
    ``response_ids`` / ``response_mask`` / ``response_logprobs`` cut to ``rollout.response_length``
    as verl's own loops cut them, ``reward_score`` the service's reward (so verl's reward manager
    is not asked again), ``num_turns``, and in ``extra_fields`` the rollout id, the sample's
    advantage, each turn's advantage and span, the weight versions, ``finish_reason`` and
    ``truncated`` when the service gives them.

    The task: environment ``extra_info["env"]`` else the configured ``env``; row
    ``extra_info["row"]`` (the environment's dataset row) with ``responses_create_params.input``
    set to the dataset's ``raw_prompt`` unless the row has one; policy the configured ``policy``
    with verl's temperature / top_p / repetition_penalty. Override ``make_task`` to build it
    otherwise. A filtered sample (infrastructure failure) or one without a token sequence (drift:
    use ``policy.generation: "tokens"``) raises RuntimeError: verl has no way to leave a sample
    out of a step, and a zero-reward stand-in would enter the group's statistics."""

    client: ClassVar[Optional[AsyncClient]] = None
    env: ClassVar[Optional[str]] = None
    policy: ClassVar[Dict[str, Any]] = {}

    @classmethod
    def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
        if cls._class_initialized:
            return
        cls._class_initialized = True
        url = kwargs.get("url") or os.environ.get("ROLLSERVE_URL")
        if not url:
            raise ValueError("RolloutServiceAgentLoop needs the service's URL: `url` in the agent loop config, or ROLLSERVE_URL")
        cls.client = AsyncClient(url, token=kwargs.get("token") or os.environ.get("ROLLSERVE_TOKEN") or None, timeout=kwargs.get("timeout", 60))
        cls.env = kwargs.get("env") or os.environ.get("ROLLSERVE_ENV")
        policy = dict(kwargs.get("policy") or {})
        if "model" not in policy and os.environ.get("ROLLSERVE_MODEL"):
            policy["model"] = os.environ["ROLLSERVE_MODEL"]
        cls.policy = policy

    def make_task(self, sampling_params: Dict[str, Any], **kwargs: Any) -> Dict[str, Any]:
        extra_info: Mapping[str, Any] = kwargs.get("extra_info") or {}
        env = extra_info.get("env") or self.env
        if not env:
            raise ValueError("no environment: give `env` in the agent loop config or `env` in the sample's extra_info")
        prompt = kwargs.get("raw_prompt")
        return make_task(env, extra_info.get("row"), list(prompt) if prompt is not None else None, self.policy, sampling_params)

    async def run(self, sampling_params: Dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        assert self.client is not None
        started = time.perf_counter()
        submitted = await self.client.submit(self.make_task(sampling_params, **kwargs))
        [view] = await training_views(self.client, submitted)
        return self.output(view, seconds=time.perf_counter() - started)

    def output(self, view: TrainingView, *, seconds: float = 0.0) -> AgentLoopOutput:
        problem = usable(view)
        if problem is not None:
            raise RuntimeError(problem)
        assert view.prompt_ids is not None and view.response_ids is not None and view.response_mask is not None
        limit = _response_length(self.config)
        cut = limit is not None and len(view.response_ids) > limit
        end = limit if cut else len(view.response_ids)
        turns = view.turns
        raw = view.raw
        return AgentLoopOutput(
            prompt_ids=list(view.prompt_ids),
            response_ids=view.response_ids[:end],
            response_mask=view.response_mask[:end],
            response_logprobs=None if view.response_logprobs is None else view.response_logprobs[:end],
            reward_score=float(view.reward),
            num_turns=num_turns_of(raw),
            # The service times each stage, not verl's split between generation and tools.
            metrics=AgentLoopMetrics(generate_sequences=seconds, tool_calls=0.0),
            extra_fields={
                "rollserve_rollout_id": view.id,
                "rollserve_task_id": view.task_id,
                "rollserve_advantage": view.advantage,
                "rollserve_turn_advantages": [t.get("advantage") for t in turns],
                "rollserve_generation_spans": [t.get("generation_span") for t in turns],
                "rollserve_weight_version_min": raw.get("weight_version_min"),
                "rollserve_weight_version_max": raw.get("weight_version_max"),
                "rollserve_finish_reason": raw.get("finish_reason"),
                "rollserve_truncated": bool(raw.get("truncated")) or cut,
            },
        )
