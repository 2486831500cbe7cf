"""``LLMCluster-v0``: the router's MDP over the cluster simulator (Jain et al. 2024, §5.3)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..limits import grid_index_at_or_after
from ..sim.cluster import Cluster
from ..sim.config import ClusterConfig
from ..sim.metrics import episode_metrics
from ..sim.request import RequestTable
from ..workload.batch import RequestBatch
from .actions import coerce_action
from .builders import build_predictor, build_workload
from .config import EnvConfig
from .observation import ObservationBuilder
from .reward import guidance_term, guidance_weight, ideal_latency_s


class LLMClusterEnv(gym.Env):
    """Route LLM requests to ``m`` identical vLLM-style instances.

    ## Description
    Requests (prompt tokens, a true output length the router never sees, a predicted
    decode-length bucket) arrive at a router queue. Every decision interval (0.02 s) the agent
    sends the head of the queue to an instance or defers it. Instances run continuous batching
    with prefill-prioritised iterations, a paged KV cache and recompute preemption (see
    ``docs/simulator_semantics.md``). Default: the paper's main setting (4 x Llama-2-7B on
    V100, five-task mix, Poisson 20 req/s, 2,000 requests).

    ## Action Space
    ``Discrete(m + 1)``: ``a < m`` routes the head request to instance ``a``; ``a = m`` defers
    (waits one interval). Routing with an empty queue is a no-op (masked out in
    ``info["action_mask"]`` and ``action_masks()``).

    ## Observation Space
    A flat ``Box`` of ``4 + m (n_p + n_d + 2)`` floats (``obs={"as_dict": True}`` gives a
    ``Dict``); the index table is in ``llm_lb_gym/envs/observation.py`` and the README: queue
    length, head prompt tokens, head predicted decode bucket and tokens, then per instance the
    prompt-phase bucket counts P, decode-phase bucket counts D, capacity, and predicted time to
    its first completion.

    ## Rewards
    ``-sum over elapsed intervals of sum_j (1/T_j)(1 - f_jt) + r_w * completions + w_k * h``
    (``llm_lb_gym/envs/reward.py``); components in ``info["reward_components"]``, the
    guidance weight in ``info["guidance_weight"]``.

    ## Time
    A defer advances the clock one interval. After a routing action the next decision comes at
    the same time while requests wait (``one_action_per_interval=True``: every action advances
    one interval, as in the paper). With an empty router queue the env fast-forwards, interval
    by interval, to the first decision time at or after the next arrival.

    ## Episode End
    Terminated when every request has finished or been rejected (after the last arrival the
    env runs the cluster to completion within the step). Truncation comes from the
    ``TimeLimit`` set at registration (``max_episode_steps``). The final ``info["metrics"]``
    holds the episode metrics (at a truncation ``gym.make``'s ``FinalMetrics`` wrapper adds
    them, see ``wrappers.py``); ``info["metrics"]["unfinished"]`` counts requests still in the
    system at a truncation.

    ## Arguments
    See ``EnvConfig`` (``llm_lb_gym/envs/config.py``): ``num_instances``, ``num_requests``,
    ``arrival_rate_rps``, ``workload``, ``engine``, ``predictor``, ``reward``, ``obs``,
    ``decision_interval_s``, ``one_action_per_interval``, ``fast``, ``check_invariants``.

    ## Version History
    - v0: initial version.
    """

    metadata = {"render_modes": []}

    def __init__(self, **options: Any):
        self.cfg = EnvConfig.from_kwargs(**options)
        cfg = self.cfg
        self.m = cfg.num_instances
        self.cluster_cfg = ClusterConfig(num_instances=self.m, engine=cfg.engine, fast=cfg.fast)
        eng = cfg.engine
        self.latency = eng.latency_model
        self.workload = build_workload(cfg.workload, cfg.arrival_rate_rps)
        self.predictor = build_predictor(cfg.predictor)
        self.obs_builder = ObservationBuilder(
            cfg.obs, self.m, cfg.num_requests, eng.max_num_seqs, eng.context_len,
            eng.total_blocks * eng.block_size)
        self.observation_space = self.obs_builder.space()
        self.action_space = spaces.Discrete(self.m + 1)
        self._mask_all = np.ones(self.m + 1, dtype=bool)
        self._mask_defer_only = np.zeros(self.m + 1, dtype=bool)
        self._mask_defer_only[self.m] = True
        self.guidance_episode = 0
        self._episode_ended = False
        self._dt = cfg.decision_interval_s
        self._batched_grid = True
        self.cluster: Cluster | None = None
        self.batch: RequestBatch | None = None

    # ------------------------------------------------------------------ API
    def set_guidance_episode(self, k: int) -> None:
        """Set the annealing counter (training episodes so far, across all parallel envs); it
        takes effect at the next reset."""
        self.guidance_episode = int(k)
        self._episode_ended = False

    set_training_episode = set_guidance_episode   # the name agents.callbacks calls

    def action_masks(self) -> np.ndarray:
        """Valid actions: routing needs a request in the router queue; defer is always valid."""
        if self.cluster is None or not self.cluster.queue:
            return self._mask_defer_only.copy()
        return self._mask_all.copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "guidance_episode" in options:
            self.guidance_episode = int(options["guidance_episode"])
        elif self._episode_ended:
            # k counts finished episodes, so resets without an episode in between (checkers,
            # seeding) leave the reward unchanged; trainers with parallel envs set it instead.
            self.guidance_episode += 1
        self._episode_ended = False
        rng = self.np_random
        batch = options.get("batch") or self.workload.sample(rng, self.cfg.num_requests)
        self.batch = batch
        pred = self.predictor.predict(batch, rng)
        ob = self.obs_builder
        ideal = ideal_latency_s(self.latency, batch.prompt_tokens, pred.tokens)
        table = RequestTable(
            batch.arrival_s, batch.prompt_tokens, batch.decode_tokens, pred.tokens, batch.task_id,
            prompt_bucket=ob.prompt_scheme.bucket(batch.prompt_tokens),
            decode_bucket=ob.decode_scheme.bucket(pred.tokens),
            inv_ideal_s=1.0 / ideal)
        self.pred_bucket = pred.bucket
        self.cluster = Cluster(self.cluster_cfg, table, num_prompt_buckets=ob.n_p,
                               num_decode_buckets=ob.n_d, check=self.cfg.check_invariants)
        self._k = 0                      # decision intervals elapsed: time = k * dt
        self._w = guidance_weight(self.cfg.reward, self.guidance_episode)
        self._finished_seen = 0
        self.cluster.advance_to(0.0)   # requests arriving at t = 0 are decided at t = 0
        pen, comp = self._advance_until_decision()
        info = self._info(-pen, comp, 0.0)
        info["metrics"] = None
        return self.obs_builder.observe(self.cluster), info

    def step(self, action):
        return self.route_step(coerce_action(action, self.m + 1), 0)

    def route_step(self, instance: int, position: int = 0):
        """``step`` generalised for routers that reorder the queue (Min-Min): route the request
        at router-queue ``position`` to ``instance`` (``instance == m`` defers)."""
        c = self.cluster
        if c is None:
            raise RuntimeError("step() before reset()")
        a = instance
        h = 0.0
        routed = False
        if a < self.m and c.queue:
            rid = c.queue[position]
            if self._w:
                h = guidance_term([e.committed_tokens for e in c.engines], c.table.prompt[rid],
                                  c.table.pred[rid], a, self.cfg.reward)
            c.route(a, position)
            routed = True
        pen = comp = 0.0
        if not routed or self.cfg.one_action_per_interval:
            p, n = self._tick()
            pen += p
            comp += n
        p, n = self._advance_until_decision()
        pen += p
        comp += n
        rc = self.cfg.reward
        penalty = -rc.penalty_scale * pen
        completion = rc.completion_reward * comp
        guidance = self._w * h
        reward = penalty + completion + guidance
        terminated = c.all_arrived and not c.queue and c.done
        info = self._info(penalty, completion, guidance)
        if terminated:
            self._episode_ended = True
            info["metrics"] = self.metrics()
        return self.obs_builder.observe(c), float(reward), terminated, False, info

    def metrics(self) -> dict:
        """Episode metrics so far (final once the episode has terminated)."""
        c = self.cluster
        m = episode_metrics(c.table)
        m["unfinished"] = c.table.n - m["completed"] - m["rejected"]
        m["guidance_episode"] = self.guidance_episode
        return m

    # -------------------------------------------------------------- internals
    def _tick(self) -> tuple[float, int]:
        """Advance one decision interval; return (in-system penalty at its end, completions)."""
        self._k += 1
        pen, fin = self.cluster.tick(self._k * self._dt)
        done = fin - self._finished_seen
        self._finished_seen = fin
        return pen, done

    def _advance_until_decision(self) -> tuple[float, int]:
        """Fast-forward while the router queue is empty; drain the cluster after the last arrival.

        Equivalent to one ``_tick`` per decision interval (``_batched_grid=False`` does exactly
        that; a test holds the two equal), but each instance sums its own penalties over the
        skipped grid points in one call.
        """
        c = self.cluster
        pen = 0.0
        comp = 0
        if not self._batched_grid:
            while not c.queue:
                if c.all_arrived:
                    if c.done:
                        break
                else:
                    nxt = c.next_arrival_s
                    if all(e.idle() for e in c.engines):
                        k = max(self._k, math.ceil(nxt / self._dt) - 1)
                        if k > self._k:
                            self._k = k
                            c.advance_to(k * self._dt)
                p, n = self._tick()
                pen += p
                comp += n
            return pen, comp
        dt = self._dt
        while not c.queue:
            if c.all_arrived:
                if not c.done:
                    p, self._k, n = c.run_grid(self._k, dt, None)
                    pen += p
                    comp += n
                    self._finished_seen += n
                break
            nxt = c.next_arrival_s
            k1 = grid_index_at_or_after(nxt, dt, self._k + 1)
            p, self._k, n = c.run_grid(self._k, dt, k1)
            pen += p
            comp += n
            self._finished_seen += n
        return pen, comp

    def _info(self, penalty: float, completion: float, guidance: float) -> dict:
        c = self.cluster
        return {
            "time_s": c.t,
            "queue_len": len(c.queue),
            "action_mask": self.action_masks(),
            "reward_components": {"penalty": penalty, "completion": completion, "guidance": guidance},
            "guidance_weight": self._w,
        }
