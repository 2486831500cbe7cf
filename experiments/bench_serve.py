"""Bench the router service: its added latency per request, its CPU per request, its request rate.

    llm-lb-gym bench_serve                       # round_robin and jsq, 2 simulated backends
    llm-lb-gym bench_serve --routers jsq --pairs 1000 --rate-seconds 10
    llm-lb-gym bench_serve --burst 60 --routers late_binding --options-from v100_near_capacity
    llm-lb-gym bench_serve --routers round_robin --profile /tmp/router.svg   # py-spy, the rate phase

Everything runs on 127.0.0.1 as child processes: N simulated backends at a very large time
scale (their engine time is ~0, so what is measured is HTTP and the router) and one router
process per router. Measured per router:

- **paired overhead**: ``--pairs`` pairs of the same request, one sent to a backend directly and
  one through the router, in a random order per pair, one at a time; the overhead is the
  distribution of the per-pair differences (routed - direct), p50 / p90 / p99. The direct call
  takes the router's own upstream path: a non-streamed client request goes upstream as a
  stream with usage (``assemble_upstream``), so its direct twin is that stream, read to its
  end; a streamed request is a stream both ways. (The bench before 0.7.0 took the difference of
  two percentiles of a non-streamed direct call and a routed call: not a distribution of
  differences, not the same upstream path, and once negative.)
- **router CPU per request**: the router process's CPU seconds (``/proc/PID/stat``) over the
  rate phase divided by the requests it answered, and so **requests/s per router core**
  (its inverse: what the router would carry with a core of its own) beside the requests/s
  measured, which on a shared machine is what the other processes leave it.
- **decision time**: the router's histogram, and an in-process loop on a service view.

The machine's load average is printed with every figure: on a shared 2-core machine the CPU
figures are the ones to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

import numpy as np

from llm_lb_gym.experiments._serve_policy import load_policy

BODY = {"model": "sim-model", "prompt": "a b c d", "max_tokens": 1}
BURST_BODY = {"model": "sim-model", "prompt": "a b c d e", "max_tokens": 4}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def schedstat(pid: int) -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of a process's main thread:
    Linux's /proc/PID/schedstat; the wait is what a loaded machine adds to its latency."""
    with open(f"/proc/{pid}/schedstat") as f:
        run_ns, wait_ns, _ = f.read().split()
    return int(run_ns) * 1e-9, int(wait_ns) * 1e-9


def in_process(args, router: str) -> str:
    from llm_lb_gym.routers.registry import make_router

    if router == "learned":
        from llm_lb_gym.serve.config import RouterServiceConfig

        backends = tuple(f"http://127.0.0.1:{i + 1}" for i in range(args.backends))
        obj = load_policy(args.policy, None, RouterServiceConfig(backends=backends))
    else:
        obj = make_router(router)
    t = decision_times(obj, args.backends, args.decisions) * 1e3
    return (f"in-process decision time over {args.decisions}: p50 {np.percentile(t, 50):.3f} ms, "
            f"p99 {np.percentile(t, 99):.3f} ms, mean {t.mean():.3f} ms")


