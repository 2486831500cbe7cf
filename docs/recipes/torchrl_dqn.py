"""TorchRL near capacity: a DQN from TorchRL's parts (GymWrapper, the mask reader, ActionMask,
QValueActor, EGreedyModule, a collector, a replay buffer, DQNLoss).

    pip install -e ".[rl,recipes]"             # torch, torchrl 0.14 / tensordict 0.14 (tested)
    python docs/recipes/torchrl_dqn.py         # 50k steps, a few minutes on 2 cores
    python docs/recipes/torchrl_dqn.py --quick # a few hundred steps on 200-request episodes

One file you can copy. TorchRL's gym wrapper keeps only the observation, reward and done flags;
the mask lives in ``info["action_mask"]`` (int8), so an info-dict reader copies it into the
tensordict, a cast makes it bool, the ``ActionMask`` transform applies it to the action spec, and the Q-value actor and the
epsilon-greedy module read it (``action_mask_key``), so every action taken is valid.
``RouterRL`` (``llm_lb_gym.envs.wrappers``) scales the reward to O(1) and folds the env's
per-transition discount into episode ends, hence the value estimator's ``gamma=1.0``.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import torch
from tensordict.nn import TensorDictSequential
from torchrl.collectors import Collector
from torchrl.data import Binary, Composite, LazyTensorStorage, ReplayBuffer
from torchrl.envs import ActionMask, Compose, DTypeCastTransform, GymWrapper, TransformedEnv
from torchrl.envs.libs.gym import default_info_dict_reader
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import MLP, EGreedyModule, QValueActor
from torchrl.objectives import DQNLoss, HardUpdate

import llm_lb_gym  # noqa: F401  (registers the ids)
from llm_lb_gym.envs.router_factory import make_env_router
from llm_lb_gym.envs.wrappers import RouterRL
from llm_lb_gym.rollout import rollout_router

ENV_ID = "LLMCluster-NearCapacity-v0"   # 4 x V100 at 52 req/s: the regime where routing matters
QUICK = {"num_requests": 200}           # --quick: short episodes


def make_torchrl_env(gym_env: gym.Env) -> TransformedEnv:
    base = GymWrapper(gym_env)
    n = base.action_spec.space.n
    base.set_info_dict_reader(default_info_dict_reader(   # the env's mask is int8: read it so,
        ["action_mask"], spec=Composite(action_mask=Binary(n, dtype=torch.int8))))
    return TransformedEnv(base, Compose(   # then cast it to the bool that ActionMask and the actor want
        DTypeCastTransform(torch.int8, torch.bool, in_keys=["action_mask"]), ActionMask()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a few hundred steps on 200-request episodes (the tests)")
    args = p.parse_args()
    kw = QUICK if args.quick else {}
    steps = min(args.steps, 400) if args.quick else args.steps
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = make_torchrl_env(RouterRL(gym.make(ENV_ID, **kw)))
    env.set_seed(args.seed)
    n_obs = env.observation_spec["observation"].shape[-1]
    actor = QValueActor(MLP(in_features=n_obs, out_features=env.action_spec.space.n, num_cells=[128, 128]),
                        in_keys=["observation"], spec=env.action_spec, action_mask_key="action_mask")
    explore = EGreedyModule(env.action_spec, eps_init=1.0, eps_end=0.02,
                            annealing_num_steps=max(steps // 10, 1), action_mask_key="action_mask")
    policy = TensorDictSequential(actor, explore)
    loss = DQNLoss(actor, action_space=env.action_spec, delay_value=True)
    loss.make_value_estimator(gamma=1.0)   # RouterRL's survival ends carry the discount
    target = HardUpdate(loss, value_network_update_interval=500)
    opt = torch.optim.Adam(loss.parameters(), lr=1e-4)
    buffer = ReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=128)
    collector = Collector(env, policy, frames_per_batch=16, total_frames=steps,
                                  init_random_frames=min(1_000, steps // 4))
    for batch in collector:
        buffer.extend(batch.reshape(-1))
        explore.step(batch.numel())
        if len(buffer) >= collector.init_random_frames:
            for _ in range(4):
                out = loss(buffer.sample())
                opt.zero_grad()
                out["loss"].backward()
                opt.step()
                target.step()
    print(f"TorchRL DQN: trained {steps} steps")
    seed = 1000
    genv = gym.make(ENV_ID, **kw)
    eval_env = make_torchrl_env(genv)
    eval_env.set_seed(seed)
    with set_exploration_type(ExplorationType.DETERMINISTIC), torch.no_grad():
        eval_env.rollout(10**7, actor, break_when_any_done=True)
    m = genv.unwrapped.metrics()
    rr_env = gym.make(ENV_ID, **kw).unwrapped
    rr = rollout_router(rr_env, make_env_router("round_robin", rr_env), seed).metrics
    print(f"TorchRL DQN: {m['completed'] + m['rejected']}/{m['num_requests']} requests accounted for, "
          f"mean E2E {m['mean_e2e_s']:.3f} s (round robin {rr['mean_e2e_s']:.3f} s, seed {seed})")


if __name__ == "__main__":
    main()
