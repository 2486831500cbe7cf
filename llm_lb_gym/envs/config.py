"""Typed options of ``LLMCluster-v0``: everything ``gym.make`` accepts, validated.

Nested options may be given as dataclasses or as plain dicts (what Hydra and ``gym.make``
keywords produce); unknown keys raise an error listing the allowed ones, because a silently
ignored typo in an experiment config produces wrong numbers that look right.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from .._validate import (ConfigError, check_bool, check_choice, check_int, check_range,
                         reject_unknown)
from ..limits import (MAX_ARRIVAL_S, MAX_REQUESTS, MAX_TOKENS,
                      MIN_DECISION_INTERVAL_S, MIN_RATE_RPS)
from ..predictor.registry import DEFAULT_PREDICTOR
from ..routers.mixing import MixingParams
from ..sim.clock import DEFAULT_DECISION_INTERVAL_S
from ..sim.config import EngineConfig, resolve_instances
from ..sim.slo import SLOConfig

GUIDANCE_MODES = ("baseline", "workload_aware", "workload_guided")
DISCOUNTS = ("semi_mdp", "per_step")
PENALTIES = ("paper", "latency")
GUIDANCE_FORMS = ("weight", "hurl")
MIXING_TEACHER = "mixing"
ORDERS = ("oldest", "shortest", "scored")
MASKED = ("fallback", "as_taken")
KV_ROOM = ("full", "prompt")


def _build(cls, value, kind: str):
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    if not isinstance(value, dict):
        value = dict(value)   # OmegaConf DictConfig and other mappings
    reject_unknown(kind, value, [f.name for f in fields(cls)])
    return cls(**value)


@dataclass(frozen=True)
class RewardConfig:
    """r_t = -sum_j (1/T_j)(1 - f_jt) + completion_reward * completions_t + w_k * h_t, and the
    discount a learner applies to each transition (``info["discount"]``)."""

    mode: str = "workload_guided"
    """Guidance: baseline (w = 0), workload_aware (w = guidance_scale), workload_guided
    (w = guidance_scale * exp(-decay * k), k = training episodes so far)."""
    completion_reward: float = 60.0
    """r_w: reward per completed request (paper: 60)."""
    guidance_scale: float = 1.0
    """gamma: the guidance weight at episode 0 (and the constant weight of workload_aware). The
    paper gives none; training uses 10 (``conf/reward/workload_*.yaml`` say why)."""
    decay: float = 0.5
    """beta_d: per-episode decay of the guidance weight (paper: 0.5). Training uses 0.1
    (``conf/reward/workload_guided.yaml`` says why)."""
    penalty_scale: float = 1.0
    """Multiplier of the in-system penalty term."""
    penalty: str = "paper"
    """The in-system term. ``paper``: sum_j (1/T_j)(1 - f_jt) per decision interval (a
    slowdown-weighted count that fades as requests progress). ``latency``: the number of
    requests in the system times the interval in seconds, so the undiscounted penalty of an
    episode is minus the sum of its requests' end-to-end latencies (Little's law; exact on the
    decision grid): the return then means mean E2E, the metric routers are compared on."""
    mixing: MixingParams = field(default_factory=MixingParams)
    discount: str = "semi_mdp"
    """How a transition is discounted. ``semi_mdp`` (default): by gamma_s ** dt with dt the
    step's simulated duration and gamma_s = exp(-1 / horizon_s); a routing step that takes no
    simulated time is not discounted, and inside a step each decision interval's penalty and
    completions are discounted by their own time, so the return does not depend on how the
    timeline is cut into steps. ``per_step``: the paper's constant ``gamma`` per step, whatever
    its duration (a routing step and a 100 s drain alike)."""
    horizon_s: float = 30.0
    """semi_mdp: the discount's time constant in simulated seconds (gamma_s = exp(-1/horizon_s)):
    a routing decision's effect on latency lasts tens of seconds near capacity."""
    gamma: float = 0.99
    """per_step: the discount per step."""
    teacher: str = MIXING_TEACHER
    """Whose choices the guidance term h compares the agent's with: ``mixing`` (the paper's
    analytic mixing estimator: h = r_mix(chosen) - max_l r_mix(l) for a route) or any registered
    router name (h = 0 when the agent does what the router would, else -mismatch_penalty)."""
    teacher_options: dict = field(default_factory=dict)
    """Options of a router teacher (its registry keywords)."""
    mismatch_penalty: float = 1.0
    """h when the agent's choice differs from the teacher's in kind (it defers while the
    teacher routes or the reverse) or, for a router teacher, in request or instance."""
    slo_reward: float = 0.0
    """Reward per request that finishes within both its SLO deadlines (``env.slo``), given at
    the decision point where it finishes and discounted like the completion reward. With the
    in-system penalty and completion reward at 0 and no guidance, the undiscounted return is
    ``slo_reward`` x the requests meeting their SLO (``reward=slo``). There is no miss penalty
    at completion: discounted, it would pay a policy to finish a late request even later."""
    guidance_form: str = "weight"
    """``weight``: add w_k * h to the reward (the reading of the paper used so far).
    ``hurl``: HuRL's form (Cheng et al. 2021), workload_guided only: the same reshaped reward
    and the guided discount lambda_k * gamma with lambda_k = 1 - exp(-decay * k), so early
    training is short-sighted and the horizon grows back as the guidance fades."""

    def __post_init__(self) -> None:
        check_choice("reward.mode", self.mode, GUIDANCE_MODES)
        check_range("reward.completion_reward", self.completion_reward, 0.0)
        check_range("reward.guidance_scale", self.guidance_scale, 0.0)
        check_range("reward.decay", self.decay, 0.0)
        check_range("reward.penalty_scale", self.penalty_scale, 0.0)
        check_choice("reward.penalty", self.penalty, PENALTIES)
        object.__setattr__(self, "mixing", _build(MixingParams, self.mixing, "reward.mixing"))
        check_choice("reward.discount", self.discount, DISCOUNTS)
        check_range("reward.horizon_s", self.horizon_s, 0.0, lo_open=True)
        check_range("reward.gamma", self.gamma, 0.0, 1.0)
        if not isinstance(self.teacher, str):
            raise ConfigError(f"reward.teacher={self.teacher!r} must be 'mixing' or a router name")
        if self.teacher != MIXING_TEACHER:
            from ..routers.registry import ROUTERS, make_router, router_options

            check_choice("reward.teacher", self.teacher, (MIXING_TEACHER, *ROUTERS))
            if not isinstance(self.teacher_options or {}, Mapping):
                raise ConfigError(f"reward.teacher_options={self.teacher_options!r} must be a mapping "
                                  f"of router {self.teacher!r}'s options")
            opts = dict(self.teacher_options or {})
            reject_unknown(f"reward.teacher_options (router {self.teacher!r})", opts,
                           router_options(self.teacher))
            try:   # the values too, now, in every reward mode (the teacher is built at reset)
                make_router(self.teacher, **opts)
            except ConfigError as err:
                raise type(err)(f"reward.teacher_options: {err}") from None
        elif self.teacher_options:
            raise ConfigError("reward.teacher_options is for a router teacher; the mixing "
                              f"teacher takes reward.mixing instead (got {dict(self.teacher_options)})")
        object.__setattr__(self, "teacher_options", dict(self.teacher_options or {}))
        check_range("reward.mismatch_penalty", self.mismatch_penalty, 0.0)
        check_choice("reward.guidance_form", self.guidance_form, GUIDANCE_FORMS)
        check_range("reward.slo_reward", self.slo_reward, 0.0)
        if self.guidance_form == "hurl" and self.mode != "workload_guided":
            raise ConfigError(f"reward.guidance_form=hurl needs reward.mode=workload_guided (its "
                              f"discount grows back as the guidance decays); got mode={self.mode!r}")