def start(args, router: str, time_scale: str = "100000"):
    """Backends and a router process; ``router`` "learned" runs ``--policy``."""
    from llm_lb_gym.serve.launch import free_port, spawn_sim_backend, wait_healthy

    procs, urls = [], []
    for _ in range(args.backends):
        port = free_port()
        procs.append(spawn_sim_backend(port, "--time-scale", time_scale))
        urls.append(f"http://127.0.0.1:{port}")
    port = free_port()
    cmd = [sys.executable, "-m", "llm_lb_gym.experiments.serve", "router", "--port", str(port)]
    cmd += ["--policy", args.policy] if router == "learned" else ["--router", router]
    if args.options_from and router != "learned":
        cmd += ["--options-from", args.options_from]
    if not args.assemble_upstream:
        cmd.append("--no-assemble-upstream")
    for u in urls:
        cmd += ["--backend", u]
    procs.append(subprocess.Popen(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 120.0, procs[-1])
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return url, urls, procs


def overhead(router_url: str, backend_url: str, n: int, stream: bool, seed: int = 0) -> np.ndarray:
    """Per-pair differences (routed - direct, seconds) of ``n`` pairs of the same request, the
    two of a pair in a random order; the direct one takes the router's upstream path (module
    docstring). One request at a time, over kept-alive connections."""
    import httpx

    routed_body = {**BODY, "stream": stream}
    direct_body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
    rng = np.random.default_rng(seed)

    def call(c, url: str, body: dict) -> float:
        t = time.perf_counter()
        with c.stream("POST", url + "/v1/completions", json=body) as r:
            for _ in r.iter_raw():
                pass
            if r.status_code != 200:
                raise RuntimeError(f"{url}: HTTP {r.status_code}")
        return time.perf_counter() - t

    out = np.empty(n)
    with httpx.Client(timeout=10) as c:
        for _ in range(50):    # warm up both paths (connections, caches)
            call(c, router_url, routed_body)
            call(c, backend_url, direct_body)
        for k in range(n):
            if rng.random() < 0.5:
                d = call(c, backend_url, direct_body)
                r = call(c, router_url, routed_body)
            else:
                r = call(c, router_url, routed_body)
                d = call(c, backend_url, direct_body)
            out[k] = r - d
    return out


async def rate(url: str, seconds: float, concurrency: int, max_requests: int) -> tuple[int, int, float]:
    import aiohttp

    ok = err = 0
    sent = 0
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=10)) as c:
        async def worker():
            nonlocal ok, err, sent
            while time.monotonic() < deadline and sent < max_requests:
                sent += 1
                try:
                    async with c.post(url + "/v1/completions", json=BODY) as r:
                        await r.read()
                        ok += r.status == 200
                        err += r.status != 200
                except Exception:
                    err += 1
        t = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return ok, err, time.monotonic() - t


async def burst(url: str, n: int) -> tuple[float, int]:
    """``n`` short non-streamed requests sent at once; (seconds until the last answer, errors)."""
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=60)) as c:
        async def one() -> int:
            async with c.post(url + "/v1/completions", json=BURST_BODY) as r:
                await r.read()
                return r.status

        t = time.monotonic()
        status = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
        return time.monotonic() - t, sum(s != 200 for s in status)


def decision_quantiles(text: str) -> str:
    from prometheus_client.parser import text_string_to_metric_families

    for fam in text_string_to_metric_families(text):
        if fam.name == "llm_lb_router_decision_seconds":
            b = [(s.labels["le"], s.value) for s in fam.samples if s.name.endswith("_bucket")]
            total = b[-1][1]
            p50 = next(le for le, v in b if v >= 0.5 * total)
            p99 = next(le for le, v in b if v >= 0.99 * total)
            return (f"decision time: p50 <= {float(p50) * 1e6:.0f} us, p99 <= {float(p99) * 1e6:.0f} us "
                    f"({total:.0f} decisions)")
    return "decision time: no histogram"


