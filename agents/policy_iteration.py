"""Approximate policy iteration by simulation, distilled into a fast network.

Imitation makes a network that equals its teacher (``late_binding``); Double-DQN fine-tuning
drifts away from it, because near capacity the advantages that separate a better rule from the
teacher are 0.1-1% of a state's value and TD learning at ~50 env steps/s cannot resolve them.
The simulator can: ``llm_lb_gym.routers.improve.RolloutImprovement`` scores every action of a
state by rolling the teacher out on imagined futures shared by all actions (common random
numbers). This module turns those scores into a network (expert iteration / AlphaZero-style
distillation, with DAgger's state distribution):

1. **Round 0, the teacher.** The policy's logits are the network's plus a prior bonus
   (``prior``) on the teacher's own action in the state; the network's output layers start at
   zero, so pi_0 *is* the teacher, and the network only has to learn where to deviate (a
   residual policy: behaviour cloning the teacher into a free network reached only ~60%
   agreement in 60 epochs here, and such a copy is far worse than the teacher it copies).
2. **Round r.** The current network pi_{r-1} drives ``episodes_per_round`` episodes (the
   states it visits, DAgger); at every ``label_every``-th decision with more than one valid
   action the operator scores the valid actions, giving advantages A(s, a) = score(teacher's
   choice) - score(a) in requests-in-system seconds (positive: better than the teacher). The
   target is the KL-regularised improvement of pi_{r-1}:
       pi*(a | s) proportional to pi_{r-1}(a | s) * exp(A(s, a) / temperature),
   the closed-form maximiser of E[A] - temperature * KL(pi || pi_{r-1}) (as in MPO / AWR), so
   a small temperature trusts the rollouts and a large one stays near the previous network.
   The network is trained by cross-entropy on the targets of all rounds so far (aggregated, as
   DAgger does).
3. **Validation.** After each round the greedy network plays the validation seeds; the network
   with the lowest mean E2E, paired against the teacher on the same seeds, is kept.

Labelling runs in worker processes (``workers``; each labels whole episodes, so only the
network's weights and seeds cross process boundaries), or on Ray (``executor="ray"``, the
``[ray]`` extra) for any number of machines. The result decides with one batch-1 forward pass plus
the teacher's heuristic (well under a millisecond); the operator is only used to train it.
"""

from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch as th
from torch.nn import functional as F

from llm_lb_gym._validate import ConfigError, check_choice, check_int, check_range
from llm_lb_gym.sim.clock import DEFAULT_DECISION_INTERVAL_S

EXECUTORS = ("process", "ray", "inline")
CONDITIONS = ("setting", "train", "train_synthetic")
LOSSES = ("ce", "advantage")


