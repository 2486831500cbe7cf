"""Speed and memory of the simulator and of LLMCluster-v0, as printed figures.

    python -m experiments.bench            # both parts
    python -m experiments.bench sim        # 20,000 requests, 4 instances, near capacity
    python -m experiments.bench env        # env steps/s on the default config
    LLM_LB_GYM_PURE_PYTHON=1 python -m experiments.bench env   # the same without the compiled engine
    python -m experiments.bench prefix     # both with engine.enable_prefix_caching on
    python -m experiments.bench mixed      # both on a mixed cluster (2 x A100 + 2 x V100)
    python -m experiments.bench learner    # Double DQN training speed on the learned router

Prefix caching (``prefix``): the multi-turn ``conversation`` workload (hash blocks of 16
tokens) on 4 instances with ``engine.enable_prefix_caching``, routed round robin on arrival
(simulator), and env episodes of it with the ``cached_prefix`` observation feature.

Simulator: conversation lengths of the Azure LLM 2023 conversation trace (a synthetic lognormal
with its means, 1,155 prompt / 211 output tokens, when ../shared/data is absent; contexts
clipped to 4,096) with Poisson arrivals at 5 req/s, near what 4 x Llama-2-7B on V100 sustain
(package 0.2: throughput keeps up with a ~23 s mean queue wait and ~650 preemptions), routed
round robin on arrival. Memory: tracemalloc peak of a run
per request, at two sizes, to show it is flat in the number of requests.
Env: whole episodes (reset included) of the default ``LLMCluster-v0`` with round-robin and
uniformly random actions (``gym.make`` wrappers included). Steps per second are reported per
wall second and per CPU second of this process: on a shared machine the CPU figure is the
stable one (wall time also counts waiting for the core). The engine implementation (compiled
Cython build or pure Python, see llm_lb_gym/sim/_compiled.py) and the load average are printed.
Learner (``learner``, not part of ``all``): env steps per second of Double DQN training on
``experiment=[v100_near_capacity,learned_router]`` next to the env's own, and where the training
time goes (experiments/bench_learner.py says what is timed).
Mixed (part of ``all``): the same two measurements on 2 x Llama-2-7B A100 + 2 x V100
(``MIXED_INSTANCES``), the simulator at ``--mixed-rate`` (default 5 req/s, as for 4 x V100: round
robin on arrival gives each V100 the same load as there, the A100s run lighter), no memory part.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import time
import tracemalloc

import numpy as np

from experiments._hydra import compose, env_kwargs

MIXED_INSTANCES = ({"preset": "llama2-7b-a100", "count": 2}, {"preset": "llama2-7b-v100", "count": 2})


def _batch(n: int, rate: float, seed: int):
    from llm_lb_gym.workload.batch import RequestBatch
    from llm_lb_gym.workload.registry import make_workload

    try:
        return make_workload("azure_conv", rate_rps=rate, max_context_tokens=4096).sample(
            np.random.default_rng(seed), n), "azure_conv lengths"
    except Exception as exc:   # data absent: same means, lognormal
        rng = np.random.default_rng(seed)
        arr = np.cumsum(rng.exponential(1 / rate, n))
        p = np.clip(rng.lognormal(np.log(1155) - 0.5, 1.0, n), 1, 3500).astype(int)
        d = np.clip(rng.lognormal(np.log(211) - 0.5, 1.0, n), 1, 4096 - 3500).astype(int)
        return RequestBatch.from_arrays(arr, p, d), f"synthetic lognormal ({type(exc).__name__})"


def bench_sim(n: int, rate: float, seed: int = 0, instances=None, memory: bool = True) -> dict:
    from llm_lb_gym.sim.config import ClusterConfig
    from llm_lb_gym.sim.metrics import episode_metrics
    from llm_lb_gym.sim.simulate import simulate

    batch, source = _batch(n, rate, seed)
    cluster_cfg = ClusterConfig(instances=instances)
    out = {"cluster": cluster_cfg.describe(), "requests": n, "rate_rps": rate, "workload": source}
    for fast in (True, False):
        best = None
        for _ in range(2 if fast else 1):
            t0 = time.perf_counter()
            cluster = simulate(batch, ClusterConfig(fast=fast, instances=instances))
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        key = "fast" if fast else "reference"
        out[f"{key}_wall_s"] = best
        out[f"{key}_requests_per_s"] = n / best
        if fast:
            m = episode_metrics(cluster.table)
            out.update({k: m[k] for k in ("completed", "rejected", "mean_e2e_s", "p99_e2e_s",
                                           "mean_queue_wait_s", "preemptions", "throughput_rps")})
            out["iterations"] = sum(e.n_iterations for e in cluster.engines)
    for size in (n // 4, n) if memory else ():
        small, _ = _batch(size, rate, seed)
        tracemalloc.start()
        simulate(small, ClusterConfig(num_instances=4))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out[f"tracemalloc_peak_bytes_per_request_at_{size}"] = peak / size
    out["max_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def bench_env(episodes: int, seed: int = 0, policies: tuple[str, ...] = ("round_robin", "random"),
              **options) -> dict:
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401

    env = gym.make("LLMCluster-v0", **options)
    m = env.unwrapped.m
    env.reset(seed=seed)   # warm-up (imports, first allocations)
    out = {}
    for policy in policies:
        # Random actions drawn up front: a numpy draw per step (~2 us) would be timed as env cost.
        actions = np.random.default_rng(seed).integers(m + 1, size=1 << 16).tolist()
        steps, t_steps, c_steps = 0, 0.0, 0.0
        per_episode = []   # CPU steps/s of each episode (reset excluded)
        t0, c0 = time.perf_counter(), time.process_time()
        for ep in range(episodes):
            env.reset(seed=seed + ep)
            i, term, trunc = 0, False, False
            ts, cs = time.perf_counter(), time.process_time()
            while not (term or trunc):
                a = i % m if policy == "round_robin" else actions[i & 0xFFFF]
                _, _, term, trunc, _ = env.step(a)
                i += 1
            t_steps += time.perf_counter() - ts
            c_ep = time.process_time() - cs
            c_steps += c_ep
            per_episode.append(i / c_ep)
            steps += i
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out[f"{policy}_steps_per_wall_s"] = steps / wall
        out[f"{policy}_steps_per_cpu_s"] = steps / cpu
        out[f"{policy}_steps_per_cpu_s_excluding_reset"] = steps / c_steps
        out[f"{policy}_steps_per_wall_s_excluding_reset"] = steps / t_steps
        out[f"{policy}_steps_per_cpu_s_median_episode"] = float(np.median(per_episode))
        out[f"{policy}_steps_per_cpu_s_best_episode"] = max(per_episode)
        out[f"{policy}_steps_per_episode"] = steps / episodes
    return out


def bench_prefix(n: int, episodes: int, rate: float = 6.0, seed: int = 0) -> dict:
    """Simulator and env speed with prefix caching on (a workload with shared prefixes)."""
    import gymnasium as gym

    import llm_lb_gym  # noqa: F401
    from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
    from llm_lb_gym.sim.metrics import prefix_cache_metrics
    from llm_lb_gym.sim.simulate import simulate
    from llm_lb_gym.workload.registry import make_workload

    batch = make_workload("conversation", rate_rps=rate).sample(np.random.default_rng(seed), n)
    out = {"requests": n, "workload": f"conversation, Poisson {rate:g} req/s"}
    for pc in (False, True):
        cfg = ClusterConfig(num_instances=4, engine=EngineConfig(enable_prefix_caching=pc))
        best = math.inf
        for _ in range(2):
            t0 = time.perf_counter()
            cluster = simulate(batch, cfg)
            best = min(best, time.perf_counter() - t0)
        key = "on" if pc else "off"
        out[f"sim_requests_per_s_caching_{key}"] = n / best
        out[f"prefix_hit_rate_caching_{key}"] = prefix_cache_metrics(cluster.engines)["prefix_hit_rate"]
    env = gym.make("LLMCluster-v0", workload="conversation", arrival_rate_rps=rate,
                   engine={"enable_prefix_caching": True}, obs={"features": ["cached_prefix"]})
    m = env.unwrapped.m
    env.reset(seed=seed)
    steps, c0 = 0, time.process_time()
    for ep in range(episodes):
        env.reset(seed=seed + ep)
        i, term, trunc = 0, False, False
        while not (term or trunc):
            _, _, term, trunc, _ = env.step(i % m)
            i += 1
        steps += i
    out["env_round_robin_steps_per_cpu_s_caching_on"] = steps / (time.process_time() - c0)
    return out


def env_speed(episodes: int = 1, seed: int = 0) -> dict:
    """The env's own steps per second on the learned router's options (round-robin actions):
    the env's share of ``bench learner``'s training loop, measured on the same options."""
    from experiments.bench_learner import EXPERIMENT   # needs the rl extra

    kw = env_kwargs(compose("train", [EXPERIMENT]))
    r = bench_env(episodes, seed=seed, policies=("round_robin",), **kw)
    return {k: v for k, v in r.items() if k.startswith("round_robin_steps_per")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", choices=("all", "sim", "env", "prefix", "mixed", "learner"), default="all")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=5.0, help="Poisson arrival rate (req/s)")
    ap.add_argument("--episodes", type=int, default=3, help="env episodes per policy")
    ap.add_argument("--learner-steps", type=int, default=3000,
                    help="timed env steps of training (learner), after --learner-warmup")
    ap.add_argument("--learner-warmup", type=int, default=500, help="env steps of training before timing")
    ap.add_argument("--learner-overrides", nargs="*", default=[],
                    help="Hydra overrides on the learned-router config (learner), e.g. agent.kwargs.batch_size=64")
    ap.add_argument("--mixed-rate", type=float, default=5.0,
                    help="Poisson rate (req/s) of the mixed-cluster simulator run")
    args = ap.parse_args(argv)
    from llm_lb_gym.sim._compiled import implementation

    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, one process, "
          f"engine: {implementation()}, load average (1 min) at start: {os.getloadavg()[0]:.2f}")
    if args.part in ("all", "sim"):
        r = bench_sim(args.requests, args.rate)
        print("\n## simulator")
        for k, v in r.items():
            print(f"{k}: {v:,.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.part in ("all", "env"):
        r = bench_env(args.episodes)
        print("\n## LLMCluster-v0 (default config)")
        for k, v in r.items():
            print(f"{k}: {v:,.1f}")
    if args.part == "learner":
        from llm_lb_gym import __version__
        from experiments.bench_learner import bench_learner   # needs the rl extra

        print(f"llm_lb_gym {__version__}")
        r = bench_learner(args.learner_steps, args.learner_warmup, overrides=tuple(args.learner_overrides))
        print("\n## Double DQN training, learned router")
        for k, v in r.items():
            print(f"{k}: {v:,.1f}" if isinstance(v, float) else f"{k}: {v}")
        print("\n## LLMCluster-v0 alone, same options (round-robin actions)")
        for k, v in env_speed().items():
            print(f"{k}: {v:,.1f}")
    if args.part == "prefix":
        r = bench_prefix(args.requests, args.episodes)
        print("\n## prefix caching")
        for k, v in r.items():
            print(f"{k}: {v:,.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.part in ("all", "mixed"):
        r = bench_sim(args.requests, args.mixed_rate, instances=MIXED_INSTANCES, memory=False)
        print("\n## simulator, mixed cluster")
        for k, v in r.items():
            print(f"{k}: {v:,.3f}" if isinstance(v, float) else f"{k}: {v}")
        r = bench_env(args.episodes, instances=MIXED_INSTANCES)
        print("\n## LLMCluster-v0, mixed cluster (2 x llama2-7b-a100 + 2 x llama2-7b-v100, default options)")
        for k, v in r.items():
            print(f"{k}: {v:,.1f}")


if __name__ == "__main__":
    main()
