"""Sim-to-real's simulated side: the replays of a run through the simulator configured as its
llama.cpp servers (``serve/llamacpp_sim.py``), each under the contention models from that
replay's readings, judged against the served figures (``experiments/sim_to_real.py`` runs the
servers; ``--rejudge`` feeds a stored run's served figures through :func:`judge` again).

Why apart from the replay: the served side of a run costs an hour of a quiet machine, the
simulated side seconds; everything here needs no server, so a stored run can be judged again
by a later simulator."""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from llm_lb_gym.calibration.calibrate import rounded
from llm_lb_gym.experiments._cli_args import key_values
from llm_lb_gym.experiments._llamacpp_profile import (
    FOOTINGS, check_reference_s, fit, frontend_delay_s, probe_reference_s, read_points, read_rows, wake_points)
from llm_lb_gym.experiments._sim_to_real_tables import (
    _speed_label, arrival_split, arrival_states, contention_table, correction_check, decision_agreement, paired_table,
    table, verdict)


DEFAULT_WORKLOAD_OPTIONS = ("length_scale=0.2", "max_prompt_tokens=200")


DECISION_INTERVAL_S = 0.02
"""The holding routers' decision period, served and simulated alike."""


def sample(args, rate: float, slot_tokens: int):
    from llm_lb_gym.workload import make_workload

    opts = {"max_context_tokens": slot_tokens, "rate_rps": rate}
    opts.update(key_values(args.workload_option if args.workload_option is not None else DEFAULT_WORKLOAD_OPTIONS, "sim_to_real: -w"))
    return make_workload(args.workload, **opts).sample(np.random.default_rng(args.seed), args.requests)


def replace_seed(args, seed: int):
    out = argparse.Namespace(**vars(args))
    out.seed = seed
    return out


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
                  + f"; footing {footing}; contention {args.contention} (the \"(sim)\" rows)", ""]
    return dict(engines=engines, footing=footing, probe_ref=probe_ref, check_ref=check_ref, slot=slot, preset=preset,
                lines=lines, package=__version__)


def with_served_path(sims: dict, path: dict | None) -> dict:
    """``sims`` (:func:`_simulators`) with every simulated engine's frontend delay set to the
    served path's (``sim_to_real.served_path``, measured before the replays: ``router_s``, a lone
    replayed request's first token beyond the server's own prompt time, through the router), and
    said in the header; ``path`` None (not measured, or a run stored before 2026-12-07): ``sims``
    itself, so those runs simulate bit for bit as before. A delay measured below zero (clock
    noise) counts as none; an engine without a frontend (``--frontend none``) gets one of this
    delay alone (the path is not the server's: it is there whatever the server's model).

    Why replace the profile's delay rather than add the router's hop to it: the profile measures
    the server's delay with its own client, straight, at another time (2.2 ms on 2026-12-07);
    the replays' requests go through a router process and the load generator's client (3.1 ms
    straight with that client, 3.9 ms through the router, before that day's stored run). The delay a
    replayed request pays is the one measured on its own path, minutes before; a lone request's
    first token carries it whole, as the frontend's ``delay_s`` is carried (a latency that takes
    no server CPU). The profile's wake-up points stay as they are."""
    if path is None:
        return sims
    from llm_lb_gym.sim.frontend import FrontendModel

    d = max(float(path["router_s"]), 0.0)
    engines = {f: replace(e, frontend=replace(e.frontend or FrontendModel(), delay_s=d))
               for f, e in sims["engines"].items()}
    line = (f"served path's delay {d * 1e3:.2f} ms (the simulated frontend's delay_s: a lone request's first token "
            f"beyond the server's prompt time through the router, measured before the replays; "
            f"{path['direct_s'] * 1e3:.2f} ms straight to a server, so the router's hop {path['hop_s'] * 1e3:+.2f} ms; "
            f"medians of {path['requests']})")
    return dict(sims, engines=engines, lines=sims["lines"][:-1] + [line, ""])


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
        kept = out / "profile.csv"
        if not (kept.exists() and kept.samefile(path)):
            # Kept beside the summary: the run is judged with this profile, whatever becomes of the file.
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, kept)
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


def write_served(out: Path, per_rate: dict, rows: list[dict], run: dict) -> None:
    """The served side of a run (``summary.json`` with the replays' served figures and readings
    and the run record; ``results.csv``), before anything is simulated: :func:`judge` overwrites
    both, and a run whose simulation fails can be judged with ``--rejudge OUT``."""
    out.mkdir(parents=True, exist_ok=True)
    served = {"repeats": {str(rate): reps for rate, reps in per_rate.items()}, "run": run}
    (out / "summary.json").write_text(json.dumps(served, indent=1, default=float))
    _write_rows(out, rows)


def _write_rows(out: Path, rows: list[dict]) -> None:
    """``results.csv``: every request of every replay (none: nothing written)."""
    if rows:
        with open(out / "results.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


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
                                   sim_prompt_s=float(tb.first_token_s[i] - tb.first_scheduled_s[i]),
                                   sim_instance=int(tb.instance[i]), arrival_state=states[i])
            if args.repeats == 1:
                lines += table(summary, routers, rate, _speed_label(common, sims["footing"], args.contention))
            per_repeat.append(summary)
        paired, pairs = paired_table(per_repeat, routers, rate)
        lines += paired + contention_table(per_repeat, routers)
        report[str(rate)] = per_repeat[0]
        report.setdefault("repeats", {})[str(rate)] = per_repeat
        report.setdefault("ranking", {})[str(rate)] = pairs
    target_lines, report["verdict"] = verdict(report["repeats"], routers)
    lines += target_lines
    if rows and not args.no_stream:
        lines += arrival_split(rows, routers)
    decision_lines, decisions = decision_agreement(rows, routers)
    if decisions:
        lines += decision_lines
        report["decisions"] = decisions
    if rows and sims["footing"] == "check":
        check_lines, report["correction"] = correction_check(rows, report["repeats"])
        lines += check_lines
    report["run"] = run
    out.mkdir(parents=True, exist_ok=True)
    _write_rows(out, rows)   # now with the simulated columns
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(report, indent=1, default=float))
    print(text)
    return report