@dataclass(frozen=True)
class PolicyIterationConfig:
    """Everything one run of :func:`policy_iteration` needs (``conf/improve.yaml``)."""

    teacher: str = "late_binding"
    """The router imitated in round 0 and rolled out by the operator (its base)."""
    teacher_options: dict = field(default_factory=dict)
    rounds: int = 4
    """Policy-improvement rounds (round 0 is the teacher itself)."""
    episodes_per_round: int = 4
    """Episodes the current network drives per round (their states are labelled)."""
    label_every: int = 8
    """Label every n-th decision with a choice (others are only driven through)."""
    max_labels_per_episode: int = 150
    plan_horizon_s: float = 2.0
    samples: int = 4
    see_future: bool = False
    """True: rollouts on the real future (a clairvoyant reference, never deployable)."""
    antithetic: bool = False
    loss: str = "ce"
    """``ce``: cross-entropy to the KL-regularised improvement targets (module doc).
    ``advantage``: regress the network's output differences net(a) - net(teacher's action)
    on the rollout advantages (least squares averages the rollouts' noise across states), so
    with the prior the policy deviates from the teacher where the predicted saving exceeds
    ``prior`` requests-in-system seconds."""
    temperature: float = 1.0
    """Requests-in-system seconds per nat of the improvement target (``loss=ce``)."""
    kl_weight: float = 1.0
    """Weight of the visited but unlabelled states, whose target is the previous policy (a KL
    term to pi_{r-1}; ``loss=advantage``: advantage 0, i.e. the teacher's). Without it the
    network is free where no rollout looked, and there it left the teacher at random
    (measured: validation episodes 100-500% slower than the teacher)."""
    kl_states_per_episode: int = 1000
    """Unlabelled states kept per episode for the KL term (evenly spaced)."""
    prior: float = 2.0
    """Logit bonus of the teacher's own action: the network learns where to deviate from the
    teacher (a residual policy), and starts as the teacher exactly (its last layers start at 0)."""
    round_seed: int = 200
    """Round r's episodes use seeds ``round_seed + 100 r ..`` (disjoint from validation and test)."""
    validation_seeds: tuple = (500, 501, 502, 503)
    epochs: int = 30
    """Passes over the aggregated dataset per round."""
    batch_size: int = 256
    learning_rate: float = 1e-3
    embed_dim: int = 64
    net_arch: tuple = (64,)
    workers: int = 2
    executor: str = "process"
    seed: int = 0
    conditions: str = "setting"
    """``setting``: every episode is the env given to :func:`policy_iteration`; ``train`` /
    ``train_synthetic``: each round's episodes and the validation episodes are conditions drawn
    from that space (``suite.suites``: workload, load, predictor accuracy, cluster) with the
    setting's observation, action and reward options, on clusters of ``condition_instances``."""
    condition_instances: int = 4

    def __post_init__(self) -> None:
        p = "improve"
        check_choice(f"{p}.conditions", self.conditions, CONDITIONS)
        check_int(f"{p}.condition_instances", self.condition_instances, 1)
        for name, lo in (("rounds", 0), ("episodes_per_round", 1), ("label_every", 1),
                         ("max_labels_per_episode", 1), ("samples", 1),
                         ("epochs", 1), ("batch_size", 1), ("embed_dim", 1), ("workers", 1),
                         ("round_seed", 0), ("seed", 0)):
            check_int(f"{p}.{name}", getattr(self, name), lo)
        check_range(f"{p}.plan_horizon_s", self.plan_horizon_s, 0.0, lo_open=True)
        check_range(f"{p}.temperature", self.temperature, 0.0, lo_open=True)
        check_range(f"{p}.learning_rate", self.learning_rate, 0.0, lo_open=True)
        check_range(f"{p}.prior", self.prior, 0.0)
        check_range(f"{p}.kl_weight", self.kl_weight, 0.0)
        check_int(f"{p}.kl_states_per_episode", self.kl_states_per_episode, 0)
        check_choice(f"{p}.executor", self.executor, EXECUTORS)
        check_choice(f"{p}.loss", self.loss, LOSSES)
        if not self.validation_seeds:
            raise ConfigError(f"{p}.validation_seeds is empty; allowed: a list of seeds")
        for s in self.validation_seeds:
            check_int(f"{p}.validation_seeds[]", s, 0)
        # The teacher and the rollout operator over it, now rather than at the first episode.
        from llm_lb_gym.routers.registry import ROUTERS, make_router

        allowed = [n for n in ROUTERS if n != "lookahead"]   # the operator's base (routers/improve.py)
        check_choice(f"{p}.teacher", self.teacher, allowed)
        if not isinstance(self.teacher_options, Mapping):
            raise ConfigError(f"{p}.teacher_options={self.teacher_options!r} must be a mapping of "
                              f"{self.teacher!r}'s options")
        try:
            make_router(self.teacher, **dict(self.teacher_options))
        except ConfigError as err:
            raise type(err)(f"{p}.teacher_options: {err}") from None
        self.operator_options(DEFAULT_DECISION_INTERVAL_S)   # samples, antithetic, see_future

    def operator_options(self, decision_interval_s: float):
        from llm_lb_gym.routers.improve import ImprovementOptions

        return ImprovementOptions(
            base=self.teacher, base_options=dict(self.teacher_options), plan_horizon_s=self.plan_horizon_s,
            samples=1 if self.see_future else self.samples, see_future=self.see_future,
            antithetic=self.antithetic, decision_interval_s=decision_interval_s)


# ----------------------------------------------------------------------------- the network
def make_net(layout: dict, cfg: PolicyIterationConfig, seed: int):
    """The equivariant network with its output layers at zero, so that with the teacher prior
    the initial policy *is* the teacher (round 0 needs no imitation)."""
    from llm_lb_gym.agents.equivariant import InstanceSetQ

    th.manual_seed(seed)
    net = InstanceSetQ(layout, embed_dim=cfg.embed_dim, hidden=tuple(cfg.net_arch))
    for head in (net.pair_out, net.defer):
        last = [mod for mod in head.modules() if isinstance(mod, th.nn.Linear)][-1]
        th.nn.init.zeros_(last.weight)
        th.nn.init.zeros_(last.bias)
    return net