@dataclass(frozen=True)
class ActionConfig:
    """Which queued requests the agent may route (``Discrete(k * m + 1)``)."""

    candidates: int = 1
    """k: the agent picks one of k queued requests and an instance (action j * m + i routes
    candidate j to instance i; k * m defers). 1 with ``order=oldest`` is the paper's head of
    line; k > 1 makes late-binding order (which request goes next) learnable."""
    order: str = "oldest"
    """Which queued requests are the candidates: ``oldest`` (arrival order), ``shortest``
    (smallest predicted ideal latency first, ties by arrival) or ``scored`` (scored_binding's
    order score with ``order_weights``: ``routers.scored_binding.order_key``)."""
    order_weights: Mapping[str, float] | None = None
    """With ``order=scored``: the score's weights (``age_per_s``, ``prompt_weight``,
    ``late_penalty``; missing ones 0, so all-zero weights give ``shortest``). Set them from the
    setting's ``eval.policy_options.scored_binding`` so the candidates follow the router's order."""
    max_wait_s: float | None = None
    """Starvation bound: requests waiting at the router longer than this become the first
    candidates, oldest first, whatever ``order`` says. None: no bound."""
    mask_idle_defer: bool = True
    """Mask defer while requests wait and every instance is idle: waiting then only delays,
    and a policy that defers forever at an episode's end would otherwise never finish."""
    masked: str = "fallback"
    """What ``step`` does with an action ``info["action_mask"]`` forbids (agents that ignore the
    mask, as most DQN code does). ``fallback``: route the oldest queued request as
    ``fallback_router`` would, so no agent can stall an episode (``defer_budget`` bounds
    defers). ``as_taken``: carry it out as given, as package 0.4 and the paper did: a masked
    defer waits one interval, a slot with no request is a no-op, ``defer_budget`` is ignored,
    and an agent that always defers never finishes."""
    fallback_router: str = "jsq"
    """The router (``llm_lb_gym.routers``) that decides a masked action under ``fallback``."""
    defer_budget: float | None = 1.0
    """Under ``fallback``, once the agent has taken a masked action in the episode (it ignores
    the mask): defer is masked while the episode's defers number at least this many per request
    arrived so far (1.0: a request is held one interval on average), so an always-defer agent
    takes at most twice round robin's steps. An agent that never takes a masked action never
    meets the budget (its episodes are exactly as under ``as_taken``); heuristic routers
    (``route_step``) never read the mask. None: no budget."""

    kv_room: str | None = None
    """Mask routing a candidate to an instance without KV room for it: ``late_binding``'s rule
    (``routers/late_binding.py``: the instance's free KV blocks minus what its not-yet-admitted
    requests will take must hold the candidate's need above the watermark, and a sequence slot
    must be free), the need counted as ``full`` (prompt + predicted decode: nothing preempts if
    predictions hold) or ``prompt`` (prompt only). Where no candidate fits anywhere, defer is the
    only valid action, so a mask-respecting agent (MaskablePPO) holds requests at the router
    exactly when the rule says there is no room, and learns the rest (which candidate, which
    instance, whether to hold anyway). A request larger than an empty instance's cache is capped
    at it, so an idle instance always fits and an episode always ends; where the rule would leave
    no valid action the plain mask is used. Under ``masked=fallback`` a route to an instance
    without room is a masked action (the fallback router decides); ``as_taken`` carries it out.
    None (default): routes are masked only for empty candidate slots."""
    hold_without_room_only: bool = False
    """With ``kv_room``: also mask defer while some candidate fits somewhere, so requests are
    held at the router exactly when the room rule says none fits (late binding with continuous
    release, ``late_binding``'s ``period_s=0``) and the agent chooses which candidate goes where.
    Every policy of this action space, a random one included, then holds as that rule does:
    report an agent beside the same action space's random policy."""

    def __post_init__(self) -> None:
        check_int("action.candidates", self.candidates, 1, 64)
        check_choice("action.order", self.order, ORDERS)
        if self.order_weights is not None:
            from ..routers.scored_binding import ORDER_WEIGHTS

            if self.order != "scored":
                raise ConfigError(f"action.order_weights is for action.order=scored; got order={self.order!r}")
            if not isinstance(self.order_weights, Mapping):
                raise ConfigError(f"action.order_weights={self.order_weights!r} must be a mapping "
                                  f"with keys among {', '.join(ORDER_WEIGHTS)}")
            weights = dict(self.order_weights)
            reject_unknown("action.order_weights", weights, tuple(ORDER_WEIGHTS))
            for name, value in weights.items():
                check_range(f"action.order_weights.{name}", value, *ORDER_WEIGHTS[name])
            object.__setattr__(self, "order_weights", {n: float(weights.get(n, 0.0)) for n in ORDER_WEIGHTS})
        if self.max_wait_s is not None:
            check_range("action.max_wait_s", self.max_wait_s, 0.0, lo_open=True)
        check_bool("action.mask_idle_defer", self.mask_idle_defer)
        check_choice("action.masked", self.masked, MASKED)
        from ..routers.registry import ROUTERS

        check_choice("action.fallback_router", self.fallback_router, ROUTERS)
        if self.defer_budget is not None:
            check_range("action.defer_budget", self.defer_budget, 0.0)
        check_choice("action.kv_room", self.kv_room, (None, *KV_ROOM))
        check_bool("action.hold_without_room_only", self.hold_without_room_only)
        if self.hold_without_room_only and self.kv_room is None:
            raise ConfigError("action.hold_without_room_only=True needs action.kv_room "
                              f"(allowed: {', '.join(KV_ROOM)}); got kv_room=None")


