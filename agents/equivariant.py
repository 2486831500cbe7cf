"""Networks that fit the router's structure: one shared encoder per instance and per candidate.

A flat MLP over the concatenated instances has to learn the same rule once per instance slot,
and nothing stops it from preferring slot 0: behaviour-cloned from a good rule it reached 99%
accuracy yet collapsed onto one instance in some episodes. The router's problem is symmetric:
permuting the instances (or the candidate requests) permutes the right actions the same way.
:class:`InstanceSetQ` builds that in (Deep Sets / permutation-equivariant, Zaheer et al. 2017):

- every instance block of the observation goes through the same MLP (with the global features
  beside it) to an embedding e_i; every candidate request block likewise to c_j, plus a learned
  embedding of its slot (candidates are an ordered list, shortest or oldest first, and the
  order is information: without it a behaviour-cloned network matched the teacher's request
  choice 85% of the time instead of ~100%);
- the instance embeddings are pooled (mean and max) into a cluster context, the candidates'
  (mean) into a queue context;
- Q(route candidate j to instance i) = V + A(c_j, e_i, contexts), one shared head for every
  pair; Q(defer) = V + A_defer(contexts, global features); V from the contexts (dueling, Wang et
  al. 2016), with the advantages centred on their mean. Here a state's value (minus the latency
  of everything in the system over the horizon) varies across states by orders of magnitude
  more than the actions' advantages (one routing decision moves it by ~0.1-1%), so the network
  keeps the two apart instead of learning tiny differences of large numbers per action.

Because nothing depends on the number of instances or candidates, the same weights run on any
m (train on 4 instances, evaluate on 8): the width of the observation gives m through
``llm_lb_gym.envs.observation.ObsLayout``. Actions are laid out as the env's: ``j * m + i``,
then defer.

:class:`EquivariantDQNPolicy` plugs it into SB3's DQN (and ``DoubleDQN``);
:class:`EquivariantActorCriticPolicy` into sb3-contrib's ``MaskablePPO`` (the same network's
outputs are the action logits; the value comes from the pooled contexts).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th
from torch import nn

from llm_lb_gym._validate import ConfigError, check_int

from llm_lb_gym.agents.nets import activation_class, hidden_sizes, mlp

LAYOUT_KEYS = ("global_dim", "num_candidates", "candidate_dim", "instance_dim")


def check_layout(layout: Any) -> dict[str, int]:
    """The block sizes the network needs (``env.unwrapped.obs_layout.as_dict()``)."""
    if layout is None or not hasattr(layout, "get"):
        raise ConfigError("the equivariant policy needs policy_kwargs.layout: the env's "
                          f"obs_layout ({', '.join(LAYOUT_KEYS)}); got {layout!r}")
    out = {}
    for key in LAYOUT_KEYS:
        if key not in layout:
            raise ConfigError(f"policy_kwargs.layout lacks {key!r}; needs {', '.join(LAYOUT_KEYS)}")
        check_int(f"policy_kwargs.layout.{key}", layout[key], 1 if key != "global_dim" else 0)
        out[key] = int(layout[key])
    return out


class InstanceSetQ(nn.Module):
    """Permutation-equivariant action values over (candidate, instance) pairs, plus defer."""

    def __init__(self, layout: dict, embed_dim: int = 64, hidden: tuple[int, ...] = (64,),
                 activation: str | type[nn.Module] = "relu"):
        super().__init__()
        lay = check_layout(layout)
        self.G, self.k = lay["global_dim"], lay["num_candidates"]
        self.C, self.I = lay["candidate_dim"], lay["instance_dim"]
        check_int("embed_dim", embed_dim, 1)
        hidden = hidden_sizes("net_arch", hidden)
        act = activation_class(activation)
        E = int(embed_dim)
        self.embed_dim = E
        self.inst = nn.Sequential(mlp(self.I + self.G, E, hidden, act), act())
        self.cand = nn.Sequential(mlp(self.C + self.G, E, hidden, act), act())
        self.slot = nn.Parameter(th.zeros(self.k, E))
        # The pair head's first layer is linear in [c_j, e_i, context]: computed per part and
        # broadcast-added (k + m + 1 small products instead of one over all k * m pairs).
        H = hidden[0] if hidden else E
        self.pair_c = nn.Linear(E, H)
        self.pair_e = nn.Linear(E, H, bias=False)
        self.pair_ctx = nn.Linear(3 * E, H, bias=False)
        self.pair_act = act()
        self.pair_out = mlp(H, 1, hidden[1:], act)
        self.defer = mlp(3 * E + self.G, 1, hidden, act)
        self.value = mlp(3 * E + self.G, 1, hidden, act)
        self.context_dim = 3 * E + self.G

    def num_instances(self, width: int) -> int:
        rest = width - self.G - self.k * self.C
        if rest <= 0 or rest % self.I:
            raise ValueError(f"observation width {width} does not fit the layout (global {self.G}, "
                             f"{self.k} x {self.C} candidate, n x {self.I} instance features)")
        return rest // self.I

    def encode(self, x: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        """(candidate embeddings (B, k, E), instance embeddings (B, m, E), context (B, 3E+G))."""
        B, W = x.shape
        m = self.num_instances(W)
        G, k, C, I = self.G, self.k, self.C, self.I
        g = x[:, :G]
        c = x[:, G:G + k * C].reshape(B, k, C)
        s = x[:, G + k * C:].reshape(B, m, I)
        e = self.inst(th.cat([s, g[:, None, :].expand(B, m, G)], dim=2))
        ce = self.cand(th.cat([c, g[:, None, :].expand(B, k, G)], dim=2)) + self.slot
        ctx = th.cat([e.mean(dim=1), e.amax(dim=1), ce.mean(dim=1), g], dim=1)
        return ce, e, ctx

    def forward(self, x: th.Tensor) -> th.Tensor:
        ce, e, ctx = self.encode(x)
        B, k, E = ce.shape
        m = e.shape[1]
        # The context term is added to the k candidate rows before the pairs are formed: one
        # (B, k, m, H) sum instead of two, in the pass and in its gradient (the largest tensors).
        cand_part = self.pair_c(ce) + self.pair_ctx(ctx[:, :3 * E])[:, None, :]
        h = cand_part[:, :, None, :] + self.pair_e(e)[:, None, :, :]
        adv = th.cat([self.pair_out(self.pair_act(h)).reshape(B, k * m), self.defer(ctx)], dim=1)
        return self.value(ctx) + adv - adv.mean(dim=1, keepdim=True)


# ----------------------------------------------------------------------------- DQN
def _dqn_policy_classes():
    from stable_baselines3.dqn.policies import DQNPolicy, QNetwork

    class EquivariantQNetwork(QNetwork):
        """SB3's QNetwork with :class:`InstanceSetQ` in place of its MLP."""

        def __init__(self, observation_space, action_space, features_extractor, features_dim,
                     net_arch=None, activation_fn=nn.ReLU, normalize_images=True, layout=None,
                     embed_dim=64):
            super().__init__(observation_space, action_space, features_extractor, features_dim,
                             net_arch=[], activation_fn=activation_fn, normalize_images=normalize_images)
            self.net_arch = list(net_arch) if net_arch is not None else [64]
            self.layout = check_layout(layout)
            self.embed_dim = embed_dim
            self.q_net = InstanceSetQ(self.layout, embed_dim, tuple(self.net_arch), activation_fn)

        def _get_constructor_parameters(self) -> dict[str, Any]:
            data = super()._get_constructor_parameters()
            data.update(layout=self.layout, embed_dim=self.embed_dim)
            return data

    class EquivariantDQNPolicy(DQNPolicy):
        """DQN policy whose Q-network is :class:`InstanceSetQ` (``policy_kwargs``: ``layout``
        (required), ``embed_dim``, ``net_arch`` = hidden widths of each shared MLP)."""

        def __init__(self, observation_space, action_space, lr_schedule, net_arch=None,
                     activation_fn=nn.ReLU, layout=None, embed_dim: int = 64, **kwargs):
            self.layout = check_layout(layout)
            self.embed_dim = int(embed_dim)
            super().__init__(observation_space, action_space, lr_schedule,
                             net_arch=list(net_arch) if net_arch is not None else [64],
                             activation_fn=activation_fn, **kwargs)

        def make_q_net(self):
            net_args = self._update_features_extractor(self.net_args, features_extractor=None)
            return EquivariantQNetwork(**net_args, layout=self.layout,
                                       embed_dim=self.embed_dim).to(self.device)

        def _get_constructor_parameters(self) -> dict[str, Any]:
            data = super()._get_constructor_parameters()
            data.update(layout=self.layout, embed_dim=self.embed_dim)
            return data

    return EquivariantQNetwork, EquivariantDQNPolicy


