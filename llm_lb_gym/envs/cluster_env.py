"""``LLMCluster-v0``: the router's MDP over the cluster simulator (Jain et al. 2024, §5.3)."""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from .._validate import check_choice, plain_values, reject_unexpected_keywords
from ..routers.drive import decide
from ..routers.scored_binding import order_key
from ..sim._compiled import engine_class
from ..sim.clock import DEFAULT_DECISION_INTERVAL_S, next_decision_index, skip_to_decision
from ..sim.cluster import Cluster
from ..sim.config import ClusterConfig
from ..sim.metrics import episode_metrics, prefix_cache_metrics
from ..sim.request import RequestTable
from ..sim.slo import request_deadlines
from ..sim.speed import InstanceSpeeds
from ..workload.batch import RequestBatch
from ._kernels import kernels_for
from .actions import coerce_action
from .builders import build_predictor, build_workload
from .config import ENV_OPTIONS, MIXING_TEACHER, EnvConfig
from .observation import MIXED_CLUSTER_FEATURES, ObservationBuilder
from .presets import apply_preset
from .render import RENDER_MODES, snapshot, to_ansi, to_rgb_array
from .reset_options import check_episode, check_reset_options
from .reward import guidance_term, guidance_weight
from .router_factory import make_env_router


engine_class()   # choose the engine now: a failed compile warns when the env is imported, not mid-run

MASK_DTYPE = np.int8
"""dtype of ``info["action_mask"]`` and ``action_masks()``: Gymnasium's ``Discrete.sample(mask=...)``
takes int8 (a bool mask is an error there); numpy's ``where``/``flatnonzero`` and SB3-contrib's
masking read it as booleans. Package 0.6 and before gave bool."""