@dataclass(frozen=True)
class ObsConfig:
    """Observation layout options (see the env docstring for the index table)."""

    prompt_edges_tokens: tuple[int, ...] = (256, 2048)
    """Prompt buckets of the P matrix (paper's DQN: 0-256, 256-2048, >=2048)."""
    decode_edges_tokens: tuple[int, ...] = (256, 2048)
    """Predicted-decode buckets of the D matrix."""
    queue_cap: int = 512
    """Router queue length is capped here in the observation (paper: 4 x 128)."""
    normalize: bool = True
    """Scale features to about [0, 1] (counts / max_num_seqs, tokens / context length,
    queue / queue_cap, times / time_scale_s); False gives the paper's raw values."""
    time_scale_s: float = 10.0
    """Scale of the time features with ``normalize`` (seconds, in [1e-3, 1e6])."""
    round_decimals: int | None = None
    """Round capacity and completion estimate (paper: 2); None keeps full precision."""
    as_dict: bool = False
    """A Dict observation space instead of the flat Box."""
    features: tuple[str, ...] = ()
    """Extra features beyond the paper's (``observation.FEATURES``): ``arrivals_left``
    (global), ``age`` and ``block_need`` (per candidate request), ``free_kv_blocks``,
    ``waiting_blocks``, ``time_since_route``, ``cached_prefix`` (the head request's prompt
    tokens cached there, with ``engine.enable_prefix_caching``), ``speed`` and ``kv_size`` (per
    instance; a mixed cluster always adds the last two), and any per-instance feature registered
    with ``observation.register_instance_feature``."""

    def __post_init__(self) -> None:
        from .observation import feature_names

        feats = tuple(self.features or ())
        for f in feats:
            check_choice("obs.features[]", f, feature_names())
        if len(set(feats)) != len(feats):
            raise ConfigError(f"obs.features={list(feats)} lists a feature twice")
        object.__setattr__(self, "features", feats)
        for name in ("prompt_edges_tokens", "decode_edges_tokens"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
                raise ConfigError(f"obs.{name}={value!r} must be a sequence of token counts")
            edges = tuple(value)
            for i, x in enumerate(edges):
                check_int(f"obs.{name}[{i}]", x, 1, MAX_TOKENS)
            object.__setattr__(self, name, tuple(int(x) for x in edges))
        check_bool("obs.normalize", self.normalize)
        check_bool("obs.as_dict", self.as_dict)
        check_int("obs.queue_cap", self.queue_cap, 1)
        check_range("obs.time_scale_s", self.time_scale_s, 1e-3, 1e6)   # float32 Box bounds stay finite
        if self.round_decimals is not None:
            check_int("obs.round_decimals", self.round_decimals, 0, 12)


@dataclass(frozen=True)
class EnvConfig:
    """Every option of ``gym.make("LLMCluster-v0", **options)``. Defaults = the paper's main
    setting: 4 x Llama-2-7B on V100, FCFS, no chunking, 128 seqs, five-task mix, Poisson
    20 req/s, 2,000 requests, decisions every 0.02 s, workload-guided reward."""

    num_instances: int | None = None
    """Instances; None = 4, or the total count of ``instances`` when that is given."""
    num_requests: int = 2000
    arrival_rate_rps: float | None = 20.0
    """Poisson rate for workloads with synthetic arrivals; None keeps the workload's own."""
    workload: Any = "task_mix"
    """A workload name, a dict ``{name: ..., **options}``, or an object with ``sample``."""
    engine: Any = None
    """EngineConfig or its options as a dict (preset, scheduler, chunked_prefill, ...): every
    instance's engine, or with ``instances`` the defaults of its engine groups."""
    instances: Any = None
    """A mixed cluster: engine groups, each a dict of engine options plus ``count`` (e.g.
    ``[{"preset": "llama2-7b-a100", "count": 2}, {"preset": "llama2-7b-v100", "count": 2}]``);
    options a group leaves out come from ``engine``. Stored expanded, one ``EngineConfig`` per
    instance. None: ``num_instances`` copies of ``engine``."""
    predictor: Any = field(default_factory=lambda: dict(DEFAULT_PREDICTOR))
    """A predictor name, a dict ``{name: ..., **options}``, or a LengthPredictor. Default: the
    deployable ``predictor.registry.DEFAULT_PREDICTOR`` (noisy at the paper's 79%, calibrated);
    ``"oracle"`` is the clairvoyant reference (package 0.6.0 and before: the default)."""
    reward: Any = None
    obs: Any = None
    action: Any = None
    """ActionConfig or its options: candidates, order, max_wait_s, mask_idle_defer, masked,
    fallback_router, defer_budget, kv_room."""
    decision_interval_s: float = DEFAULT_DECISION_INTERVAL_S
    """Time between router decisions (paper: 0.02 s, the minimum decode batch time)."""
    one_action_per_interval: bool = False
    """Paper-faithful timing: every action, routing included, advances one interval. Default:
    routing keeps the clock so several queued requests can be routed at one decision time."""
    fast: bool = True
    """Closed-form decode stretches in the simulator (False: one iteration at a time)."""
    check_invariants: bool = False
    """Recompute simulator aggregates after every iteration and assert (slow; for tests)."""
    slo: Any = field(default_factory=SLOConfig)
    """Per-request TTFT and TBT deadlines (``SLOConfig`` or its options as a dict; None: no
    deadlines and no SLO metrics). Default: 5x the request's isolated prefill and decode step
    (``llm_lb_gym/sim/slo.py``). They change nothing in the simulation; they add SLO
    attainment and goodput to the metrics and enable ``reward.slo_reward``."""

    def __post_init__(self) -> None:
        check_int("num_requests", self.num_requests, 1, MAX_REQUESTS)
        if self.arrival_rate_rps is not None:
            check_range("arrival_rate_rps", self.arrival_rate_rps, MIN_RATE_RPS)
        check_range("decision_interval_s", self.decision_interval_s, MIN_DECISION_INTERVAL_S,
                    MAX_ARRIVAL_S)
        for name in ("one_action_per_interval", "fast", "check_invariants"):
            check_bool(name, getattr(self, name))
        object.__setattr__(self, "engine", _build(EngineConfig, self.engine, "engine"))
        m, engines = resolve_instances(self.num_instances, self.instances, self.engine, prefix="")
        object.__setattr__(self, "num_instances", m)
        object.__setattr__(self, "instances", engines)
        object.__setattr__(self, "reward", _build(RewardConfig, self.reward, "reward"))
        object.__setattr__(self, "obs", _build(ObsConfig, self.obs, "obs"))
        object.__setattr__(self, "action", _build(ActionConfig, self.action, "action"))
        object.__setattr__(self, "slo", SLOConfig.build(self.slo))
        if self.reward.slo_reward and self.slo is None:
            raise ConfigError(f"reward.slo_reward={self.reward.slo_reward} needs deadlines; "
                              "allowed: slo set (e.g. {ttft_multiple: 5, tbt_multiple: 5}) or "
                              "reward.slo_reward=0")


ENV_OPTIONS = tuple(f.name for f in fields(EnvConfig))
"""The keywords of ``gym.make("LLMCluster-v0", ...)`` besides Gymnasium's ``render_mode`` (the
env checks them, so an unknown one gets Python's wording and the allowed list)."""


def as_name_and_options(value, kind: str) -> tuple[str, dict]:
    """'name' or {'name': ..., **options} -> (name, options)."""
    if isinstance(value, str):
        return value, {}
    if value is not None and hasattr(value, "keys"):
        opts = dict(value)
        if "name" not in opts:
            raise ConfigError(f"{kind} options need a 'name' key; got keys {sorted(opts)}")
        return opts.pop("name"), opts
    raise ConfigError(f"{kind}={value!r} must be a name, a dict with 'name', or an object")