def decision_times(router, m: int, n: int) -> np.ndarray:
    """Seconds per decision of ``router`` in this process, on a service view of ``m`` backends
    fed ``n`` requests of varied sizes (a third of the in-flight ones end after each)."""
    from llm_lb_gym.routers.drive import decide
    from llm_lb_gym.serve.view import BackendView, ServiceCluster, ServiceTable
    from llm_lb_gym.sim.latency import get_preset

    lat = get_preset("llama2-7b-v100").latency
    tb = ServiceTable()
    views = [BackendView(i, f"http://127.0.0.1:{i + 1}", tb, block_size=16, num_blocks=1887, max_seqs=128,
                         latency=lat, stale_s=2.0) for i in range(m)]
    if hasattr(router, "prepare"):
        router.prepare(views)
    cluster = ServiceCluster(views)
    router.reset(np.random.default_rng(0), m)
    buckets = getattr(router, "buckets", lambda p, d: (0, 0))
    out = np.empty(n)
    for k in range(n):
        p, d = 50 + (k * 37) % 900, 20 + (k * 53) % 400
        inv = 1.0 / lat.isolated_request_s(p, d)
        cluster.queue.append(tb.add(p, float(d), cluster.t, inv, *buckets(p, d)))
        t = time.perf_counter()
        choice = decide(cluster, router)
        out[k] = time.perf_counter() - t
        if choice is not None:
            cluster.route(choice[1], choice[0])
        if k % 3 == 2:
            for v in views:
                if v.inflight:
                    rid = next(iter(v.inflight))
                    v.on_end(rid)
                    tb.free(rid)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="llm-lb-gym bench_serve", description=__doc__.splitlines()[0])
    ap.add_argument("--routers", default="round_robin,jsq")
    ap.add_argument("--backends", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=500, help="paired-overhead pairs per request shape")
    ap.add_argument("--rate-seconds", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--max-requests", type=int, default=100000)
    ap.add_argument("--no-assemble-upstream", dest="assemble_upstream", action="store_false",
                    help="the router passes non-streamed requests through instead of assembling them "
                         "from upstream streams (compare the two paths' cost)")
    ap.add_argument("--decisions", type=int, default=2000, help="in-process decision-time samples")
    ap.add_argument("--options-from", default=None,
                    help="experiment whose eval.policy_options the routers take (serve router --options-from)")
    ap.add_argument("--burst", type=int, default=0,
                    help="only this: N short requests at once through each router, backends at time "
                         "scale 1 (simulated V100s), the time until the last answer")
    ap.add_argument("--policy", default=None, help="an improve or train run dir (for --backends "
                    "instances): adds a 'learned' router row")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="py-spy the router during the rate phase: FILE.svg (flame graph), .json "
                         "(speedscope) or .txt (raw stacks, for summing)")
    args = ap.parse_args(sys.argv[1:] if argv is None else argv)
    from llm_lb_gym.extras import require

    require("serve", "llm-lb-gym bench_serve")
    import httpx

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{args.backends} simulated backends; all on 127.0.0.1")
    routers = args.routers.split(",") + (["learned"] if args.policy else [])
    if args.burst:
        for router in routers:
            url, urls, procs = start(args, router, time_scale="1")
            try:
                asyncio.run(burst(url, 4))   # warm up
                time.sleep(0.5)
                dt, err = asyncio.run(burst(url, args.burst))
                print(f"[{router}] burst of {args.burst}: the last answered after {dt:.3f} s, {err} errors "
                      f"(load average {os.getloadavg()[0]:.1f})")
            finally:
                for p in procs:
                    p.kill()
                    p.wait()
        return
    for router in routers:
        url, urls, procs = start(args, router)
        try:
            for stream in (False, True):
                shape = "streamed" if stream else "non-streamed"
                cpu0, (run0, wait0) = cpu_seconds(procs[-1].pid), schedstat(procs[-1].pid)
                diff = overhead(url, urls[0], args.pairs, stream) * 1e3
                cpu = cpu_seconds(procs[-1].pid) - cpu0
                run1, wait1 = schedstat(procs[-1].pid)
                q = np.percentile(diff, [50, 90, 99])
                k = args.pairs + 50
                print(f"[{router}] paired overhead, {shape} ({args.pairs} pairs): p50 {q[0]:.3f} ms, "
                      f"p90 {q[1]:.3f} ms, p99 {q[2]:.3f} ms, mean {diff.mean():.3f} ms; router CPU "
                      f"{cpu / k * 1e3:.3f} ms per request one at a time, and {(wait1 - wait0) / k * 1e3:.3f} "
                      f"ms waiting for a CPU (load average {os.getloadavg()[0]:.1f})")
            cpu0 = cpu_seconds(procs[-1].pid)
            prof = start_profile(args.profile, procs[-1].pid, args.rate_seconds) if args.profile else None
            ok, err, dt = asyncio.run(rate(url, args.rate_seconds, args.concurrency, args.max_requests))
            cpu = cpu_seconds(procs[-1].pid) - cpu0
            if prof is not None:
                prof.wait()
            per = cpu / max(ok, 1)
            print(f"[{router}] sustained: {ok / dt:.0f} req/s ok, {err} errors, over {dt:.1f} s at "
                  f"concurrency {args.concurrency} (load average {os.getloadavg()[0]:.1f}); router CPU "
                  f"{per * 1e3:.3f} ms per request = {1 / per if cpu else float('nan'):.0f} req/s per "
                  f"router core")
            print(f"[{router}] " + decision_quantiles(httpx.get(url + "/metrics").text))
            print(f"[{router}] " + in_process(args, router))
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()


def start_profile(path: str, pid: int, seconds: float):
    """py-spy recording the router process for the rate phase (``--profile``; the profile extra)."""
    import shutil

    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("bench_serve --profile needs py-spy (pip install -e '.[profile]')")
    fmt = "speedscope" if path.endswith(".json") else ("raw" if path.endswith(".txt") else "flamegraph")
    return subprocess.Popen([spy, "record", "-p", str(pid), "-d", str(max(1, int(seconds))), "-r", "200",
                             "-f", fmt, "-o", path, "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