def prior_logits(net, obs: th.Tensor, teacher: th.Tensor, prior: float) -> th.Tensor:
    """The policy's logits: the network's plus ``prior`` on the teacher's action (index -1: none)."""
    z = net(obs)
    if prior:
        z = z + prior * F.one_hot(teacher.clamp(min=0), z.shape[1]).to(z.dtype) * (teacher >= 0)[:, None]
    return z


def _layers(module) -> list:
    """A Sequential of Linear and ReLU layers as numpy (weight.T, bias) pairs and "relu" marks;
    None if it holds anything else."""
    out = []
    for mod in module.modules():
        if isinstance(mod, th.nn.Linear):
            out.append((mod.weight.detach().numpy().T.copy(),
                        None if mod.bias is None else mod.bias.detach().numpy().copy()))
        elif isinstance(mod, th.nn.ReLU):
            out.append("relu")
        elif not isinstance(mod, th.nn.Sequential):
            return None
    return out


def _apply(layers: list, x: np.ndarray) -> np.ndarray:
    for layer in layers:
        if layer == "relu":
            x = np.maximum(x, 0.0)
        else:
            w, b = layer
            x = x @ w if b is None else x @ w + b
    return x


class NumpyActor:
    """The network's action preferences for one observation in numpy: the same arithmetic as
    ``InstanceSetQ.forward`` without the value and the centring (constant over the actions, so
    the argmax is the same), at a fraction of torch's per-op cost for a batch of one (the
    router's decision is one observation at a time). ``None`` from :meth:`build` when the
    network has layers this does not mirror (then torch is used)."""

    def __init__(self, net, parts: dict):
        self.G, self.k, self.C, self.I, self.E = net.G, net.k, net.C, net.I, net.embed_dim
        self.slot = net.slot.detach().numpy().copy()
        self.p = parts

    @classmethod
    def build(cls, net) -> "NumpyActor | None":
        names = ("inst", "cand", "pair_c", "pair_e", "pair_ctx", "pair_act", "pair_out", "defer")
        parts = {n: _layers(getattr(net, n)) for n in names}
        if any(v is None for v in parts.values()):
            return None
        return cls(net, parts)

    def preferences(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, np.float32).reshape(-1)
        G, k, C, I, E, p = self.G, self.k, self.C, self.I, self.E, self.p
        m = (len(x) - G - k * C) // I
        g = x[:G]
        c = x[G:G + k * C].reshape(k, C)
        s = x[G + k * C:].reshape(m, I)
        e = _apply(p["inst"], np.concatenate([s, np.broadcast_to(g, (m, G))], axis=1))
        ce = _apply(p["cand"], np.concatenate([c, np.broadcast_to(g, (k, G))], axis=1)) + self.slot
        ctx = np.concatenate([e.mean(axis=0), e.max(axis=0), ce.mean(axis=0), g])
        cand_part = _apply(p["pair_c"], ce) + _apply(p["pair_ctx"], ctx[None, :3 * E])
        h = cand_part[:, None, :] + _apply(p["pair_e"], e)[None, :, :]
        pair = _apply(p["pair_out"], _apply(p["pair_act"], h.reshape(k * m, -1))).reshape(k * m)
        return np.concatenate([pair, _apply(p["defer"], ctx[None])[0]])


