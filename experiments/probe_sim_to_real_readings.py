"""Probe: does any reading of a replay track the llama.cpp servers' speed better than the checks?

    python -m llm_lb_gym.experiments.probe_sim_to_real_readings            # every stored run, ~80 s
    python -m llm_lb_gym.experiments.probe_sim_to_real_readings DIR [DIR ...]

Re-judges stored sim_to_real runs (``sim_to_real --rejudge``, no servers) with the reading that
sets each replay's simulated speed swapped for another one the run recorded (``VARIANTS``):
the server checks around the replay (what sim_to_real uses), the CPU probe with the servers
idle around it, the CPU probe sampled *during* it, and the checks times the probe's
during / idle ratio. Prints, per run and variant, the router-loads whose mean E2E and mean TTFT
are within 15%; then, on the checks' footing, the signed TTFT error over every router-load
(its bias, and how many would be within 15% were that bias removed by one factor: the most any
uniform speed correction can give) and the TTFT error by the simulated state at arrival.

Why: the held-out runs of 2026-12-07 left the probe sampled during the replays as a lead (its
run medians followed the prompt-time residual across runs). Judged on all stored runs at once
(docs/serving.md, "The lead tested on the stored runs") it does not hold: the probe sampled
during a replay also reads the servers' own load: in the stored runs before ``_e`` its medians
are x1.27-1.88 where the idle probe's are x0.94-1.29, and simulated at it those runs' E2E lands
within 15% in 4 of 80 router-loads. Not an entry point of the package's results: a probe, kept
apart from the commands."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from llm_lb_gym.experiments._sim_to_real_tables import TARGET

STORED = Path(__file__).with_name("profiles")
VARIANTS = {
    "checks (sim_to_real)": ("check", {}),
    "probe, servers idle": ("probe", {}),
    "probe during the replay": ("probe", {"execution_factor": "probe_during_factor"}),
    "checks x probe during / idle": ("check", {"check_compute_factor": "during_over_idle"}),
}
"""name -> (footing, readings replaced: key -> the reading put there)."""


def _swap(reading: dict, swaps: dict) -> dict:
    out = dict(reading)
    for key, src in swaps.items():
        out[key] = (reading["check_compute_factor"] * reading["probe_during_factor"] / reading["execution_factor"]
                    if src == "during_over_idle" else reading[src])
    return out


def _has_checks(stored: dict) -> bool:
    return all(np.isfinite(r.get("check_compute_factor", np.nan))
               for reps in stored["repeats"].values() for rep in reps for r in rep.values())


def rejudge(run: Path, footing: str, swaps: dict, tmp: Path) -> dict | None:
    """The run re-judged with ``swaps`` applied to every replay's readings; its summary.json
    (None where the footing needs checks the run lacks)."""
    stored = json.loads((run / "summary.json").read_text())
    if footing == "check" and not _has_checks(stored):
        return None
    work = tmp / run.name
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(run, work)
    for reps in stored["repeats"].values():
        for rep in reps:
            for router in rep:
                rep[router] = _swap(rep[router], swaps)
    (work / "summary.json").write_text(json.dumps(stored))
    # the command itself (an entry point is not imported); its verdict is read from summary.json
    subprocess.run([sys.executable, "-m", "llm_lb_gym.experiments.sim_to_real", "--rejudge", str(work),
                    "--out", str(work / "rj"), "--footing", footing], check=True, stdout=subprocess.DEVNULL)
    return json.loads((work / "rj" / "summary.json").read_text())


def main(argv=None) -> dict:
    args = sys.argv[1:] if argv is None else argv
    runs = [Path(a) for a in args] or sorted(p for p in STORED.glob("llamacpp_replays_*") if p.is_dir())
    totals = {}
    ttft_errors, by_state = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (footing, swaps) in VARIANTS.items():
            t = totals.setdefault(name, [0, 0, 0])
            for run in runs:
                got = rejudge(run, footing, swaps, Path(tmp))
                if got is None:
                    print(f"{name:30s} {run.name}: no server checks, skipped", flush=True)
                    continue
                v = got["verdict"]
                print(f"{name:30s} {run.name}: E2E {v['mean_e2e_s']['within']} / TTFT {v['mean_ttft_s']['within']} "
                      f"of {v['router_loads']} router-loads within 15%", flush=True)
                t[0] += v["router_loads"]
                t[1] += v["mean_e2e_s"]["within"]
                t[2] += v["mean_ttft_s"]["within"]
                if swaps or footing != "check":
                    continue
                ttft_errors += v["mean_ttft_s"]["errors"]
                results = Path(tmp) / run.name / "rj" / "results.csv"
                if not results.is_file():   # a run stored without its requests
                    continue
                with open(results, newline="") as f:
                    for r in csv.DictReader(f):
                        if r["status"] == "200" and r.get("arrival_state"):
                            s = by_state.setdefault(r["arrival_state"], [0.0, 0.0, 0])
                            s[0] += float(r["ttft_s"])
                            s[1] += float(r["sim_ttft_s"])
                            s[2] += 1
    print()
    for name, (n, e, t) in totals.items():
        print(f"{name:30s} all runs: E2E {e} / TTFT {t} of {n} router-loads within 15%")
    err = np.array(ttft_errors)
    bias = float(np.median(err))
    fixed = int(np.sum(np.abs((1 + err) / (1 + bias) - 1) <= TARGET))
    print(f"\nchecks' footing, mean TTFT over {len(err)} router-loads: median error {bias:+.1%}, mean {err.mean():+.1%}, "
          f"{np.mean(err < 0):.0%} short; within 15%: {int(np.sum(np.abs(err) <= TARGET))}, and {fixed} were the "
          f"median bias removed by one factor")
    for state, (served, sim, n) in by_state.items():
        print(f"  arrival state {state!r}: sim / served mean TTFT - 1 = {sim / served - 1:+.1%} ({n} requests)")
    return dict(totals=totals, ttft_bias=bias, within_if_unbiased=fixed,
                by_state={k: v[1] / v[0] - 1 for k, v in by_state.items()})


if __name__ == "__main__":
    main()
