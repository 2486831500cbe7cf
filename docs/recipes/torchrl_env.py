"""TorchRL on LLMCluster-v0: GymEnv, the info reader for the action mask, the ActionMask transform.

    pip install -e ".[rl]" torchrl            # tested with torchrl 0.14.1, tensordict 0.14.3
    python docs/recipes/torchrl_env.py

TorchRL's ``GymEnv`` keeps only the observation, reward and done flags; the mask lives in
``info["action_mask"]``, so an info-dict reader copies it into the tensordict and the
``ActionMask`` transform applies it to the action spec. Then ``env.rand_action`` (and any
policy built on the spec, e.g. ``QValueActor`` with ``action_mask_key="action_mask"``) picks
valid actions only. This rollout plays one episode with random valid actions and checks that
every request is accounted for; plug the same env into a collector and a loss to train.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import Binary, Composite
from torchrl.envs import ActionMask, GymEnv, TransformedEnv
from torchrl.envs.libs.gym import default_info_dict_reader

import llm_lb_gym  # noqa: F401  (registers LLMCluster-v0)
from _common import ENV_KWARGS, parse


def make_torchrl_env(**kwargs) -> TransformedEnv:
    base = GymEnv("LLMCluster-v0", **{**ENV_KWARGS, **kwargs})
    n = base.action_spec.space.n
    reader = default_info_dict_reader(["action_mask"],
                                      spec=Composite(action_mask=Binary(n, dtype=torch.bool)))
    base.set_info_dict_reader(reader)
    return TransformedEnv(base, ActionMask())


def main() -> None:
    args = parse(__doc__.splitlines()[0], steps=1_000)
    torch.manual_seed(args.seed)
    env = make_torchrl_env()
    env.set_seed(args.seed)
    td = env.reset()
    steps = 0
    while True:
        td = env.rand_action(td)
        assert td["action_mask"][td["action"].argmax()], "a masked action was sampled"
        td = env.step(td)
        steps += 1
        if td["next", "done"].item():
            break
        td = td["next"].exclude("reward", "done", "terminated", "truncated")
        td = TensorDict(td, batch_size=[])
    m = env.base_env._env.unwrapped.metrics()
    assert m["completed"] + m["rejected"] == m["num_requests"], m
    print(f"TorchRL: episode of {steps} steps with masked random actions, "
          f"{m['completed'] + m['rejected']}/{m['num_requests']} requests accounted for, "
          f"mean E2E {m['mean_e2e_s']:.3f} s")


if __name__ == "__main__":
    main()