class NetPolicy:
    """The distilled router: greedy masked argmax of the network's logits plus the teacher prior.

    ``act(obs, mask, teacher_action)`` needs the teacher's choice in the same state (a heuristic,
    ~10 us); :class:`DistilledRouter` wraps it as a router of the package."""

    def __init__(self, net, prior: float, teacher: str = "late_binding",
                 teacher_options: dict | None = None):
        self.net = net.eval()
        self.fast = NumpyActor.build(self.net)
        self.prior = float(prior)
        self.teacher, self.teacher_options = teacher, dict(teacher_options or {})

    def logits(self, obs: np.ndarray, teacher_action: int) -> np.ndarray:
        with th.inference_mode():
            x = th.from_numpy(np.asarray(obs, np.float32).reshape(1, -1))
            return prior_logits(self.net, x, th.tensor([teacher_action]), self.prior)[0].numpy()

    def act(self, obs, mask, teacher_action: int) -> int:
        """Greedy over the valid actions and the teacher's own (which the env accepts even where
        its mask is stricter, e.g. a hold on an idle cluster), so the prior alone gives the
        teacher exactly."""
        valid = np.array(mask, bool)
        if teacher_action >= 0:
            valid[teacher_action] = True
        if self.fast is None:
            z = self.logits(obs, teacher_action)
        else:
            z = self.fast.preferences(obs).astype(np.float64)
            if teacher_action >= 0:
                z[teacher_action] += self.prior
        return int(np.argmax(np.where(valid, z, -np.inf)))

    def save(self, path, layout: dict, cfg: PolicyIterationConfig, meta: dict | None = None) -> None:
        th.save({"state_dict": self.net.state_dict(), "layout": dict(layout),
                 "embed_dim": cfg.embed_dim, "net_arch": list(cfg.net_arch), "prior": self.prior,
                 "teacher": self.teacher, "teacher_options": self.teacher_options,
                 "meta": meta or {}}, path)

    @classmethod
    def load(cls, path) -> "NetPolicy":
        """A saved policy (``policy_iteration``'s ``best_policy.pt``); a missing or corrupt file
        is a ConfigError naming it."""
        from llm_lb_gym.agents.equivariant import InstanceSetQ

        try:
            blob = th.load(path, map_location="cpu", weights_only=True)
            net = InstanceSetQ(blob["layout"], embed_dim=blob["embed_dim"], hidden=tuple(blob["net_arch"]))
            net.load_state_dict(blob["state_dict"])
            return cls(net, blob["prior"], blob["teacher"], blob["teacher_options"])
        except FileNotFoundError:
            raise ConfigError(f"policy file {path} does not exist") from None
        except Exception as exc:
            raise ConfigError(f"policy file {path} is not a saved policy-iteration network: {exc}") from None


def _weights_bytes(net) -> bytes:
    buf = io.BytesIO()
    th.save(net.state_dict(), buf)
    return buf.getvalue()


# ----------------------------------------------------------------------------- episodes
def _action_candidates(env) -> list:
    """``(queue position, instance)`` of each env action ``j * m + i`` (None for slots without
    a candidate, and for defer, the last action)."""
    c = env.cluster
    pos = {rid: p for p, rid in enumerate(c.queue)}
    out: list = [None] * (env.defer_action + 1)
    for j, rid in enumerate(env.candidates):
        for i in range(env.m):
            out[j * env.m + i] = (pos[rid], i)
    return out


