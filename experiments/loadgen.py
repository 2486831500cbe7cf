"""Loadgen: replay one workload through the router service per router, paired, over HTTP.

    llm-lb-gym loadgen --routers round_robin,jsq,late_binding --sim-backends 4 --time-scale 4 \\
        --requests 200 -w rate_rps=10
    llm-lb-gym loadgen --url http://127.0.0.1:8000 --requests 100     # one running service
    llm-lb-gym loadgen --workload azure_conv --routers round_robin,scored_binding \
        --options-from v100_near_capacity --policy outputs/improve/RUN --requests 400   # a live A/B

With ``--sim-backends N`` each router gets a fresh stack on 127.0.0.1 (N simulated backends
and one router process, all child processes, stopped afterwards), and every router sees the
same request sequence (``--seed``): a paired comparison, as ``llm_lb_gym.experiments.evaluate`` pairs
episodes. The same sequence is also run through the simulator itself with the same router
(``sim`` rows), so the table shows how far the served cluster and the simulation agree: each
served row's mean and p99 E2E are set against its own simulation, and its decisions too: the
share of requests the simulated router sent to the backend the served one did (the router is
seeded alike and names each reply's backend; ``served_instance`` and ``sim_instance`` in
``results.csv``). Round robin and the random router must agree on every request; a router that
reads the backends' state agrees as far as the simulated state tracks the served one.
``--options-from`` gives the routers a setting's tuned options (as ``serve router``);
``--policy RUN_DIR`` adds a ``learned`` row: the network of an ``improve`` or ``train`` run,
served with ``serve router --policy`` and simulated deciding on the simulator's cluster.
Latencies are in the workload's seconds (wall seconds x time scale). Writes ``results.csv``
(one row per request and router) and ``summary.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import sys
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._cli_args import key_values
from llm_lb_gym.experiments._serve_policy import load_policy, served_router_options

COLUMNS = (("mean_e2e_s", "mean E2E (s)"), ("p50_e2e_s", "p50 E2E (s)"), ("p99_e2e_s", "p99 E2E (s)"),
           ("mean_ttft_s", "mean TTFT (s)"), ("p99_ttft_s", "p99 TTFT (s)"), ("mean_tbt_s", "mean TBT (s)"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llm-lb-gym loadgen", description=__doc__.splitlines()[0])
    ap.add_argument("--url", default=None, help="replay against this running service instead")
    ap.add_argument("--allow-remote", action="store_true",
                    help="let --url name a host other than 127.0.0.1 / localhost")
    ap.add_argument("--model", default="sim-model", help="model name sent in each request")
    ap.add_argument("--routers", default="round_robin,jsq")
    ap.add_argument("-o", "--option", action="append", default=[],
                    help="router option ROUTER.key=value (repeat)")
    ap.add_argument("--options-from", default=None,
                    help="the routers' options from an experiment, options file or directory (serve router's)")
    ap.add_argument("--policy", default=None, help="an improve or train run: adds a 'learned' row")
    ap.add_argument("--sim-backends", type=int, default=4)
    ap.add_argument("--preset", default="llama2-7b-v100")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--workload", default="task_mix")
    ap.add_argument("-w", "--workload-option", action="append", default=[], help="key=value")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-concurrency", type=int, default=512)
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--context-tokens", type=int, default=4096)
    ap.add_argument("--out", default="runs/loadgen")
    return ap




def workload_batch(args):
    from llm_lb_gym.workload import make_workload

    opts = {"max_context_tokens": args.context_tokens}
    opts.update(key_values(args.workload_option, "loadgen"))
    wl = make_workload(args.workload, **opts)
    return wl.sample(np.random.default_rng(args.seed), args.requests)


def simulate(batch, router: str, options: dict, n: int, preset: str, seed: int, policy: str | None = None) -> dict:
    """The same requests through the simulator (oracle predictions = max_tokens, as served; ideal
    latencies as the service computes them; ``serve.lockstep.simulated_run``). ``router``
    "learned": the network of ``policy``, deciding on the simulator's cluster."""
    from llm_lb_gym.sim.metrics import episode_metrics

    return episode_metrics(simulate_cluster(batch, router, options, n, preset, seed, policy).table)


def simulate_cluster(batch, router: str, options: dict, n: int, preset: str, seed: int, policy: str | None = None):
    """As :func:`simulate`, the finished cluster (its table: each request's instance)."""
    from llm_lb_gym.routers.registry import make_router
    from llm_lb_gym.serve.lockstep import simulated_run
    from llm_lb_gym.sim.config import ClusterConfig, EngineConfig

    if router == "learned":
        from llm_lb_gym.serve.config import RouterServiceConfig

        urls = tuple(f"http://127.0.0.1:{i + 1}" for i in range(n))
        r = load_policy(policy, None, RouterServiceConfig(backends=urls, preset=preset))
    else:
        r = make_router(router, **options)
    cluster, _ = simulated_run(batch, ClusterConfig(num_instances=n, engine=EngineConfig(preset=preset)),
                               r, np.random.default_rng(seed), 0.02)
    return cluster