EquivariantQNetwork, EquivariantDQNPolicy = _dqn_policy_classes()


# ----------------------------------------------------------------------------- PPO
def equivariant_actor_critic_policy():
    """sb3-contrib's ``MaskableActorCriticPolicy`` over :class:`InstanceSetQ` (imported on use:
    sb3_contrib is not needed by DQN users)."""
    from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy

    class _Extractor(nn.Module):
        def __init__(self, net: InstanceSetQ, n_actions: int):
            super().__init__()
            self.net = net
            self.latent_dim_pi = n_actions
            self.latent_dim_vf = net.context_dim

        def forward(self, features: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
            return self.forward_actor(features), self.forward_critic(features)

        def forward_actor(self, features: th.Tensor) -> th.Tensor:
            return self.net(features)

        def forward_critic(self, features: th.Tensor) -> th.Tensor:
            return self.net.encode(features)[2]

    class EquivariantActorCriticPolicy(MaskableActorCriticPolicy):
        """Logits = :class:`InstanceSetQ`'s outputs (the action head is the identity), value =
        a linear read of its pooled contexts."""

        def __init__(self, observation_space, action_space, lr_schedule, net_arch=None,
                     activation_fn=nn.ReLU, layout=None, embed_dim: int = 64, **kwargs):
            self.layout = check_layout(layout)
            self.embed_dim = int(embed_dim)
            self.hidden = tuple(net_arch) if net_arch is not None else (64,)
            super().__init__(observation_space, action_space, lr_schedule, net_arch=None,
                             activation_fn=activation_fn, **kwargs)

        def _build_mlp_extractor(self) -> None:
            net = InstanceSetQ(self.layout, self.embed_dim, self.hidden, self.activation_fn)
            self.mlp_extractor = _Extractor(net, int(self.action_space.n))

        def _build(self, lr_schedule) -> None:
            super()._build(lr_schedule)
            self.action_net = nn.Identity()
            self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),
                                                  **self.optimizer_kwargs)

        def _get_constructor_parameters(self) -> dict[str, Any]:
            data = super()._get_constructor_parameters()
            data.update(layout=self.layout, embed_dim=self.embed_dim, net_arch=list(self.hidden))
            return data

    return EquivariantActorCriticPolicy