def advantages(S: np.ndarray, teacher: int) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate, the mean over sampled futures of score(teacher's choice) - score(it) and
    its standard error (NaN with one future). ``S[k, a]``: candidate ``a``'s requests-in-system
    seconds in future ``k`` (lower is better), so a positive advantage means better than the
    teacher, and the teacher's own is 0."""
    d = S[:, [teacher]] - S                          # paired over the shared futures
    se = d.std(axis=0, ddof=1) / math.sqrt(d.shape[0]) if d.shape[0] > 1 else np.full(d.shape[1], np.nan)
    return d.mean(axis=0), se


def label_advantages(env, op, mask: np.ndarray, t_action: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(advantage, standard error) of every action of the env's current state (NaN for the
    masked ones): the rollout operator ``op`` scores the valid actions on shared futures
    (:func:`advantages`)."""
    valid = np.flatnonzero(mask)
    cands = _action_candidates(env)
    S = op.score(env.cluster, [cands[a] for a in valid], rng)
    mean, se_v = advantages(S, int(np.flatnonzero(valid == t_action)[0]))
    adv = np.full(len(mask), np.nan)
    se = np.full(len(mask), np.nan)
    adv[valid], se[valid] = mean, se_v
    return adv, se


def run_episode(kw: dict, cfg: PolicyIterationConfig, seed: int, weights: bytes | None,
                layout: dict | None, label: bool, label_seed: int) -> dict:
    """One episode on ``gym.make("LLMCluster-v0", **kw)``, driven by the network (``weights``)
    or by the teacher (None). Returns the visited observations and masks, the teacher's action
    in each (None where the action space cannot express it), the operator's advantages where
    labelled, and the episode's metrics. Runs in a worker process as well as inline."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    from llm_lb_gym.routers.improve import RolloutImprovement
    from llm_lb_gym.rollout import make_env_router, router_choice, start_episode, take_choice, watchdog

    th.set_num_threads(1)
    env = gym.make("LLMCluster-v0", **kw).unwrapped
    teacher = make_env_router(cfg.teacher, env, **cfg.teacher_options)
    policy = None
    if weights is not None:
        net = make_net(layout, cfg, 0)
        net.load_state_dict(th.load(io.BytesIO(weights), weights_only=True))
        policy = NetPolicy(net, cfg.prior)
    op = None
    if label:
        ob = env.obs_builder
        op = RolloutImprovement(cfg.operator_options(env.cfg.decision_interval_s),
                                workload=env.workload, predictor=env.predictor,
                                prompt_scheme=ob.prompt_scheme, decode_scheme=ob.decode_scheme,
                                base_router=make_env_router(cfg.teacher, env, **cfg.teacher_options))
    rng = np.random.default_rng([label_seed, seed])
    obs, info = start_episode(env, teacher, seed)
    check = watchdog(env, f"policy iteration (teacher {teacher!r}, "
                          f"{'the network' if policy is not None else 'the teacher'} acting)", seed).check
    obs_l, mask_l, teach_l, adv_l, se_l = [], [], [], [], []
    n_choice = labelled = 0
    label_wall = 0.0
    while True:
        mask = info["action_mask"] if "action_mask" in info else env.action_masks()
        c = env.cluster
        t_choice = router_choice(env, teacher)
        t_action = env.defer_action if t_choice is None else env.action_for(*t_choice)
        valid = np.flatnonzero(mask)
        adv = se = None
        if c.queue and len(valid) > 1:
            n_choice += 1
            if (op is not None and t_action is not None and mask[t_action]
                    and n_choice % cfg.label_every == 0 and labelled < cfg.max_labels_per_episode):
                t0 = time.perf_counter()
                adv, se = label_advantages(env, op, mask, t_action, rng)
                labelled += 1
                label_wall += time.perf_counter() - t0
            obs_l.append(obs)
            mask_l.append(mask)
            teach_l.append(-1 if t_action is None else t_action)
            adv_l.append(adv)
            se_l.append(se)
        if policy is None or t_action is None:
            # the teacher's choice as it takes it (not expressible: followed, not recorded; a
            # hold also where the mask forbids it, action.masked)
            obs, r, term, trunc, info = take_choice(env, t_choice)
        else:
            a = policy.act(obs, mask, t_action)
            if a == env.defer_action and not mask[a]:   # the teacher's hold, taken as it takes it
                obs, r, term, trunc, info = take_choice(env, None)
            else:
                obs, r, term, trunc, info = env.step(a)
        if term or trunc:
            break
        check()
    return {"obs": np.asarray(obs_l, np.float32).reshape(len(obs_l), -1),
            "mask": np.asarray(mask_l, bool).reshape(len(mask_l), -1),
            "teacher": np.asarray(teach_l, np.int64), "adv": adv_l, "se": se_l,
            "metrics": info.get("metrics") or env.metrics(), "labelled": labelled,
            "label_wall_s": label_wall, "seed": seed}


def _map(fn, jobs: list[tuple], cfg: PolicyIterationConfig) -> list:
    if cfg.executor == "inline" or cfg.workers == 1 or len(jobs) == 1:
        return [fn(*j) for j in jobs]
    if cfg.executor == "ray":
        try:
            from ray.util.multiprocessing import Pool
        except ImportError:
            raise ConfigError("improve.executor=ray needs Ray: pip install -e '.[ray]'; "
                              "allowed without it: process, inline") from None
        with Pool(processes=cfg.workers) as pool:
            return pool.starmap(fn, jobs)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=cfg.workers, mp_context=mp.get_context("fork")) as ex:
        return list(ex.map(fn, *zip(*jobs)))