def serve_stack(args, router: str, options: dict):
    """Start N simulated backends and a router (child processes); return (url, processes,
    backend URLs). The router is seeded as :func:`simulate` seeds its router (a random router
    draws alike on both sides) and names each reply's backend (``--backend-header``)."""
    import os
    import subprocess

    from llm_lb_gym.serve.launch import free_port, spawn_sim_backend, wait_healthy

    procs, urls = [], []
    try:
        for _ in range(args.sim_backends):
            port = free_port()
            procs.append(spawn_sim_backend(port, "--time-scale", str(args.time_scale),
                                           "--preset", args.preset))
            urls.append(f"http://127.0.0.1:{port}")
        port = free_port()
        cmd = [sys.executable, "-m", "llm_lb_gym.experiments.serve", "router", "--port", str(port),
               *(["--policy", args.policy] if router == "learned" else ["--router", router]),
               "--preset", args.preset, "--context-tokens", str(args.context_tokens),
               "--decision-interval-s", str(0.02 / args.time_scale), "--seed", str(args.seed), "--backend-header"]
        if args.options_from and router != "learned":
            cmd += ["--options-from", args.options_from]
        for u in urls:
            cmd += ["--backend", u]
        for k, v in options.items():
            cmd += ["-o", f"{k}={v}"]
        procs.append(subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"),
                                      stdout=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, 60.0, procs[-1])
        return url, procs, urls
    except BaseException:
        stop(procs)
        raise


def stop(procs) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def main(argv=None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from llm_lb_gym.extras import require

    require("serve", "llm-lb-gym loadgen")
    from urllib.parse import urlparse

    from llm_lb_gym.serve.loadgen import backend_index, replay, summarize

    local = ("127.0.0.1", "localhost", "::1")
    if args.url and not args.allow_remote and urlparse(args.url).hostname not in local:
        raise SystemExit(f"loadgen: --url {args.url} is not on this machine; load tests go to 127.0.0.1 "
                         f"or localhost unless --allow-remote is given")

    batch = workload_batch(args)
    routers = [r for r in args.routers.split(",") if r] + (["learned"] if args.policy else [])
    per_router: dict[str, dict] = {}
    for key, value in key_values(args.option, "loadgen").items():
        r, _, k = key.partition(".")
        per_router.setdefault(r, {})[k] = value
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, summary = [], {}
    for router in (routers if args.url is None else ["service"]):
        opts = per_router.get(router, {})
        if router != "learned":
            opts = {**served_router_options(args.options_from, router), **opts}
        procs, backends = [], []
        url = args.url
        if url is None:
            url, procs, backends = serve_stack(args, router, opts)
        try:
            res = asyncio.run(replay(url, batch.arrival_s, batch.prompt_tokens, batch.decode_tokens,
                                     model=args.model, time_scale=args.time_scale,
                                     max_concurrency=args.max_concurrency,
                                     stream=not args.no_stream))
        finally:
            stop(procs)
        summary[router] = summarize(res)
        mine = [dict(router=router, **r.__dict__) for r in res]
        if args.url is None:
            from llm_lb_gym.sim.metrics import episode_metrics

            cluster = simulate_cluster(batch, router, opts, args.sim_backends, args.preset, args.seed, args.policy)
            summary[router + " (sim)"] = episode_metrics(cluster.table)
            for row, sim in zip(mine, cluster.table.instance):   # the served decision beside the simulated
                row["served_instance"] = backend_index(row["backend"], backends)
                row["sim_instance"] = int(sim)
            named = [row for row in mine if row["served_instance"] >= 0]
            summary[router]["decisions_agree"] = (
                float(np.mean([row["served_instance"] == row["sim_instance"] for row in named])) if named else np.nan)
        rows += mine
        print(f"{router}: {summary[router]['errors']:.0f} errors of {len(res)}", file=sys.stderr)
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    base = summary[routers[0]] if args.url is None else None
    lines = ["| router | " + " | ".join(h for _, h in COLUMNS) + " | errors | E2E vs " +
             (routers[0] if base else "-") + " | served vs sim: mean | p99 | decisions as simulated |",
             "|" + "---|" * (len(COLUMNS) + 6)]
    for name, s in summary.items():
        change = ""
        if base and not name.endswith("(sim)"):
            change = f"{100 * (s['mean_e2e_s'] - base['mean_e2e_s']) / base['mean_e2e_s']:+.2f}%"
        elif base:
            sb = summary[routers[0] + " (sim)"]
            change = f"{100 * (s['mean_e2e_s'] - sb['mean_e2e_s']) / sb['mean_e2e_s']:+.2f}%"
        errs = s.get("errors", s.get("rejected", 0))
        cells = " | ".join(f"{s[k]:.3f}" for k, _ in COLUMNS)
        vs = " | | "
        if base and not name.endswith("(sim)"):
            sim = summary[name + " (sim)"]
            vs = " | ".join(f"{100 * (s[k] - sim[k]) / sim[k]:+.1f}%" for k in ("mean_e2e_s", "p99_e2e_s"))
            vs += f" | {s['decisions_agree']:.1%}"   # requests the simulated router sent where the served one did
        lines.append(f"| {name} | {cells} | {errs:.0f} | {change} | {vs} |")
    text = (f"{args.requests} requests of {args.workload} {args.workload_option}, seed {args.seed}, "
            f"{args.sim_backends} x {args.preset}, time scale {args.time_scale}\n\n"
            + "\n".join(lines) + "\n")
    (out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