# ------------------------------------------------------------------ any instance count
class SetPolicyActor:
    """Greedy actions of a trained model's network on observations of any instance count.

    SB3's ``predict`` checks observations against the training env's space, so a model trained
    on 4 instances cannot act on 8 through it; the network itself can. This wraps the network
    with the ``predict`` signature the evaluation code uses (masks included)."""

    def __init__(self, model):
        policy = model.policy
        if hasattr(policy, "q_net"):
            self.net = policy.q_net.q_net
        else:
            self.net = policy.mlp_extractor.net
        if not isinstance(self.net, InstanceSetQ):
            raise ConfigError("SetPolicyActor needs a model with the equivariant policy "
                              "(agent.kwargs.policy=equivariant)")
        self.device = policy.device

    def predict(self, observation, state=None, episode_start=None, deterministic=True,
                action_masks=None):
        obs = th.as_tensor(np.asarray(observation, np.float32), device=self.device)
        single = obs.dim() == 1
        if single:
            obs = obs[None]
        with th.no_grad():
            q = self.net(obs)
        if action_masks is not None:
            mask = th.as_tensor(np.asarray(action_masks, bool), device=q.device).reshape(q.shape)
            q = q.masked_fill(~mask, -th.inf)
        act = q.argmax(dim=1).cpu().numpy()
        return (act[0] if single else act), state


POLICY_NAMES = ("mlp", "equivariant")


def policy_for(agent_name: str, name: str):
    """The SB3 policy class (or name) for ``agent.kwargs.policy``."""
    if name == "mlp":
        return "MlpPolicy"
    if name != "equivariant":
        raise ConfigError(f"policy={name!r} is not valid; allowed: {', '.join(POLICY_NAMES)}")
    if agent_name in ("double_dqn", "dqn"):
        return EquivariantDQNPolicy
    if agent_name in ("maskable_ppo", "maskable_ppo_kl"):
        return equivariant_actor_critic_policy()
    raise ConfigError(f"policy=equivariant is available for double_dqn, dqn, maskable_ppo and maskable_ppo_kl, not {agent_name!r}")


def obs_layout_of(env) -> dict[str, int]:
    """The observation layout of a gymnasium env or SB3 VecEnv of ``LLMCluster-v0``."""
    if hasattr(env, "get_attr"):
        layout = env.get_attr("obs_layout", indices=[0])[0]
    else:
        layout = env.unwrapped.obs_layout
    return layout.as_dict()


__all__ = ["InstanceSetQ", "EquivariantDQNPolicy", "EquivariantQNetwork", "SetPolicyActor",
           "equivariant_actor_critic_policy", "policy_for", "obs_layout_of", "POLICY_NAMES"]
