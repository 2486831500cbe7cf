"""Probe: how fast, and how far, this machine's speed moves, read by the llama.cpp server check.

    python -m llm_lb_gym.experiments.probe_machine_speed                  # 120 s of checks
    python -m llm_lb_gym.experiments.probe_machine_speed --seconds 300 --csv speed.csv

A cheap look before an hour of ``llm-lb-gym sim_to_real``: one llama-server (one thread), the
server check (``_contention.server_check_s``: a 64-token prompt's time per token and a one-stream
decode step, on the server's own clock, net of its waits for a CPU) back to back for
``--seconds``; prints the spread (p10 / p50 / p90), the autocorrelation of the prompt speed at a
few lags (how long the machine stays at one speed), and how the bracket statistics read a
replay-long stretch against the average between them (:func:`bracket_bias`: the lesser of each
pair of checks before and after, and their mean, which ``_contention.bracket_reading_s`` takes).

Why: sim_to_real corrects each replay by the checks around it. That only works if the machine's
speed stays put for longer than a replay, or if the statistic reads the average it moved through.
On the VM of 2026-12-07 the check moved +-25% (p10-p90) with a correlation time of 10-20 s, and
the lesser read a 2-minute stretch 10-12% fast; the mean read it within 2% (docs/serving.md).
Not an entry point of the package's results: a probe, kept apart from the commands.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time

import numpy as np

from llm_lb_gym.experiments._contention import IDLE_CHECKS, bracket_reading_s, server_check_s

LAGS_S = (1.0, 5.0, 10.0, 20.0, 40.0)


def autocorrelation(x: np.ndarray, lag: int) -> float:
    """Pearson correlation of the series with itself ``lag`` steps later (NaN if too short)."""
    x = np.asarray(x, dtype=float)
    if lag < 1 or lag >= len(x) - 2:
        return float("nan")
    return float(np.corrcoef(x[:-lag], x[lag:])[0, 1])


def bracket_bias(x: np.ndarray, span: int, k: int = IDLE_CHECKS) -> dict[str, tuple[float, float]]:
    """For every stretch of ``span`` checks with ``k`` checks before and ``k`` after it: each
    statistic's reading over the stretch's mean -> (median ratio, sd of its log). "lesser": the
    median of min(before_i, after_i), the statistic of package 0.7.0 until 2026-12-07; "mean":
    the mean of all 2k (``bracket_reading_s``). A ratio below 1 reads the machine faster than
    the stretch ran."""
    x = np.asarray(x, dtype=float)
    if span < 1 or k < 1 or len(x) < span + 2 * k:
        raise ValueError(f"bracket_bias: {len(x)} checks for a stretch of {span} with {k} on each side; "
                         f"allowed: at least {span + 2 * k}")
    out: dict[str, list[float]] = {"lesser": [], "mean": []}
    for i in range(len(x) - span - 2 * k + 1):
        before, stretch, after = x[i:i + k], x[i + k:i + k + span], x[i + k + span:i + 2 * k + span]
        avg = stretch.mean()
        out["lesser"].append(float(np.median(np.minimum(before, after))) / avg)
        out["mean"].append(bracket_reading_s(before, after) / avg)
    return {name: (float(np.median(r)), float(np.std(np.log(r)))) for name, r in out.items()}


def measure(seconds: float, server: str | None, gguf: str | None) -> np.ndarray:
    """Rows (seconds since start, s per prompt token, s per decode step) of back-to-back checks."""
    from llm_lb_gym.serve import llamacpp

    (srv,) = llamacpp.start_servers(1, server=server, model=gguf, ctx_tokens=4096)
    try:
        server_check_s(srv.url, srv.proc.pid)   # the first request pays one-time allocations
        rows, t0 = [], time.monotonic()
        while time.monotonic() - t0 < seconds:
            rows.append((time.monotonic() - t0, *server_check_s(srv.url, srv.proc.pid)))
        return np.array(rows)
    finally:
        llamacpp.stop_servers([srv])


def report(rows: np.ndarray, replay_s: float) -> list[str]:
    """The probe's lines for checks ``rows`` (see :func:`measure`)."""
    period = rows[-1, 0] / max(len(rows) - 1, 1)
    prompt, decode = rows[:, 1] * 1e3, rows[:, 2] * 1e3
    lines = [f"{len(rows)} checks over {rows[-1, 0]:.0f} s (one per {period:.2f} s)",
             "prompt ms per token p10 / p50 / p90: %.2f / %.2f / %.2f" % tuple(np.percentile(prompt, [10, 50, 90])),
             "decode ms per step  p10 / p50 / p90: %.2f / %.2f / %.2f" % tuple(np.percentile(decode, [10, 50, 90])),
             "autocorrelation of the prompt speed: " + ", ".join(
                 f"{lag:g} s {autocorrelation(np.log(prompt), max(1, round(lag / period))):.2f}" for lag in LAGS_S)]
    span = max(1, round(replay_s / period))
    try:
        got = bracket_bias(prompt, span)
        lines.append(f"a {replay_s:g} s stretch read by {IDLE_CHECKS} checks each side, over its average "
                     "(median; sd of the log): " + ", ".join(f"{k} {m:.3f} ({s:.3f})" for k, (m, s) in got.items()))
    except ValueError as e:
        lines.append(f"no bracket reading: {e} (run longer: --seconds)")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to check back to back")
    ap.add_argument("--replay-s", type=float, default=60.0,
                    help="the stretch the bracket statistics read (a replay's length; default 60 s)")
    ap.add_argument("--llama-server", default=None)
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--csv", default=None, help="write every check here")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.replay_s <= 0:
        raise SystemExit(f"probe_machine_speed: --seconds={args.seconds}, --replay-s={args.replay_s}; allowed: > 0")
    rows = measure(args.seconds, args.llama_server, args.gguf)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "check_prefill_s", "check_decode_s"])
            w.writerows(rows.tolist())
    print("\n".join(report(rows, args.replay_s)))


if __name__ == "__main__":
    main(sys.argv[1:])