class LLMClusterEnv(gym.Env):
    """Route LLM requests to ``m`` vLLM-style instances, identical or mixed (``instances``).

    ## Description
    Requests (prompt tokens, a true output length the router never sees, a predicted
    decode-length bucket) arrive at a router queue. Every decision interval (0.02 s) the agent
    sends the head of the queue to an instance or defers it. Instances run continuous batching
    with prefill-prioritised iterations, a paged KV cache and recompute preemption (see
    ``docs/simulator_semantics.md``). Default: the paper's main setting (4 x Llama-2-7B on
    V100, five-task mix, Poisson 20 req/s, 2,000 requests). ``instances=[{"preset":
    "llama2-7b-a100", "count": 2}, {"preset": "llama2-7b-v100", "count": 2}]`` makes a mixed
    cluster: each engine group has its own GPU/model preset and engine options
    (``docs/heterogeneous.md``).

    ## Action Space
    ``Discrete(m + 1)``: ``a < m`` routes the head request to instance ``a``; ``a = m`` defers
    (waits one interval). Routing with an empty queue is a no-op (masked out in
    ``info["action_mask"]`` and ``action_masks()``, int8 arrays of 0/1 that
    ``action_space.sample(mask=...)`` takes as they are).

    Masked actions (``action.masked``): an agent that ignores the mask, as most DQN code does,
    cannot stall an episode. By default (``fallback``) ``step`` hands a masked action (a defer
    while requests wait on an idle cluster, an empty candidate slot) to the fallback router
    (``action.fallback_router``, JSQ), which routes a queued request; from the episode's first
    masked action on, defers are also budgeted (``action.defer_budget``: one per arrived
    request), so an always-defer agent finishes in at most twice round robin's steps. Agents
    that respect the mask never meet either rule. ``masked="as_taken"`` keeps package 0.4's
    meaning (a masked defer waits; an empty slot is a no-op; an always-defer agent never ends).

    ## Observation Space
    A flat ``Box`` of ``4 + m (n_p + n_d + 2)`` floats (``obs={"as_dict": True}`` gives a
    ``Dict``); the index table is in ``llm_lb_gym/envs/observation.py`` and the README: queue
    length, head prompt tokens, head predicted decode bucket and tokens, then per instance the
    prompt-phase bucket counts P, decode-phase bucket counts D, capacity, and predicted time to
    its first completion. Optional per-instance columns (``obs.features``) include ``speed``
    (relative speed in (0, 1], 1 = the fastest instance) and ``kv_size`` (KV-cache tokens /
    the largest instance's); a mixed cluster always has both, and normalises each instance's
    counts by its own ``max_num_seqs`` and its capacity by its own KV cache.

    ## Rewards
    ``-sum over elapsed intervals of sum_j (1/T_j)(1 - f_jt) + r_w * completions + w_k * h``
    (``llm_lb_gym/envs/reward.py``), plus ``reward.slo_reward`` per request finishing within
    its SLO deadlines (``reward=slo``); components in ``info["reward_components"]``, the
    guidance weight in ``info["guidance_weight"]``. T_j is request j's ideal latency with its
    predicted decode length on the instance type that serves it fastest (in a homogeneous
    cluster: the instance's), a per-request constant known at arrival (``sim/speed.py``); SLO
    deadline multiples are of the same instance type's isolated times.

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

    ## Rendering
    ``render_mode="ansi"``: ``render()`` returns a text table of the router queue and each
    instance (running, prefilling, waiting, KV blocks used, preemptions, finished);
    ``"rgb_array"``: the same drawn as an image (``llm_lb_gym/envs/render.py``); ``"human"``:
    the text table printed to stdout after every reset and step (``render()`` returns None; for
    a pygame window wrap a ``rgb_array`` env in ``gymnasium.wrappers.HumanRendering``). Without a
    render mode ``render()`` returns None. Rendering does not change the episode.

    ## Arguments
    See ``EnvConfig`` (``llm_lb_gym/envs/config.py``): ``num_instances``, ``num_requests``,
    ``arrival_rate_rps``, ``workload``, ``engine``, ``instances``, ``predictor``, ``reward``, ``obs``,
    ``decision_interval_s``, ``one_action_per_interval``, ``fast``, ``check_invariants``,
    ``slo`` (per-request TTFT/TBT deadlines, ``llm_lb_gym/sim/slo.py``); ``preset``, a named
    regime whose options the others override (``near_capacity``, ``overload``, ``trace``:
    ``llm_lb_gym/envs/presets.py``; each also has an id, e.g. ``LLMCluster-NearCapacity-v0``);
    and Gymnasium's ``render_mode``. An unknown keyword raises ``TypeError`` worded as Python's
    (``__init__() got an unexpected keyword argument 'x'``, then the allowed names), which is
    also a ``ConfigError``.

    ## Version History
    - v0 (package 0.1): initial version, 5-term latency model. Mixed clusters (``instances``)
      and the ``speed``/``kv_size`` features were added as options without changing the default
      dynamics, observation or reward.
    - v0 (package 0.2): the iteration-time model gained a roofline knee, CPU-overhead terms and
      causal prefill attention, and every preset was refitted (``docs/calibration.md``): the
      default setting's dynamics changed, so results from package 0.1 are not comparable (the
      tables in the README and docs/ were re-measured or say which version they come from). The
      id stays ``-v0`` because the package is pre-1.0 and published results name the package
      version. Prefix caching, SLO deadlines (metrics and ``reward.slo_reward``) and new
      observation features are options; the SLO metrics are on by default and change nothing
      in the simulation.
    - v0 (package 0.3): two latency terms (GEMM tile rounding of the compute-bound term, a
      small-batch decode-attention price) and the A100, Llama-3 A100 and H100 presets refitted
      with them. The default (V100) preset and every result on it are unchanged, bit for bit;
      settings on the refitted presets (mixed A100/V100 clusters, ``engine=a100_*``/``h100_*``)
      move by about 1% (``docs/heterogeneous.md`` was re-measured).
    - v0 (package 0.4): a token price per octave of batched tokens (``token_segments``) and the
      A100, Llama-3 A100 and H100 presets refitted with it (median error 0.2-1.8%, at most 5.0%
      against the profiles). The default (V100) preset, the catalog and every result on them are unchanged,
      bit for bit; settings on the refitted presets move (``docs/heterogeneous.md`` and the
      capacities in ``docs/reproduction.md`` were re-measured).
    - v0 (after package 0.4): ``action.masked=fallback`` by default: masked actions route by the
      fallback router instead of being carried out. Episodes with no masked action (heuristic
      routers, mask-respecting agents, imitation) are unchanged, bit for bit.
    - v0 (after package 0.4): one memory model for every preset (``docs/hardware.md``): the
      default V100 preset has 1,889 KV blocks (was 1,887), the hand-set A100/H100/Llama-3
      presets 7,350/7,359/27,932 (were 7,353/7,353/28,181). Episodes without preemption are
      unchanged bit for bit; the capacity observation moves by about 0.1%, and episodes where
      the KV cache binds move slightly (load sweep above capacity: round robin within 0.3%).
      ``late_binding``'s class defaults became the default setting's tuned options.
    - v0 (package 0.7): ``preset=`` and the ids ``LLMCluster-NearCapacity-v0``,
      ``LLMCluster-Overload-v0``, ``LLMCluster-Trace-v0`` (named regimes with a deployable noisy
      predictor); ``LLMCluster-v0``'s dynamics are unchanged. The action mask is int8 (was bool).
      ``action.kv_room`` and ``action.hold_without_room_only`` (off by default) put
      ``late_binding``'s KV-room rule in the mask; the dynamics do not change.
    """

    # render_fps: one frame per decision interval at the default 0.02 s (steps are not evenly
    # spaced in simulated time, so a video is a sequence of decisions, not a clock).
    metadata = {"render_modes": list(RENDER_MODES),
                "render_fps": round(1.0 / DEFAULT_DECISION_INTERVAL_S)}

    def __init__(self, render_mode: str | None = None, preset: str | None = None, **options: Any):
        reject_unexpected_keywords(options, (*ENV_OPTIONS, "render_mode", "preset"))
        options = plain_values(options)   # numpy scalars compute as the plain values would
        check_choice("render_mode", render_mode, (None, *RENDER_MODES))
        self.render_mode = render_mode
        self.preset = preset
        """The named regime (``envs/presets.py``) the options start from; None: the defaults."""
        if preset is not None:
            options = apply_preset(preset, options)
        self.cfg = EnvConfig(**options)
        cfg = self.cfg
        self.m = cfg.num_instances
        self.cluster_cfg = ClusterConfig(num_instances=self.m, engine=cfg.engine, fast=cfg.fast,
                                         instances=cfg.instances)
        engines = self.cluster_cfg.engines
        # Speed and KV size per instance, and the reward's T_j (``sim/speed.py``).
        self.speeds = InstanceSpeeds(engines)
        obs_cfg = cfg.obs
        if not self.speeds.homogeneous:   # without them an agent cannot tell the instances apart
            extra = tuple(f for f in MIXED_CLUSTER_FEATURES if f not in obs_cfg.features)
            obs_cfg = dataclasses.replace(obs_cfg, features=obs_cfg.features + extra)
        self.obs_cfg = obs_cfg
        self.workload = build_workload(cfg.workload, cfg.arrival_rate_rps)
        self.predictor = build_predictor(cfg.predictor, self.workload)
        if cfg.slo is not None and cfg.slo.per_task and hasattr(self.workload, "task_names"):
            cfg.slo.check_tasks(tuple(self.workload.task_names))   # per-task deadlines: fail now
        act = cfg.action
        self.k = act.candidates
        self.obs_builder = ObservationBuilder(
            obs_cfg, self.m, cfg.num_requests, [e.max_num_seqs for e in engines],
            max(e.context_len for e in engines), self.speeds.kv_tokens, num_candidates=self.k,
            block_size=[e.block_size for e in engines], relative_speed=self.speeds.relative_speed)
        self.obs_layout = self.obs_builder.layout
        self.observation_space = self.obs_builder.space()
        self.defer_action = self.k * self.m
        self.action_space = spaces.Discrete(self.defer_action + 1)
        self._mask_idle_defer = act.mask_idle_defer
        self._masks: dict[int, np.ndarray] = {}   # see _mask_of
        self._mask = self._mask_of(0, True)
        self._valid_routes, self._defer_ok = 0, True   # the mask's content (see _observe)
        self._head_only = self.k == 1 and act.order == "oldest"
        self.guidance_episode = 0
        self._episode_ended = False
        self._dt = cfg.decision_interval_s
        rc = cfg.reward
        # Read once per step: kept as plain attributes (the configs are frozen).
        self._one_per_interval = cfg.one_action_per_interval
        self._completion_reward, self._slo_weight = rc.completion_reward, rc.slo_reward
        self._gamma = rc.gamma
        self._reward_cfg = rc
        self._semi_mdp = rc.discount == "semi_mdp"
        self._latency_penalty = rc.penalty == "latency"
        self._slo_reward = rc.slo_reward != 0.0
        # Penalty per grid point: the paper's per interval; latency: requests x interval (s).
        self._pen_unit = rc.penalty_scale * (self._dt if self._latency_penalty else 1.0)
        # Discount of one decision interval (1 per-step: nothing inside a step is discounted).
        self._g = math.exp(-self._dt / rc.horizon_s) if self._semi_mdp else 1.0
        self._batched_grid = True
        # Per episode (reset): the observation function and, with the compiled engine, the
        # compiled kernels of the idle test and the mixing guidance (None: the Python code).
        self._obs_fn = self.obs_builder.observe
        self._all_idle = None
        self._mixing_h = None
        self.cluster: Cluster | None = None
        self._warned_truncation = False
        self.batch: RequestBatch | None = None
        self._teacher = None
        self._cands: tuple[int, ...] = ()
        self._fallback_on = act.masked == "fallback"
        self._fallback = None          # built on the first masked action (masked=fallback)
        self._defers = 0               # defers with requests waiting, this episode
        self._guarded = False          # the agent took a masked action: budget its defers
        # action.kv_room: late_binding's room rule masks routes to instances without KV room.
        self._room_rule = (make_env_router("late_binding", self, reserve=act.kv_room, period_s=0.0)
                           if act.kv_room is not None else None)
        self._hold_only_without_room = act.hold_without_room_only
        self.masked_actions = 0
        """Masked actions ``step`` handed to the fallback router this episode."""

    # ------------------------------------------------------------------ API
    def set_guidance_episode(self, k: int) -> None:
        """Set the annealing counter (training episodes so far, across all parallel envs); it
        takes effect at the next reset."""
        self.guidance_episode = check_episode("set_training_episode k", k)
        self._episode_ended = False

    set_training_episode = set_guidance_episode   # the name llm_lb_gym.agents.callbacks calls

    def action_masks(self) -> np.ndarray:
        """Valid actions: route one of the current candidates to any instance (with
        ``action.kv_room``: to an instance with KV room for it); defer, unless requests wait on
        an idle cluster (``action.mask_idle_defer``), under ``action.masked=fallback`` the
        episode's defers have used ``action.defer_budget``, or with
        ``action.hold_without_room_only`` some candidate fits somewhere.

        ``int8`` 0/1 (``MASK_DTYPE``), what ``action_space.sample(mask=...)`` takes; torch code
        that masks with ``~`` needs ``.bool()`` first (``~`` of an int8 is a bitwise not).

        A fresh array, as in ``info["action_mask"]`` (callers keep them): a copy of the mask
        worked out when the observation was made (it changes only then, at a reset or a step's
        end), which is cheaper than building one."""
        return self._mask.copy()

    def _mask_of(self, n: int, defer_ok: bool) -> np.ndarray:
        """The mask routing ``n`` candidates, with defer allowed or not: built on first use and
        kept read-only (handed out as copies), as building one per step cost more than copying."""
        mask = self._masks.get(2 * n + defer_ok)
        if mask is None:
            mask = np.zeros(self.defer_action + 1, dtype=MASK_DTYPE)
            mask[:n * self.m] = 1
            mask[-1] = defer_ok
            mask.setflags(write=False)
            self._masks[2 * n + defer_ok] = mask
        return mask

    def _mask_without_room(self, cands: tuple[int, ...], defer_ok: bool) -> None:
        """``action.kv_room``: clear the routes of candidates to instances without KV room for
        them (``late_binding``'s ``rooms``/``need_blocks``/``fits``). Where that leaves no valid
        action at all (defer masked too) the plain mask stays, so an episode always ends."""
        rule, c, m = self._room_rule, self.cluster, self.m
        rooms = rule.rooms(c)
        homogeneous = c.speeds.homogeneous
        mask = np.zeros(self.defer_action + 1, dtype=MASK_DTYPE)
        mask[-1] = defer_ok
        any_route = False
        for j, rid in enumerate(cands):
            need = rule.need_blocks(c, rid)
            for i in range(m):
                if not homogeneous:
                    need = rule.need_blocks(c, rid, i)
                if rule.fits(c, rooms[i], need, i):
                    mask[j * m + i] = 1
                    any_route = True
        if any_route and self._hold_only_without_room:
            mask[-1] = 0
        if any_route or defer_ok:
            self._mask = mask

    def _defer_budget_spent(self) -> bool:
        budget = self.cfg.action.defer_budget
        return (self._guarded and budget is not None
                and self._defers >= budget * self.cluster.n_arrived)

    @property
    def candidates(self) -> tuple[int, ...]:
        """Request ids of the candidate slots of the current observation (slot j = action
        ``j * m + i``)."""
        return self._cands

    def action_for(self, position: int | None, instance: int | None) -> int | None:
        """The action that routes the router queue's request at ``position`` to ``instance``
        (None: defer), or None when that request is not one of the current candidates."""
        if position is None or instance is None:
            return self.defer_action
        self._require_reset("action_for()")
        rid = self.cluster.queue[position]
        try:
            j = self._cands.index(rid)
        except ValueError:
            return None
        return j * self.m + instance

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        options = check_reset_options(options, self.cfg.num_requests)
        super().reset(seed=seed)
        if "guidance_episode" in options:
            self.guidance_episode = options["guidance_episode"]
        elif self._episode_ended:
            # k counts finished episodes, so resets without an episode in between (checkers,
            # seeding) leave the reward unchanged; trainers with parallel envs set it instead.
            self.guidance_episode += 1
        self._episode_ended = False
        rng = self.np_random
        batch = options.get("batch")
        if batch is None:
            batch = self.workload.sample(rng, self.cfg.num_requests)
        self.batch = batch
        pred = self.predictor.predict(batch, rng)
        ob = self.obs_builder
        ideal = self.speeds.ideal_latency_s(batch.prompt_tokens, pred.tokens)
        ttft_dl = tbt_dl = None
        if self.cfg.slo is not None:
            fast = self.speeds.fastest_engine
            ttft_dl, tbt_dl = request_deadlines(self.cfg.slo, self.speeds.fastest_latency,
                                                batch.prompt_tokens, batch.decode_tokens,
                                                batch.task_id, batch.task_names,
                                                fast.frontend_model, fast.async_scheduling)
        table = RequestTable.from_batch(
            batch, pred.tokens, prompt_bucket=ob.prompt_scheme.bucket(batch.prompt_tokens),
            decode_bucket=ob.decode_scheme.bucket(pred.tokens), inv_ideal_s=1.0 / ideal,
            ttft_deadline_s=ttft_dl, tbt_deadline_s=tbt_dl, count_slo=self._slo_reward,
            pred_upper_tokens=pred.upper_tokens)
        self.pred_bucket = pred.bucket
        self.cluster = Cluster(self.cluster_cfg, table, num_prompt_buckets=ob.n_p,
                               num_decode_buckets=ob.n_d, check=self.cfg.check_invariants,
                               count_penalty=self._latency_penalty)
        self._k = 0                      # decision intervals elapsed: time = k * dt
        rc = self.cfg.reward
        self._w = guidance_weight(rc, self.guidance_episode)
        self._lambda = 1.0 - math.exp(-rc.decay * self.guidance_episode) if rc.guidance_form == "hurl" else 1.0
        self._guided = self._w != 0.0
        if self._guided and rc.teacher != MIXING_TEACHER:
            if self._teacher is None:
                self._teacher = make_env_router(rc.teacher, self, **rc.teacher_options)
            # Drawn after the workload and predictions, so the episode is the same as without.
            self._teacher.reset(np.random.default_rng(rng.integers(2**63)), self.m)
        self._finished_seen = 0
        self._met_seen = 0
        self._defers = 0
        self._guarded = False
        self.masked_actions = 0
        self._fallback_seeded = False
        kernels = kernels_for(self.cluster.engines)
        self._obs_fn = ob.observer(self.cluster)
        self._all_idle = kernels.all_idle if kernels is not None else None
        self._mixing_h = None
        if kernels is not None and self._guided and rc.teacher == MIXING_TEACHER:
            mp = rc.mixing
            self._mixing_h = kernels.MixingGuidance(mp.grad1, mp.grad2, mp.eps_s, mp.alpha).h
        self.cluster.advance_to(0.0)   # requests arriving at t = 0 are decided at t = 0
        pen, comp, _, met = self._advance_until_decision(0)
        obs = self._observe()
        if self.render_mode == "human":
            self._render_human()
        # No "metrics" key until an episode ends: vector envs stack each key's values across
        # envs and cannot mix None with the final step's dict.
        return obs, self._info(-self._pen_unit * pen, comp, 0.0, 0.0, 1.0, rc.slo_reward * met)

    def step(self, action):
        n_actions = self.defer_action + 1
        # coerce_action's first case inline: a plain int in range needs no call.
        a = action if type(action) is int and 0 <= action < n_actions else coerce_action(action, n_actions)
        if a < self._valid_routes and (self._room_rule is None or self._mask[a]
                                       or not self._fallback_on):   # routes a candidate
            rid = self._cands[a // self.m]
            q = self.cluster.queue
            pos = 0 if q[0] == rid else q.index(rid)
            return self._transition(pos, a % self.m)
        if self._fallback_on and self.cluster is not None and self.cluster.queue \
                and not (a == n_actions - 1 and self._defer_ok):   # masked
            return self._fallback_step()
        return self._transition(None, self.m)   # defer (or a slot with no request: a no-op)

    def _fallback_step(self):
        """A masked action under ``action.masked=fallback``: the fallback router decides. Its
        RNG is drawn from ``np_random`` at the episode's first masked action, so episodes
        without one are exactly as before and the same seed still gives the same episode."""
        if self._fallback is None:
            self._fallback = make_env_router(self.cfg.action.fallback_router, self)
        if not self._fallback_seeded:
            self._fallback.reset(np.random.default_rng(self.np_random.integers(2**63)), self.m)
            self._fallback_seeded = True
        self.masked_actions += 1
        self._guarded = True
        choice = decide(self.cluster, self._fallback)
        if choice is None:   # a holding router declined: route the oldest request anyway
            choice = (0, min(range(self.m), key=lambda i: self.cluster.engines[i].committed_tokens))
        return self._transition(*choice)

    def route_step(self, instance: int, position: int = 0):
        """``step`` in the routers' terms (``routers.drive.decide``): route the request at
        router-queue ``position`` to ``instance``; ``instance == m`` defers."""
        if self.cluster is None:
            raise RuntimeError("step() before reset()")
        if instance < self.m and self.cluster.queue:
            return self._transition(position, instance)
        return self._transition(None, self.m)

    def render(self):
        """The cluster now, as ``render_mode`` says: a string (``ansi``), an RGB array of shape
        (H, W, 3) (``rgb_array``), or None without a render mode."""
        if self.render_mode is None:   # Gymnasium's own envs warn the same way
            env_id = self.spec.id if self.spec is not None else "LLMCluster-v0"
            gym.logger.warn(
                "You are calling render method without specifying any render mode. You can "
                f'specify the render_mode at initialization, e.g. gym.make("{env_id}", '
                'render_mode="ansi")')
            return None
        if self.cluster is None:
            raise RuntimeError("render() before reset()")
        if self.render_mode == "human":   # printed at every step already
            return None
        view = snapshot(self.cluster)
        return to_ansi(view) if self.render_mode == "ansi" else to_rgb_array(view)

    def warn_if_truncated(self, limit: int | None) -> None:
        """Once per env: an episode takes at least one step per request (each route is a step),
        so an episode of more requests than the ``TimeLimit``'s ``limit`` can never terminate:
        every episode would be truncated and nothing would say why. ``FinalMetrics`` (outside
        the ``TimeLimit``, which the env never sees) calls it at each reset."""
        n = len(self.batch) if self.batch is not None else self.cfg.num_requests
        if limit is not None and n > limit and not self._warned_truncation:
            self._warned_truncation = True
            gym.logger.warn(
                f"num_requests={n} exceeds max_episode_steps={limit}: an episode needs at least one "
                "step per request, so every episode will be truncated before it terminates; pass "
                f"max_episode_steps=None (or more than {n}) to gym.make, or fewer requests")

    def _require_reset(self, what: str) -> None:
        if self.cluster is None:
            raise RuntimeError(f"{what} before reset(): there is no episode yet; call reset(seed=...) first")

    def _render_human(self) -> None:
        print(to_ansi(snapshot(self.cluster)), flush=True)

    def metrics(self) -> dict:
        """Episode metrics so far (final once the episode has terminated)."""
        self._require_reset("metrics()")
        c = self.cluster
        m = episode_metrics(c.table)
        m["unfinished"] = c.table.n - m["completed"] - m["rejected"]
        m.update(prefix_cache_metrics(c.engines))
        m["guidance_episode"] = self.guidance_episode
        return m

    # -------------------------------------------------------------- internals
    def _transition(self, position: int | None, instance: int):
        c = self.cluster
        if c is None:
            raise RuntimeError("step() before reset()")
        k_start = self._k
        h = 0.0
        if self._guided and c.queue:
            if self._teacher is None and position is not None:   # the mixing estimator (inline)
                rid = c.queue[position]
                tb = c.table
                if self._mixing_h is not None:   # compiled: the same arithmetic
                    h = self._mixing_h(c.engines, tb.prompt[rid], tb.pred[rid], instance)
                else:
                    h = guidance_term([e.committed_tokens for e in c.engines], tb.prompt[rid],
                                      tb.pred[rid], instance, self._reward_cfg)
            else:
                h = self._guidance(position, instance)
        if position is not None:
            c.route(instance, position)
        elif c.queue:
            self._defers += 1
        pen = comp = met = 0.0
        if position is None or self._one_per_interval:
            p, n, nm = self._tick()      # the step's first interval: weight 1
            pen += p
            comp += n
            met += nm
        if self._batched_grid:   # _advance_until_decision's batched path, inline
            p, self._k, count, n, nm = skip_to_decision(c, self._k, self._dt, k_start, self._g)
            self._finished_seen += count
            if self._slo_reward:
                self._met_seen = c.n_slo_met
                met += nm
        else:
            p, n, _, nm = self._advance_until_decision(k_start)
            met += nm
        pen += p
        comp += n
        penalty = -self._pen_unit * pen
        completion = self._completion_reward * comp
        guidance = self._w * h
        slo = self._slo_weight * met
        reward = penalty + completion + guidance + slo
        dt = (self._k - k_start) * self._dt
        discount = (self._g ** (self._k - k_start) if self._semi_mdp else self._gamma) * self._lambda
        terminated = c.all_arrived and not c.queue and c.done
        obs = self._observe()
        info = self._info(penalty, completion, guidance, dt, discount, slo)
        if terminated:
            self._episode_ended = True
            info["metrics"] = self.metrics()
        if self.render_mode == "human":
            self._render_human()
        return obs, float(reward), terminated, False, info

    def _guidance(self, position: int | None, instance: int) -> float:
        """h: how much worse the agent's choice is than the teacher's (<= 0)."""
        c, rc = self.cluster, self.cfg.reward
        if self._teacher is None:   # the paper's mixing estimator: an opinion on routes only
            if position is None:
                return -rc.mismatch_penalty
            rid = c.queue[position]
            tb = c.table
            return guidance_term([e.committed_tokens for e in c.engines], tb.prompt[rid],
                                 tb.pred[rid], instance, rc)
        choice = decide(c, self._teacher)
        if choice is None:
            return 0.0 if position is None else -rc.mismatch_penalty
        if position is None:
            return -rc.mismatch_penalty
        pos_t, inst_t = choice
        same = inst_t == instance and (pos_t == position or c.queue[pos_t] == c.queue[position])
        return 0.0 if same else -rc.mismatch_penalty

    def _observe(self):
        """The observation now. Also fixes the candidates and the action mask: they change
        only here (at a reset or a step's end), so ``step`` and ``action_masks`` read them."""
        if self._head_only:
            q = self.cluster.queue
            cands = (q[0],) if q else ()
        else:
            cands = self._candidates()
        self._cands = cands
        n = len(cands)
        defer_ok = True   # with no candidate only defer is valid
        if n:
            if self._mask_idle_defer:   # requests wait on an idle cluster: no defer
                if self._all_idle is not None:
                    defer_ok = not self._all_idle(self.cluster.engines)
                else:
                    for e in self.cluster.engines:
                        if not e.idle():
                            break
                    else:
                        defer_ok = False
            if defer_ok and self._guarded and self._defer_budget_spent():
                defer_ok = False
        mask = self._masks.get(2 * n + defer_ok)
        self._mask = mask if mask is not None else self._mask_of(n, defer_ok)
        if n and self._room_rule is not None:
            self._mask_without_room(cands, defer_ok)
        # What step checks an action against (a tuple indexes faster than an array).
        self._valid_routes, self._defer_ok = n * self.m, defer_ok
        return self._obs_fn(self.cluster, cands)

    def _candidates(self) -> tuple[int, ...]:
        """The request ids the agent may route now (``ActionConfig``)."""
        q = self.cluster.queue
        if not q:
            return ()
        if self._head_only:
            return (q[0],)
        act = self.cfg.action
        k = self.k
        if act.order == "oldest":    # the queue is in arrival order
            return tuple(itertools.islice(q, k))
        out: list[int] = []
        if act.max_wait_s is not None:   # starvation bound: overdue requests first, oldest first
            tb, t, cap = self.cluster.table, self.cluster.t, act.max_wait_s
            for r in q:
                if len(out) == k or t - tb.arrival_s[r] <= cap:
                    break
                out.append(r)
            if len(out) == k:
                return tuple(out)
        if act.order == "scored":
            w = act.order_weights or {}
            key = order_key(self.cluster.table, self.cluster.t, w.get("age_per_s", 0.0),
                            w.get("prompt_weight", 0.0), w.get("late_penalty", 0.0))
        else:
            inv = self.cluster.table.inv_ideal
            key = lambda r: (inv[r], -r)   # noqa: E731
        skip = set(out)
        rest = heapq.nlargest(k - len(out) + len(skip), q, key=key)
        out += [r for r in rest if r not in skip][:k - len(out)]
        return tuple(out)

    def _tick(self) -> tuple[float, int, int]:
        """Advance one decision interval; return (in-system penalty at its end, completions,
        completions within their SLO deadlines: counted only for the slo reward)."""
        self._k += 1
        pen, fin = self.cluster.tick(self._k * self._dt)
        done = fin - self._finished_seen
        self._finished_seen = fin
        met = 0
        if self._slo_reward and done:
            n = self.cluster.n_slo_met
            met = n - self._met_seen
            self._met_seen = n
        return pen, done, met

    def _advance_until_decision(self, k_start: int) -> tuple[float, float, int, float]:
        """Fast-forward while the router queue is empty; drain the cluster after the last arrival.

        Returns (penalty, completions), each summed over the grid points passed with the
        weight g**(j - k_start - 1) of point j (g = 1 per-step: plain sums; semi-MDP: the
        discount of one interval, so the step's reward is its exact discounted sum), the
        plain completion count, and the completions within their SLO deadlines weighted the
        same way (only with the slo reward; 0 otherwise). Equivalent to one ``_tick`` per
        decision interval (``_batched_grid=False`` does exactly that; a test holds the two equal), but each
        instance sums its own penalties over the skipped grid points in one call.
        """
        c = self.cluster
        g = self._g
        pen = comp = met = 0.0
        count = 0
        if not self._batched_grid:
            while not c.queue:
                if c.all_arrived:
                    if c.done:
                        break
                elif all(e.idle() for e in c.engines):
                    k = next_decision_index(c, self._k, self._dt) - 1
                    if k > self._k:
                        self._k = k
                        c.advance_to(k * self._dt)
                p, n, nm = self._tick()
                w = g ** (self._k - k_start - 1)
                pen += w * p
                comp += w * n
                met += w * nm
                count += n
            return pen, comp, count, met
        pen, self._k, count, comp, met = skip_to_decision(c, self._k, self._dt, k_start, g)
        self._finished_seen += count
        if self._slo_reward:
            self._met_seen = c.n_slo_met   # run_grid weighs them; _tick counts from here
        else:
            met = 0.0
        return pen, comp, count, met

    def _info(self, penalty: float, completion: float, guidance: float, dt: float,
              discount: float, slo: float = 0.0) -> dict:
        c = self.cluster
        return {
            "time_s": c.t,
            "queue_len": len(c.queue),
            "action_mask": self._mask.copy(),
            "reward_components": {"penalty": penalty, "completion": completion, "guidance": guidance,
                                  "slo": slo},
            "guidance_weight": self._w,
            "dt_s": dt,
            "discount": discount,
        }
