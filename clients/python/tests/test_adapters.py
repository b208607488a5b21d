"""The trainer adapters driven end to end against the real service. verl and SkyRL are not
installable here (no distribution in this machine's package index), so each adapter runs against
stand-in modules that reproduce the shapes their code declares (read from volcengine/verl
verl/experimental/agent_loop/agent_loop.py and NovaSky-AI/SkyRL skyrl-train
skyrl_train/generators/base.py): same module paths, class names, fields and signatures. The
NeMo-RL path needs no framework: it is NeMo Gym's HTTP call to the agent face, with the token as
HTTP Basic from the URL as NeMo Gym's aiohttp client sends it."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Dict, Iterator, List, Optional, TypedDict, Union
from urllib.parse import urlsplit

import pytest

import rollserve
from conftest import TOKEN, URL

COUNT_ROW = {"responses_create_params": {"input": "count to two"}, "initial_count": 0, "expected_count": 2}
POLICY = {"model": "fake-policy"}


def _install(modules: Dict[str, types.ModuleType]) -> Dict[str, Any]:
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    return saved


def _restore(saved: Dict[str, Any]) -> None:
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module


def _fresh(name: str) -> Any:
    """Import ``name`` anew, so that it binds the stand-ins installed at the time."""
    sys.modules.pop(name, None)
    return importlib.import_module(name)


# -- verl: verl.experimental.agent_loop.agent_loop, as its code declares it (pydantic models there,
# dataclasses here: same fields and defaults, and unknown fields are refused) ----------------------


def verl_standin() -> Dict[str, types.ModuleType]:
    agent_loop = types.ModuleType("verl.experimental.agent_loop.agent_loop")

    @dataclass
    class AgentLoopMetrics:
        generate_sequences: float = 0.0
        tool_calls: float = 0.0

    @dataclass
    class AgentLoopOutput:
        prompt_ids: List[int]
        response_ids: List[int]
        response_mask: List[int]
        metrics: AgentLoopMetrics
        response_logprobs: Optional[List[float]] = None
        multi_modal_data: Optional[Dict[str, Any]] = None
        reward_score: Optional[float] = None
        num_turns: int = 0
        extra_fields: Dict[str, Any] = field(default_factory=dict)

    class _DummyConfig:
        def __init__(self, config: Any) -> None:
            self.config = config

    class AgentLoopBase(ABC):
        _class_initialized = False

        def __init__(self, trainer_config: _DummyConfig, server_manager: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
            self.init_class(config=trainer_config.config, tokenizer=tokenizer, processor=processor, **kwargs)
            self.config = trainer_config.config
            self.server_manager = server_manager
            self.tokenizer = tokenizer
            self.processor = processor
            self.loop = asyncio.get_running_loop()

        @classmethod
        def init_class(cls, config: Any, tokenizer: Any, processor: Any, **kwargs: Any) -> None:
            if cls._class_initialized:
                return
            cls._class_initialized = True

        @abstractmethod
        async def run(self, sampling_params: Dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            raise NotImplementedError

    registry: Dict[str, Dict[str, Any]] = {}

    def register(agent_name: str) -> Any:
        def decorator(subclass: type) -> type:
            registry[agent_name] = {"_target_": f"{subclass.__module__}.{subclass.__qualname__}"}
            return subclass

        return decorator

    agent_loop.AgentLoopMetrics = AgentLoopMetrics
    agent_loop.AgentLoopOutput = AgentLoopOutput
    agent_loop.AgentLoopBase = AgentLoopBase
    agent_loop._DummyConfig = _DummyConfig
    agent_loop._agent_loop_registry = registry
    agent_loop.register = register
    return {
        "verl": types.ModuleType("verl"),
        "verl.experimental": types.ModuleType("verl.experimental"),
        "verl.experimental.agent_loop": types.ModuleType("verl.experimental.agent_loop"),
        "verl.experimental.agent_loop.agent_loop": agent_loop,
    }


def instantiate(config: Dict[str, Any], **kwargs: Any) -> Any:
    """hydra.utils.instantiate as verl's worker calls it: the class named by ``_target_``, called
    with the config's other keys and the worker's arguments."""
    module, _, name = config["_target_"].rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**{k: v for k, v in config.items() if k != "_target_"}, **kwargs)


@pytest.fixture
def verl() -> Iterator[types.ModuleType]:
    saved = _install(verl_standin())
    try:
        yield sys.modules["verl.experimental.agent_loop.agent_loop"]
    finally:
        _restore(saved)
        sys.modules.pop("rollserve.adapters.verl", None)


def test_verl_agent_loop_runs_each_sample_on_the_service(verl: types.ModuleType, client: rollserve.Client) -> None:
    adapter = _fresh("rollserve.adapters.verl")
    assert adapter.VERL_INSTALLED and adapter.AgentLoopBase is verl.AgentLoopBase
    # registered as verl registers its own loops, and configured as its agent loop config file would
    assert verl._agent_loop_registry["rollserve"] == {"_target_": "rollserve.adapters.verl.RolloutServiceAgentLoop"}
    loop_config = {**verl._agent_loop_registry["rollserve"], "url": URL, "token": TOKEN, "env": "counter", "policy": POLICY}

    def trainer_config(response_length: int) -> Any:
        return verl._DummyConfig(SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(prompt_length=512, response_length=response_length))))

    # what verl's AgentLoopWorker passes: its sampling params, then each dataset field
    sampling_params = {"temperature": 1.0, "top_p": 1.0, "repetition_penalty": 1.0, "logprobs": True}

    def sample(i: int, **extra_info: Any) -> Dict[str, Any]:
        return {"raw_prompt": [{"role": "user", "content": "count to two"}], "extra_info": {"index": i, "row": COUNT_ROW, **extra_info}, "index": i, "agent_name": "rollserve", "data_source": "counter"}

    async def main() -> List[Any]:
        loops = [instantiate(loop_config, trainer_config=trainer_config(4096), server_manager=None, tokenizer=None, processor=None) for _ in range(3)]
        short = instantiate(loop_config, trainer_config=trainer_config(10), server_manager=None, tokenizer=None, processor=None)
        outputs = await asyncio.gather(*(loop.run(sampling_params, **sample(i)) for i, loop in enumerate(loops)), short.run(sampling_params, **sample(3)))
        with pytest.raises(RuntimeError, match="has no token sequence: re-tokenisation drift"):
            drifted = instantiate(loop_config, trainer_config=trainer_config(4096), server_manager=None, tokenizer=None, processor=None)
            drifted.policy = {"model": "fake-policy", "base_url": os.environ["ROLLSERVE_DRIFTING_POLICY_URL"]}
            await drifted.run(sampling_params, **sample(4))
        await adapter.RolloutServiceAgentLoop.client.close()
        return list(outputs)

    outputs = asyncio.run(main())
    for i, output in enumerate(outputs):
        assert isinstance(output, verl.AgentLoopOutput) and isinstance(output.metrics, verl.AgentLoopMetrics)
        view = client.training(output.extra_fields["rollserve_rollout_id"])
        limit = 10 if i == 3 else 4096
        assert output.prompt_ids == view.prompt_ids
        assert output.response_ids == view.response_ids[:limit] and output.response_mask == view.response_mask[:limit]
        assert output.response_logprobs == view.response_logprobs[:limit]
        assert output.reward_score == view.reward == 1.0
        assert output.num_turns == 4  # user, assistant (tool call), tool, assistant
        assert output.extra_fields["rollserve_truncated"] is (len(view.response_ids) > limit)
        assert output.extra_fields["rollserve_turn_advantages"] == [t["advantage"] for t in view.turns]
    assert len(outputs[3].response_ids) == 10 < len(outputs[0].response_ids)


def test_verl_agent_loop_without_verl_keeps_verl_shapes() -> None:
    saved = _install({"verl": None})  # type: ignore[dict-item]
    try:
        adapter = _fresh("rollserve.adapters.verl")
        assert not adapter.VERL_INSTALLED
        assert adapter._agent_loop_registry["rollserve"] == {"_target_": "rollserve.adapters.verl.RolloutServiceAgentLoop"}
        assert issubclass(adapter.RolloutServiceAgentLoop, adapter.AgentLoopBase)
    finally:
        _restore(saved)
        sys.modules.pop("rollserve.adapters.verl", None)


# -- SkyRL: skyrl_train.generators.base, as its code declares it ---------------------------------


def skyrl_standin() -> Dict[str, types.ModuleType]:
    base = types.ModuleType("skyrl_train.generators.base")

    @dataclass
    class TrajectoryID:
        instance_id: str
        repetition_id: int

        def to_string(self) -> str:
            return f"{self.instance_id}_{self.repetition_id}"

    class GeneratorInput(TypedDict):
        prompts: List[List[Dict[str, str]]]
        env_classes: List[str]
        env_extras: Optional[List[Dict[str, Any]]]
        sampling_params: Optional[Dict[str, Any]]
        trajectory_ids: Optional[List[TrajectoryID]]
        batch_metadata: Optional[Any]

    class GeneratorOutput(TypedDict):
        prompt_token_ids: List[List[int]]
        response_ids: List[List[int]]
        rewards: Union[List[float], List[List[float]]]
        loss_masks: List[List[int]]
        stop_reasons: Optional[List[str]]
        rollout_metrics: Optional[Dict[str, Any]]
        rollout_logprobs: Optional[List[List[float]]]
        trajectory_ids: Optional[List[TrajectoryID]]
        is_last_step: Optional[List[bool]]
        sampling_masks: Optional[List[List[List[int]]]]

    class GeneratorInterface(ABC):
        @abstractmethod
        async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
            raise NotImplementedError

    base.TrajectoryID = TrajectoryID
    base.GeneratorInput = GeneratorInput
    base.GeneratorOutput = GeneratorOutput
    base.GeneratorInterface = GeneratorInterface
    return {"skyrl_train": types.ModuleType("skyrl_train"), "skyrl_train.generators": types.ModuleType("skyrl_train.generators"), "skyrl_train.generators.base": base}


def test_skyrl_generator_returns_generator_output_in_input_order(client: rollserve.Client) -> None:
    saved = _install(skyrl_standin())
    try:
        base = sys.modules["skyrl_train.generators.base"]
        adapter = _fresh("rollserve.adapters.skyrl")
        assert adapter.SKYRL_INSTALLED and issubclass(adapter.RolloutServiceGenerator, base.GeneratorInterface)
        T = base.TrajectoryID
        coin = [{"role": "user", "content": "coin toss"}]
        count = [{"role": "user", "content": "count to two"}]
        input_batch = base.GeneratorInput(
            prompts=[coin] * 4 + [count] * 2 + [[{"role": "user", "content": "hi there"}]],
            env_classes=["pyclient"] * 4 + ["counter"] * 2 + ["pyclient"],
            env_extras=[{"expected": "heads"}] * 4 + [{"initial_count": 0, "expected_count": 2}] * 2 + [{"expected": "hi there"}],
            sampling_params={"temperature": 1.0, "top_p": 1.0, "max_generate_length": 256},
            trajectory_ids=[T("coin", r) for r in range(4)] + [T("count", r) for r in range(2)] + [T("hi", 0)],
            batch_metadata=None,
        )

        async def main() -> Any:
            generator = adapter.RolloutServiceGenerator(URL, token=TOKEN, policy=POLICY, rewards="token")
            try:
                return generator, await generator.generate(input_batch)
            finally:
                await generator.close()

        generator, output = asyncio.run(main())
        assert set(output) == set(base.GeneratorOutput.__annotations__)
        assert output["trajectory_ids"] == input_batch["trajectory_ids"]
        views = [client.training(rollout_id) for rollout_id in generator.last_rollout_ids]
        # the repeated prompts ran as one task of n samples (the service's groups), in input order
        assert [(v.task_id, v.sample_index) for v in views[:4]] == [(views[0].task_id, r) for r in range(4)]
        assert [(v.task_id, v.sample_index) for v in views[4:6]] == [(views[4].task_id, r) for r in range(2)]
        assert len({views[0].task_id, views[4].task_id, views[6].task_id}) == 3
        assert [v.reward for v in views[4:]] == [1.0, 1.0, 1.0]
        assert output["prompt_token_ids"] == [v.prompt_ids for v in views]
        assert output["response_ids"] == [v.response_ids for v in views]
        assert output["loss_masks"] == [v.response_mask for v in views]
        assert output["rollout_logprobs"] == [v.response_logprobs for v in views]
        assert output["rewards"] == [[0.0] * (len(v.response_ids) - 1) + [v.reward] for v in views]
        assert all(len(v.turns) == 2 for v in views[4:6])
    finally:
        _restore(saved)
        sys.modules.pop("rollserve.adapters.skyrl", None)


# -- NeMo-RL: NeMo Gym's POST /run on the agent face, with the token in the URL -------------------


def test_nemo_rl_reaches_the_agent_face_with_a_token(client: rollserve.Client) -> None:
    from rollserve.adapters.nemo_rl import NemoGymAgentClient, nemo_gym_agent_config

    parts = urlsplit(URL)
    [block] = nemo_gym_agent_config(URL, token=TOKEN)["rollserve_agent"]["responses_api_agents"].values()
    assert block == {"host": f"rollserve:{TOKEN}@{parts.hostname}", "port": parts.port}
    # NeMo Gym's ServerClient calls http://{host}:{port}: the token rides in the URL
    gym = NemoGymAgentClient(f"http://{block['host']}:{block['port']}")
    rows = [
        {**COUNT_ROW, "agent_ref": {"name": "counter"}, "_rowidx": 1},
        {"responses_create_params": {"input": "hello gym"}, "expected": "hello gym", "agent_ref": {"name": "pyclient"}, "_rowidx": 0},
    ]
    results, timing = asyncio.run(gym.run_rollouts(rows))
    assert set(timing) == {"rollserve/run_rollouts", "rollserve/postprocess_results"}
    single, tools = results  # in _rowidx order
    assert single["full_result"]["reward"] == 1.0 and tools["full_result"]["reward"] == 1.0
    assert [m["role"] for m in single["message_log"]] == ["user", "assistant"]
    assert [m["role"] for m in tools["message_log"]] == ["user", "assistant", "user", "assistant"]
    assert tools["input_message_log"] == tools["message_log"][:1]
    # NeMo-RL's contiguity: the messages' tokens are the last model call's prompt and generation
    calls = [item for item in tools["full_result"]["response"]["output"] if "generation_token_ids" in item]
    tokens = [t for m in tools["message_log"] for t in m["token_ids"]]
    assert tokens == calls[-1]["prompt_token_ids"] + calls[-1]["generation_token_ids"]
    assert [m["generation_logprobs"] for m in tools["message_log"][1::2]] == [c["generation_log_probs"] for c in calls]

    # the same through the token given apart, and refused without it
    assert asyncio.run(NemoGymAgentClient(URL, token=TOKEN).run(rows[1]))["reward"] == 1.0
    with pytest.raises(rollserve.RolloutServiceError) as refused:
        asyncio.run(NemoGymAgentClient(URL).run(rows[1]))
    assert refused.value.status == 401
