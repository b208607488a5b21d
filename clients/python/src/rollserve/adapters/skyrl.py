"""A SkyRL generator over the service: ``RolloutServiceGenerator``, a
``skyrl_train.generators.base.GeneratorInterface`` whose ``async generate(input_batch:
GeneratorInput) -> GeneratorOutput`` runs the batch's prompts as rollouts and returns their
training views as SkyRL's ``GeneratorOutput`` (``rollserve.training.to_skyrl``), in input order.

Use it where SkyRL builds its generator (``BasePPOExp.get_generator`` in a subclass of SkyRL's
experiment), with SkyRL's inference engines added as the service's backends
(``client.backends.add(url)``) so that the policy being trained generates.

Without SkyRL installed the module falls back to the shapes SkyRL declares (``GeneratorInput``,
``GeneratorOutput`` TypedDicts, ``TrajectoryID``), so that it imports and runs without SkyRL."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..aio import AsyncClient
from ..training import to_skyrl
from ._common import make_task, training_views

try:
    from skyrl_train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

    SKYRL_INSTALLED = True
except ImportError:
    SKYRL_INSTALLED = False
    GeneratorInput = Dict[str, Any]  # type: ignore[misc]
    GeneratorOutput = Dict[str, Any]  # type: ignore[misc]

    class GeneratorInterface(ABC):  # type: ignore[no-redef]
        """SkyRL's ``GeneratorInterface``."""

        @abstractmethod
        async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
            raise NotImplementedError


def _groups(trajectory_ids: Optional[Sequence[Any]], count: int) -> List[Tuple[int, int]]:
    """(start, length) of each run of consecutive prompts with the same instance id: one task of
    n samples each, so that the service's group statistics (advantages, shaping) see the group.
    Without trajectory ids every prompt is its own task."""
    if not trajectory_ids:
        return [(i, 1) for i in range(count)]
    runs: List[Tuple[int, int]] = []
    for i, trajectory in enumerate(trajectory_ids):
        if runs and trajectory_ids[runs[-1][0]].instance_id == trajectory.instance_id:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


class RolloutServiceGenerator(GeneratorInterface):
    """``generate`` submits one task per run of prompts sharing an instance id (n = the run's
    length), waits for every sample's training view and returns them in input order as
    ``GeneratorOutput``. The task of prompt i: environment ``env`` (the constructor's) else
    ``env_classes[i]``; row ``env_extras[i]["row"]`` if given, else ``env_extras[i]`` (the
    environment's row fields), with ``responses_create_params.input`` the prompt's messages; policy
    ``policy`` with SkyRL's ``sampling_params`` (vLLM names; ``max_generate_length`` becomes
    ``max_tokens``). ``rewards`` and ``unusable`` are ``to_skyrl``'s."""

    def __init__(
        self,
        client: Union[AsyncClient, str],
        *,
        token: Optional[str] = None,
        policy: Mapping[str, Any],
        env: Optional[str] = None,
        rewards: str = "sample",
        unusable: str = "error",
        pad_token_id: int = 0,
    ) -> None:
        self.client = client if isinstance(client, AsyncClient) else AsyncClient(client, token=token)
        self.policy = dict(policy)
        self.env = env
        self.rewards = rewards
        self.unusable = unusable
        self.pad_token_id = pad_token_id
        #: The rollout ids of the last ``generate``, in output order (to look a sample up in the service).
        self.last_rollout_ids: List[str] = []

    def make_task(self, prompt: Any, env_class: str, extras: Optional[Mapping[str, Any]], sampling_params: Optional[Mapping[str, Any]], n: int) -> Dict[str, Any]:
        extras = extras or {}
        row = extras.get("row") if "row" in extras else extras
        return make_task(self.env or env_class, row, prompt, self.policy, sampling_params, n)

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        prompts = input_batch["prompts"]
        env_classes = input_batch["env_classes"]
        extras = input_batch.get("env_extras") or [None] * len(prompts)
        trajectory_ids = input_batch.get("trajectory_ids")
        tasks = []
        for start, length in _groups(trajectory_ids, len(prompts)):
            task = self.make_task(prompts[start], env_classes[start], extras[start], input_batch.get("sampling_params"), length)
            task["id"] = str(uuid.uuid4())
            tasks.append(task)
        submitted = await self.client.submit(tasks)
        views = await training_views(self.client, submitted)
        self.last_rollout_ids = [view.id for view in views]
        output = to_skyrl(views, rewards=self.rewards, unusable=self.unusable, pad_token_id=self.pad_token_id)
        if trajectory_ids:
            # SkyRL's own ids back, as its trainer matches them to the batch.
            output["trajectory_ids"] = list(trajectory_ids)
        return output  # type: ignore[return-value]

    async def close(self) -> None:
        await self.client.close()
