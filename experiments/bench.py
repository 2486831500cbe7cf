"""Speed and memory of the simulator and of LLMCluster-v0, as printed figures.

    python -m llm_lb_gym.experiments.bench            # both parts
    python -m llm_lb_gym.experiments.bench sim        # 20,000 requests, 4 instances, near capacity
    python -m llm_lb_gym.experiments.bench env        # env steps/s on the default config
    LLM_LB_GYM_PURE_PYTHON=1 python -m llm_lb_gym.experiments.bench env   # the same without the compiled engine
    python -m llm_lb_gym.experiments.bench prefix     # both with engine.enable_prefix_caching on
    python -m llm_lb_gym.experiments.bench mixed      # both on a mixed cluster (2 x A100 + 2 x V100)
    python -m llm_lb_gym.experiments.bench learner    # Double DQN training speed on the learned router
    python -m llm_lb_gym.experiments.bench env --save-baseline   # make these figures the saved baseline
    python -m llm_lb_gym.experiments.bench pair --against ../old  # env step here vs another checkout, alternating

Baseline: every run prints each speed figure's ratio to the one saved in
``experiments/bench_baseline.json`` (committed; per part, labelled with the package version, the
date, the command and the machine: CPU model, cores, Python, engine implementation, load
average) and flags REGRESSION where a figure is more than ``--tolerance`` (15%) slower, so a
change that slows the simulator or the env shows here, not by accident. Ratios > 1 are faster.
Behaviour figures (completions, latencies, steps per episode) are compared for equality: a
difference there means the dynamics changed, and the speed ratio compares different work.
``--save-baseline`` stores the parts just run (the others are kept); do it when a version is
released, on a quiet machine (this host's speed swings by up to 2x with other load: compare
figures taken in one sitting, and read the load average printed with both).

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
Pair (``pair --against DIR``, not part of ``all``): the default env's round-robin step, this
checkout against another one (``git worktree add ../old <commit>``, its engine built with
``python setup.py build_ext --inplace``) in one sitting: one long-lived process per checkout,
episodes alternating between them (A B B A A B ...), CPU microseconds per step per episode;
prints each side's median, spread, and the median of the per-pair ratios, which stays
meaningful while the host's speed drifts (the figures of separate runs here differ by up to 2x).
Learner (``learner``, not part of ``all``): env steps per second of Double DQN training on
``experiment=[v100_near_capacity,learned_router]`` next to the env's own, and where the training
time goes (experiments/bench_learner.py says what is timed).
Mixed (part of ``all``): the same two measurements on 2 x Llama-2-7B A100 + 2 x V100
(``MIXED_INSTANCES``), the simulator at ``--mixed-rate`` (default 5 req/s, as for 4 x V100: round
robin on arrival gives each V100 the same load as there, the A100s run lighter), no memory part.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._hydra import compose, env_kwargs

MIXED_INSTANCES = ({"preset": "llama2-7b-a100", "count": 2}, {"preset": "llama2-7b-v100", "count": 2})
BASELINE_PATH = Path(__file__).with_name("bench_baseline.json")
TOLERANCE = 0.15
"""A speed figure more than 15% slower than the baseline's is flagged (the host's own swings
within one sitting stay under about 10% on CPU-time figures; across sittings they reach 2x)."""


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
        out[f"{policy}_cpu_us_per_step"] = 1e6 * c_steps / steps
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
    from llm_lb_gym.experiments.bench_learner import EXPERIMENT   # needs the rl extra

    kw = env_kwargs(compose("train", [EXPERIMENT]))
    r = bench_env(episodes, seed=seed, policies=("round_robin",), **kw)
    return {k: v for k, v in r.items() if k.startswith("round_robin_steps_per")}


PAIR_WORKER = r"""
import sys, time
import gymnasium as gym
import llm_lb_gym
from llm_lb_gym.sim._compiled import implementation
env = gym.make("LLMCluster-v0")
m = env.unwrapped.m
env.reset(seed=0)
print(llm_lb_gym.__file__, getattr(llm_lb_gym, "__version__", "?"), implementation(), flush=True)
for line in sys.stdin:
    env.reset(seed=int(line))
    i, term, trunc = 0, False, False
    c0 = time.process_time()
    while not (term or trunc):
        _, _, term, trunc, _ = env.step(i % m)
        i += 1
    print(1e6 * (time.process_time() - c0) / i, flush=True)