# ----------------------------------------------------------------------------- training
def improvement_targets(logits: np.ndarray, mask: np.ndarray, adv: np.ndarray,
                        temperature: float) -> np.ndarray:
    """pi_prev(a) exp(A(a) / temperature), normalised over the valid actions (module doc)."""
    z = np.where(mask, logits + np.nan_to_num(adv, nan=0.0) / temperature, -np.inf)
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def fit(net, data: dict, cfg: PolicyIterationConfig, seed: int) -> float:
    """``cfg.loss="ce"``: masked cross-entropy of the policy's logits (network + teacher prior)
    against the target distributions in ``data`` (``obs``, ``mask``, ``teacher``, ``target``).
    ``"advantage"``: squared error of net(a) - net(teacher) against ``data["adv"]`` over the
    labelled actions. ``cfg.epochs`` passes of Adam; returns the last epoch's mean loss."""
    th.set_num_threads(1)
    net.train()
    opt = th.optim.Adam(net.parameters(), lr=cfg.learning_rate)
    X, M = th.from_numpy(data["obs"]), th.from_numpy(data["mask"])
    A, T = th.from_numpy(data["teacher"]), th.from_numpy(data["target"].astype(np.float32))
    Wt = th.from_numpy(np.asarray(data.get("weight", np.ones(len(X))), np.float32))
    if cfg.loss == "advantage":
        adv = data["adv"]
        lab = th.from_numpy(np.isfinite(adv) & data["mask"])
        ADV = th.from_numpy(np.nan_to_num(adv, nan=0.0).astype(np.float32))
    g = th.Generator().manual_seed(seed)
    n = len(X)
    loss_v = math.nan
    for _ in range(cfg.epochs):
        perm = th.randperm(n, generator=g)
        tot = 0.0
        for i in range(0, n, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            if cfg.loss == "advantage":
                q = net(X[idx])
                d = q - q.gather(1, A[idx].clamp(min=0)[:, None])
                err = (d - ADV[idx]).masked_fill(~lab[idx], 0.0)
                w = Wt[idx][:, None]
                loss = (w * err * err).sum() / (w * lab[idx]).sum().clamp(min=1e-9)
            else:
                z = prior_logits(net, X[idx], A[idx], cfg.prior).masked_fill(~M[idx], -1e9)
                ce = -(T[idx] * F.log_softmax(z, dim=1)).sum(dim=1)
                loss = (Wt[idx] * ce).sum() / Wt[idx].sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
            tot += float(loss.detach()) * len(idx)
        loss_v = tot / n
    net.eval()
    return loss_v


def _logits(net, obs: np.ndarray, teacher: np.ndarray, prior: float) -> np.ndarray:
    with th.inference_mode():
        return prior_logits(net, th.from_numpy(obs), th.from_numpy(teacher), prior).numpy()


def _episodes(pairs, cfg, net, layout, label: bool, label_seed: int = 0) -> list[dict]:
    """``pairs``: (env keywords, seed) of each episode."""
    w = None if net is None else _weights_bytes(net)
    return _map(run_episode, [(kw, cfg, s, w, layout, label, label_seed) for kw, s in pairs], cfg)


def condition_pairs(kw: dict, cfg: PolicyIterationConfig, seeds, draw: int) -> list[tuple[dict, int]]:
    """(env keywords, seed) per episode: the setting ``kw`` on each seed, or (``cfg.conditions``)
    a condition drawn per seed from the space (``default_rng([cfg.seed, draw])``) with the
    setting's observation, action, reward and decision-interval options on top. The space's
    clusters are those of ``cfg.condition_instances`` instances; where one is mixed, the
    setting's observation must carry the mixed-cluster features (checked, named)."""
    if cfg.conditions == "setting":
        return [(kw, s) for s in seeds]
    from llm_lb_gym.envs.observation import MIXED_CLUSTER_FEATURES
    from llm_lb_gym.suite.suites import get_space

    space = get_space(cfg.conditions).with_instances(
        cfg.condition_instances, f"improve.condition_instances={cfg.condition_instances}")
    feats = set((kw.get("obs") or {}).get("features") or ())
    missing = [f for f in MIXED_CLUSTER_FEATURES if f not in feats]
    if space.mixed and missing:
        raise ConfigError(f"improve.conditions={cfg.conditions!r} draws mixed clusters: env.obs.features "
                          f"needs {', '.join(missing)} (the network then observes every episode alike)")
    own = {k: kw[k] for k in ("obs", "action", "reward", "decision_interval_s") if k in kw}
    conds = space.sample(np.random.default_rng([cfg.seed, draw]), len(seeds))
    return [({**c.env_kwargs(), **own}, s) for c, s in zip(conds, seeds)]


def policy_iteration(kw: dict, cfg: PolicyIterationConfig, out=None, log=print,
                     writer=None) -> dict[str, Any]:
    """Run ``cfg.rounds`` improvement rounds on the env ``kw`` from the teacher; returns the
    history and the best network (``NetPolicy``). With ``out`` (a folder) each round's network
    is saved as ``round<r>.pt`` and the best as ``best_policy.pt``."""
    from pathlib import Path

    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    val_pairs = condition_pairs(kw, cfg, cfg.validation_seeds, 10_000)
    env = gym.make("LLMCluster-v0", **val_pairs[0][0]).unwrapped
    layout = env.obs_layout.as_dict()
    t_start = time.perf_counter()
    teacher_val = _episodes(val_pairs, cfg, None, layout, False)
    skipped = sum(int((ep["teacher"] < 0).sum()) for ep in teacher_val)
    decisions = sum(len(ep["teacher"]) for ep in teacher_val)
    if skipped > 0.01 * max(decisions, 1):
        raise ConfigError(
            f"improve.teacher={cfg.teacher!r} with options {cfg.teacher_options} chose requests "
            f"the env's candidate actions cannot express in {skipped} of {decisions} decisions; "
            "set env.action.candidates >= 2 with env.action.order matching the teacher's order "
            "(late_binding: order=shortest; scored_binding: order=scored with action.order_weights from its options)")
    teacher_e2e = np.array([ep["metrics"]["mean_e2e_s"] for ep in teacher_val])
    net = make_net(layout, cfg, cfg.seed)
    history: list[dict] = []

    def record(r: int, extra: dict) -> dict:
        val = _episodes(val_pairs, cfg, net, layout, False)
        e2e = np.array([ep["metrics"]["mean_e2e_s"] for ep in val])
        d = 100.0 * (e2e - teacher_e2e) / teacher_e2e
        row = {"round": r, "val_mean_e2e_s": float(e2e.mean()), "val_vs_teacher_pct": float(d.mean()),
               "val_unfinished": int(sum(ep["metrics"]["unfinished"] for ep in val)),
               "wall_s": time.perf_counter() - t_start, **extra}
        history.append(row)
        log(f"round {r}: validation mean E2E {row['val_mean_e2e_s']:.3f} s, "
            f"{row['val_vs_teacher_pct']:+.2f}% vs {cfg.teacher} ({teacher_e2e.mean():.3f} s; "
            f"per seed {', '.join(f'{x:+.1f}' for x in d)}); "
            + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in extra.items()))
        if writer is not None:
            for k, v in row.items():
                if k != "round":
                    writer.add_scalar(f"improve/{k}", v, r)
        return row

    best = record(0, {})
    best_state = {k: v.clone() for k, v in net.state_dict().items()}
    if out is not None:
        NetPolicy(net, cfg.prior, cfg.teacher, cfg.teacher_options).save(Path(out) / "round0.pt", layout, cfg)
    data: dict[str, list] = {"obs": [], "mask": [], "teacher": [], "target": [], "adv": [], "weight": []}
    for r in range(1, cfg.rounds + 1):
        seeds = [cfg.round_seed + 100 * r + e for e in range(cfg.episodes_per_round)]
        eps = _episodes(condition_pairs(kw, cfg, seeds, r), cfg, net, layout, True, cfg.seed + r)
        n_lab, gains, ses, deviate = 0, [], [], 0
        for ep in eps:
            rows = [i for i, a in enumerate(ep["adv"]) if a is not None]
            free = [i for i, a in enumerate(ep["adv"]) if a is None]
            if len(free) > cfg.kl_states_per_episode:
                free = [free[j] for j in np.linspace(0, len(free) - 1, cfg.kl_states_per_episode).astype(int)]
            if not cfg.kl_weight:
                free = []
            for idx, labelled in ((rows, True), (free, False)):
                if not idx:
                    continue
                obs, mask, teach = ep["obs"][idx], ep["mask"][idx], ep["teacher"][idx]
                adv = (np.stack([ep["adv"][i] for i in idx]) if labelled
                       else np.where(mask, 0.0, np.nan))
                prev = _logits(net, obs, teach, cfg.prior)
                tgt = improvement_targets(prev, mask, adv, cfg.temperature)
                w = np.full(len(idx), 1.0 if labelled else cfg.kl_weight)
                for key, v in (("obs", obs), ("mask", mask), ("teacher", teach), ("target", tgt),
                               ("adv", adv), ("weight", w)):
                    data[key].append(v)
                if labelled:
                    n_lab += len(rows)
                    deviate += int(np.sum(np.argmax(tgt, 1) != teach))
                    gains += list(np.nanmax(adv, axis=1))
                    ses += [float(np.nanmedian(ep["se"][i])) for i in rows]
        if not n_lab:
            raise RuntimeError(f"improve round {r}: no state was labelled (episodes too short for "
                               f"label_every={cfg.label_every}?)")
        loss = fit(net, {k: np.concatenate(v) for k, v in data.items()}, cfg, cfg.seed + r)
        row = record(r, {
            "loss": loss, "labelled": n_lab, "target_deviates": deviate / n_lab,
            "collect_mean_e2e_s": float(np.mean([ep["metrics"]["mean_e2e_s"] for ep in eps])),
            "mean_best_adv": float(np.mean(gains)),
            "median_adv_se": float(np.nanmedian(ses)) if ses else math.nan,
            "label_ms_per_state": 1e3 * sum(ep["label_wall_s"] for ep in eps) / n_lab})
        if out is not None:
            NetPolicy(net, cfg.prior, cfg.teacher, cfg.teacher_options).save(Path(out) / f"round{r}.pt", layout, cfg)
        if row["val_unfinished"] == 0 and row["val_mean_e2e_s"] < best["val_mean_e2e_s"]:
            best = row
            best_state = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(best_state)
    policy = NetPolicy(net, cfg.prior, cfg.teacher, cfg.teacher_options)
    if out is not None:
        policy.save(Path(out) / "best_policy.pt", layout, cfg, {"round": best["round"]})
    return {"history": history, "best_round": best["round"], "policy": policy, "layout": layout,
            "teacher_val_mean_e2e_s": float(teacher_e2e.mean()),
            "wall_s": time.perf_counter() - t_start}