"""


def bench_pair(other: Path, rounds: int, seeds: int = 3) -> dict:
    """The default env's round-robin step here and in checkout ``other``, alternating episodes
    between two long-lived processes (``PAIR_WORKER``; each imports its own checkout). Returns
    per side the median CPU us/step, its quartiles, and the median of per-pair ratios."""
    import statistics
    import subprocess
    import tempfile

    here = Path(__file__).resolve().parents[1]
    sides = {"this": here, "other": Path(other).resolve()}
    procs, out = {}, {}
    with tempfile.TemporaryDirectory() as cwd:   # no checkout on the path but the side's own
        try:
            for name, root in sides.items():
                env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
                p = subprocess.Popen([sys.executable, "-c", PAIR_WORKER], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                procs[name] = p
                path, version, impl = p.stdout.readline().split()
                out[f"{name}_package"] = f"{version} ({path.rsplit('/llm_lb_gym/', 1)[0]}, engine {impl})"
            times = {name: [] for name in sides}
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(sides)[::-1]
                for name in order:
                    procs[name].stdin.write(f"{r % seeds}\n")
                    procs[name].stdin.flush()
                    times[name].append(float(procs[name].stdout.readline()))
        finally:
            for p in procs.values():
                p.stdin.close()
                p.wait()
    for name, v in times.items():
        q = statistics.quantiles(v, n=4)
        out[f"{name}_cpu_us_per_step_median"] = statistics.median(v)
        out[f"{name}_cpu_us_per_step_quartiles"] = f"{q[0]:.2f}-{q[2]:.2f}"
    ratios = [o / h for h, o in zip(times["this"], times["other"])]
    out["speed_ratio_this_vs_other_median_of_pairs"] = statistics.median(ratios)
    q = statistics.quantiles(ratios, n=4)
    out["speed_ratio_quartiles"] = f"{q[0]:.3f}-{q[2]:.3f}"
    out["episodes_per_side"] = rounds
    return out


def machine_facts() -> dict:
    """What a figure depends on besides the code: printed with every run, saved with a baseline."""
    from llm_lb_gym.sim._compiled import implementation

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "system": platform.system(), "engine": implementation(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "load_average_1min_at_start": round(os.getloadavg()[0], 2)}


def direction(key: str) -> int:
    """+1: a rate (higher is faster), -1: a time or a memory size (lower is better), 0: a
    behaviour figure (what was simulated, not how fast)."""
    if re.search(r"_per_(s|cpu_s|wall_s)(_|$)", key):   # requests_per_s, steps_per_cpu_s_...
        return 1
    if key.endswith(("_wall_s", "_us_per_step")) or "bytes_per_request" in key or key == "max_rss_mib":
        return -1
    return 0


def compare(figures: dict, base: dict | None, tolerance: float) -> tuple[dict, list[str]]:
    """Per figure, its note against the baseline's; and the regressions (speed figures more than
    ``tolerance`` slower). Speed ratios are oriented so that > 1 means faster than the baseline.
    (A yardstick of the host's speed, a fixed Python loop timed around each part, was tried to
    factor out other load: on this shared host it swung more than the figures themselves.)"""
    notes, regressions = {}, []
    if not base:
        return notes, regressions
    old = base.get("figures", {})
    for k, v in figures.items():
        b = old.get(k)
        if b is None or isinstance(v, str) or isinstance(b, str):
            if b is not None and b != v:
                notes[k] = f"baseline {b}: differs"
            continue
        d = direction(k)
        if d == 0:
            if b != v and not (isinstance(v, float) and math.isclose(v, b, rel_tol=1e-9)):
                notes[k] = f"baseline {b:,.6g}: differs (the dynamics changed)"
            continue
        if not (v > 0 and b > 0):
            continue
        ratio = v / b if d > 0 else b / v
        flag = ""
        if ratio < 1.0 / (1.0 + tolerance):
            flag = f"  REGRESSION (more than {tolerance:.0%} slower)"
            regressions.append(f"{base['section']}: {k} {ratio:.2f}x")
        notes[k] = f"baseline {b:,.1f}: {ratio:.2f}x{flag}"
    return notes, regressions


def _fmt(v, digits: int) -> str:
    return f"{v:,.{digits}f}" if isinstance(v, float) else str(v)


class Report:
    """Prints each part's figures with their ratios to the saved baseline, and saves them."""

    def __init__(self, path: Path, tolerance: float, command: str, facts: dict):
        self.path, self.tolerance, self.command, self.facts = path, tolerance, command, facts
        self.saved = json.loads(path.read_text()) if path.exists() else {}
        self.parts: dict = {}
        self.regressions: list[str] = []

    def section(self, title: str, key: str, figures: dict, digits: int = 1) -> None:
        base = self.saved.get(key)
        notes, bad = compare(figures, dict(base, section=title) if base else None, self.tolerance)
        self.regressions += bad
        print(f"\n## {title}")
        for k, v in figures.items():
            note = notes.get(k)
            print(f"{k}: {_fmt(v, digits)}" + (f"   ({note})" if note else ""))
        self.parts[key] = figures

    def summary(self) -> None:
        from llm_lb_gym import __version__

        keys = [k for k in self.parts if k in self.saved]
        if not self.parts:
            return
        if not keys:
            print(f"\nno baseline for these parts in {self.path} (--save-baseline saves one)")
            return
        labels = {(self.saved[k]["package_version"], self.saved[k]["saved_utc"][:10],
                   self.saved[k]["machine"]["cpu"], self.saved[k]["machine"]["engine"],
                   self.saved[k]["machine"]["load_average_1min_at_start"]) for k in keys}
        print(f"\nbaseline ({self.path.name}): " + "; ".join(
            f"package {v} saved {d} on {cpu}, engine {eng}, load average {la}" for v, d, cpu, eng, la in labels)
            + f"; this run: package {__version__}")
        here = self.facts
        for k in keys:
            there = self.saved[k]["machine"]
            for fact in ("cpu", "engine", "cores"):
                if there.get(fact) != here[fact]:
                    print(f"note: {k} was saved with {fact}={there.get(fact)!r}, this run has "
                          f"{here[fact]!r}: the ratios compare different setups")
        if self.regressions:
            print(f"REGRESSIONS beyond {self.tolerance:.0%} (rerun in a quiet moment before believing "
                  "one: compare the load averages):\n  " + "\n  ".join(self.regressions))
        else:
            print(f"no speed figure more than {self.tolerance:.0%} slower than the baseline")

    def save(self) -> None:
        from llm_lb_gym import __version__

        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for key, figures in self.parts.items():
            self.saved[key] = {"package_version": __version__, "saved_utc": now,
                               "command": self.command, "machine": self.facts, "figures": figures}
        self.path.write_text(json.dumps(dict(sorted(self.saved.items())), indent=1) + "\n")
        print(f"\nsaved {', '.join(self.parts)} as the baseline in {self.path}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", nargs="?", choices=("all", "sim", "env", "prefix", "mixed", "learner", "pair"),
                    default="all")
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
    ap.add_argument("--baseline", type=Path, default=BASELINE_PATH,
                    help="saved figures to compare with (default: experiments/bench_baseline.json)")
    ap.add_argument("--save-baseline", action="store_true",
                    help="store this run's figures in --baseline (parts not run are kept)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE,
                    help="flag speed figures slower than the baseline by more than this share")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 on a flagged regression")
    ap.add_argument("--against", type=Path, help="pair: the other checkout (its engine built in place)")
    ap.add_argument("--rounds", type=int, default=24, help="pair: episodes per side")
    args = ap.parse_args(argv)
    from llm_lb_gym import __version__

    facts = machine_facts()
    print(f"llm_lb_gym {__version__}, python {facts['python']} on {facts['cpu']} ({facts['cores']} cores), "
          f"OMP_NUM_THREADS={facts['omp_num_threads']}, one process, engine: {facts['engine']}, "
          f"load average (1 min) at start: {facts['load_average_1min_at_start']:.2f}")
    command = "python -m llm_lb_gym.experiments.bench " + " ".join(sys.argv[1:] if argv is None else argv)
    rep = Report(args.baseline, args.tolerance, command.strip(), facts)
    if args.part in ("all", "sim"):
        rep.section("simulator", "simulator", bench_sim(args.requests, args.rate), digits=3)
    if args.part in ("all", "env"):
        rep.section("LLMCluster-v0 (default config)", "env", bench_env(args.episodes))
    if args.part == "learner":
        from llm_lb_gym.experiments.bench_learner import bench_learner   # needs the rl extra

        r = bench_learner(args.learner_steps, args.learner_warmup, overrides=tuple(args.learner_overrides))
        rep.section("Double DQN training, learned router", "learner", r)
        rep.section("LLMCluster-v0 alone, same options (round-robin actions)", "learner_env", env_speed())
    if args.part == "pair":
        if args.against is None:
            ap.error("pair needs --against DIR (another checkout of the repository)")
        print("\n## LLMCluster-v0 round-robin step, this checkout vs --against (alternating episodes)")
        for k, v in bench_pair(args.against, args.rounds).items():
            print(f"{k}: {_fmt(v, 3)}")
    if args.part == "prefix":
        rep.section("prefix caching", "prefix", bench_prefix(args.requests, args.episodes), digits=3)
    if args.part in ("all", "mixed"):
        rep.section("simulator, mixed cluster", "mixed_simulator",
                    bench_sim(args.requests, args.mixed_rate, instances=MIXED_INSTANCES, memory=False), digits=3)
        rep.section("LLMCluster-v0, mixed cluster (2 x llama2-7b-a100 + 2 x llama2-7b-v100, default options)",
                    "mixed_env", bench_env(args.episodes, instances=MIXED_INSTANCES))
    rep.summary()
    if args.save_baseline:
        rep.save()
    if args.strict and rep.regressions:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