# ----------------------------------------------------------------------------- deployment
class DistilledAgent:
    """A saved policy-iteration network acting in an env, with the ``predict`` signature the
    package's evaluation uses (``llm_lb_gym.rollout.rollout_agent``; ``llm_lb_gym.experiments.evaluate``
    loads it as ``agents={name: {kind: distilled, path: best_policy.pt}}``).

    The policy needs the teacher's choice in the current state, so the agent holds the env it
    acts in and a teacher router of its own (reset whenever the env starts a new episode). The
    teacher may hold where the env's mask forbids it (a hold on an idle cluster): give the
    agent an env with ``action.masked="as_taken"`` (``ENV_OPTIONS``) so such a hold is taken
    as the teacher takes it, as in training."""

    ENV_OPTIONS = {"action": {"masked": "as_taken"}}

    @classmethod
    def env_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` (env keywords: the run's, or only its action and observation options)
        with ``ENV_OPTIONS`` merged into the action options: the env the network acts in, the
        one place that says so for every loader (serve, benchmark, evaluate, improve)."""
        out = dict(options)
        out["action"] = {**(out.get("action") or {}), **cls.ENV_OPTIONS["action"]}
        return out

    def __init__(self, policy: NetPolicy, env):
        from llm_lb_gym.rollout import make_env_router

        self.policy = policy
        self.env = env.unwrapped
        self.teacher = make_env_router(policy.teacher, self.env, **policy.teacher_options)
        self._cluster = None
        self.decision_wall_s: list[float] = []

    @classmethod
    def load(cls, path, env) -> "DistilledAgent":
        return cls(NetPolicy.load(path), env)

    def teacher_action(self) -> int:
        from llm_lb_gym.rollout import router_choice

        env = self.env
        c = env.cluster
        if c is not self._cluster:
            self._cluster = c
            self.teacher.reset(np.random.default_rng(0), env.m)
        choice = router_choice(env, self.teacher)
        if choice is None:
            return env.defer_action
        a = env.action_for(*choice)
        return -1 if a is None else a

    def predict(self, observation, state=None, episode_start=None, deterministic=True,
                action_masks=None):
        t0 = time.perf_counter()
        mask = self.env.action_masks() if action_masks is None else action_masks
        a = self.policy.act(observation, mask, self.teacher_action())
        self.decision_wall_s.append(time.perf_counter() - t0)
        return a, state
