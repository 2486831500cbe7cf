"""Simulate every case of the corpus of real serving measurements; simulated vs measured, with errors.

    llm-lb-gym validate                  # the shipped serving fit: every case, per source, per split
    llm-lb-gym validate --before         # the same cases under the kernel-profile presets (issue 33's start)
    llm-lb-gym validate --fit            # refit on the fitted part, then validate (a few minutes)
    llm-lb-gym validate --split held_out --json out.json
    llm-lb-gym validate --no-frontend    # the serving fit's engine alone: what the API server's stage adds
    llm-lb-gym validate --fit --input-workers 1   # refit with one request's input work at a time
    llm-lb-gym validate --fit --fit-headline   # the older objective: without the published median ITLs
    llm-lb-gym validate --kv-allocation request   # V0's whole-prompt KV reservation instead of V1's per chunk
    llm-lb-gym validate --scale h100-80gb.bandwidth=0.64 --scale h100-80gb.kv_bandwidth=0.64   # a diagnostic
    llm-lb-gym validate --readings       # also: each host's constants read off its lone requests, the rest judged

The corpus (``llm_lb_gym/calibration/corpus.json``, docs/calibration.md) holds published
end-to-end results of vLLM servers with their setup; each case is replayed on one simulated
instance configured as that server (``calibration/serving.py``: the model's config.json, the
GPU, the engine generation's defaults, the case's flags; the API server's frontend). The table
gives each figure measured, simulated and simulated / measured - 1; the summaries give median
and max |error| over the headline figures (duration, mean TTFT, median TPOT; median ITL, TTFT
and E2E where only those are published) per source and for the fitted and the held-out part,
GPU-bound cases apart from the API-bound short-request ones (outputs of <= 8 tokens, where the
server's per-request work, not the GPU, sets the pace).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np

SHORT_OUTPUT_TOKENS = 8
"""Cases with outputs this short are API-bound (the issue's 128-in / 4-out floods)."""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llm-lb-gym validate", description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("all", "fitted", "held_out"), default="all")
    ap.add_argument("--before", action="store_true",
                    help="the kernel-profile presets, no frontend (the simulator before issue 33)")
    ap.add_argument("--fit", action="store_true", help="refit the serving factors on the fitted part first")
    ap.add_argument("--fit-headline", action="store_true",
                    help="with --fit: match duration, mean TTFT and median TPOT only (the objective before "
                         "2026-12-06), not each case's published median ITL (the decode step alone) beside them")
    ap.add_argument("--no-frontend", action="store_true",
                    help="drop the API server's frontend stage (sim/frontend.py): the engine's own figures, "
                         "to see what the frontend adds to each case")
    ap.add_argument("--input-workers", default=None, metavar="[ENDPOINT=]K",
                    help="the frontends' input_workers for this run (and the fit's start): 0 = every request's "
                         "input work shares the CPU at once, k = k at a time in arrival order (sim/frontend.py); "
                         "ENDPOINT=K (chat, completions) sets one endpoint's only")
    ap.add_argument("--kv-allocation", choices=("request", "chunk"), default=None,
                    help="override the engine generation's KV allocation (vLLM V1: chunk, each prefill chunk's "
                         "blocks as it is scheduled; request: V0's reservation of the whole prompt at admission)")
    ap.add_argument("--scale", action="append", default=[], metavar="GPU.FACTOR=X",
                    help="set one per-GPU serving factor for this run (a diagnostic; repeatable), FACTOR one of "
                         "linear_flops, attention_flops, bandwidth, kv_bandwidth: e.g. h100-80gb.bandwidth=0.64")
    ap.add_argument("--readings", action="store_true",
                    help="also fit, per source, the host constants its lone-request cases (one in flight) pin down "
                         "(calibration/host_readings.py: frontend, weight-read factor, and with two prompt lengths "
                         "compute and KV-read factors) and judge its other cases with them")
    ap.add_argument("--json", default=None, help="write every case's figures and errors here")
    return ap


def parse_workers(value: str | None) -> tuple[str | None, int] | None:
    """``--input-workers``: ``K`` (every endpoint) or ``ENDPOINT=K``."""
    if value is None:
        return None
    from llm_lb_gym.calibration.corpus import ENDPOINTS

    endpoint, _, k = value.rpartition("=")
    if (endpoint and endpoint not in ENDPOINTS) or not k.isdigit():
        raise SystemExit(f"llm-lb-gym validate: --input-workers={value!r}; allowed: an integer >= 0, or "
                         f"ENDPOINT=K with ENDPOINT one of {', '.join(ENDPOINTS)}")
    return endpoint or None, int(k)


def apply_scales(cal, items: list[str]):
    """``--scale GPU.FACTOR=X``: ``cal`` with those serving factors replaced."""
    from llm_lb_gym.calibration.serving import GPU_PARAMS
    from llm_lb_gym.sim.gpus import GPUS

    scales = dict(cal.scales)
    for item in items:
        key, _, value = item.partition("=")
        gpu, _, factor = key.rpartition(".")
        try:
            x = float(value)
        except ValueError:
            x = -1.0
        if gpu not in GPUS or factor not in GPU_PARAMS or not x > 0:
            raise SystemExit(f"llm-lb-gym validate: --scale {item!r}; expected GPU.FACTOR=X with GPU one of "
                             f"{', '.join(GPUS)}, FACTOR one of {', '.join(GPU_PARAMS)} and X > 0")
        # on top of this GPU's earlier --scale items: repeated items for one GPU all apply
        scales[gpu] = dataclasses.replace(scales.get(gpu) or cal.scale(gpu), **{factor: x})
    return dataclasses.replace(cal, scales=scales)


def kind(case) -> str:
    return "api-bound" if case.workload.output_tokens <= SHORT_OUTPUT_TOKENS else "gpu-bound"


def summary(results, headline_errors) -> tuple[float, float, int]:
    errs = np.abs([v for r in results for v in headline_errors(r).values()])
    if not len(errs):
        return float("nan"), float("nan"), 0
    return float(np.median(errs)), float(errs.max()), len(errs)


def before_calibration():
    """The simulator as it was: roofline factors of the kernel profiles, Vidur's CPU step, no
    frontend, synchronous scheduling (what issue 33 measured)."""
    from llm_lb_gym.calibration.serving import ServingCalibration
    from llm_lb_gym.sim import roofline

    return ServingCalibration({}, roofline.cpu_overhead(1), {}, engine_options={"kv_allocation": "request",
                                                                                  "async_scheduling": False})


def _stats(summary_: tuple[float, float, int]) -> dict:
    """:func:`summary`'s (median, max, figures) as the JSON report holds it."""
    return dict(zip(("median", "max", "figures"), summary_))


def readings_report(results, corpus, cal, headline_errors) -> dict:
    """``--readings``: per source with lone-request cases, its host's constants read off them
    (``host_readings.fit_host``) and its other cases judged before and after; then per split."""
    from llm_lb_gym.calibration.host_readings import fit_host, is_reading
    from llm_lb_gym.calibration.serving import evaluate

    by_source: dict[str, list] = {}
    for r in results:
        by_source.setdefault(r.case.source, []).append(r)
    print("\nafter reading each host off its lone requests (--readings; calibration/host_readings.py): the "
          "multipliers of the serving fit's constants, and median / max |error| of the source's other cases")
    out: dict = {"sources": {}}
    pooled: dict[str, tuple[list, list]] = {}
    for src, rs in sorted(by_source.items()):
        readings = [r.case for r in rs if is_reading(r.case)]
        rest = [r for r in rs if not is_reading(r.case)]
        if not readings or not rest:
            print(f"  {rs[0].case.split:<9}{src:<40}{'no lone-request cases' if not readings else 'no other cases'}")
            continue
        host = fit_host(readings, corpus, cal)
        after = evaluate([r.case for r in rest], corpus, host.calibration)
        gb_before = [r for r in rest if kind(r.case) == "gpu-bound"]
        gb_after = [r for r in after if kind(r.case) == "gpu-bound"]
        b, a = summary(gb_before, headline_errors), summary(gb_after, headline_errors)
        mult = ", ".join(f"{k} x{v:.3g}" for k, v in host.multipliers.items())
        print(f"  {rs[0].case.split:<9}{src:<40}read off {len(readings)} lone-request case(s): {mult}")
        print(f"  {'':<49}{'other cases':<13}{b[0]:>7.1%} / {b[1]:>6.1%} -> {a[0]:>6.1%} / {a[1]:>6.1%}  ({a[2]} figures)")
        worst = sorted(((abs(v), r.case.id, k, v) for r in gb_after for k, v in headline_errors(r).items()), reverse=True)[:3]
        print(f"  {'':<49}largest after: " + "; ".join(f"{i.split('/', 1)[1]} {k} {v:+.0%}" for _, i, k, v in worst))
        out["sources"][src] = {"readings": [c.id for c in readings], "multipliers": host.multipliers,
                               "reading_residuals": host.residuals,
                               "before": _stats(b),
                               "after": _stats(a),
                               "after_cases": {r.case.id: r.errors for r in after}}
        pb, pa = pooled.setdefault(rs[0].case.split, ([], []))
        pb += gb_before
        pa += gb_after
    hosts: dict[str, list[str]] = {}
    for src in by_source:
        if corpus.sources[src].get("host"):
            hosts.setdefault(corpus.sources[src]["host"], []).append(src)
    for host_id, srcs in sorted(hosts.items()):   # one source's lone requests, another's every case
        for read_src in srcs:
            readings = [r.case for r in by_source[read_src] if is_reading(r.case)]
            if not readings:
                continue
            host = fit_host(readings, corpus, cal)
            for src in srcs:
                if src == read_src:
                    continue
                rs = [r for r in by_source[src] if kind(r.case) == "gpu-bound"]
                after = evaluate([r.case for r in rs], corpus, host.calibration)
                b, a = summary(rs, headline_errors), summary(after, headline_errors)
                print(f"  {rs[0].case.split:<9}{src:<40}every case, read off {read_src} (the same host):")
                print(f"  {'':<49}{'':<13}{b[0]:>7.1%} / {b[1]:>6.1%} -> {a[0]:>6.1%} / {a[1]:>6.1%}  ({a[2]} figures)")
                out.setdefault("same_host", {})[f"{read_src} -> {src}"] = {
                    "host": host_id, "multipliers": host.multipliers,
                    "before": _stats(b),
                    "after": _stats(a),
                    "after_cases": {r.case.id: r.errors for r in after}}
    for split, (pb, pa) in sorted(pooled.items()):
        b, a = summary(pb, headline_errors), summary(pa, headline_errors)
        out[f"{split}/gpu-bound"] = {"before": _stats(b),
                                     "after": _stats(a)}
        print(f"  {split + ', gpu-bound, other cases of hosts read':<49}{'':<13}{b[0]:>7.1%} / {b[1]:>6.1%} -> "
              f"{a[0]:>6.1%} / {a[1]:>6.1%}  ({a[2]} figures)")
    return out


def main(argv=None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from llm_lb_gym import __version__
    from llm_lb_gym.calibration.corpus import corpus_digest, load_corpus
    from llm_lb_gym.calibration.serving import ServingCalibration, evaluate, fit, headline_errors

    corpus = load_corpus()

    workers = parse_workers(args.input_workers)

    def with_workers(cal):
        if workers is None:
            return cal
        if not cal.frontends:
            raise SystemExit("llm-lb-gym validate: --input-workers needs a frontend (not with --before or --no-frontend)")
        endpoint, k = workers
        fes = {ep: dataclasses.replace(fe, input_workers=k) if endpoint in (None, ep) else fe
               for ep, fe in cal.frontends.items()}
        return dataclasses.replace(cal, frontends=fes)

    if args.fit_headline and not args.fit:
        raise SystemExit("llm-lb-gym validate: --fit-headline changes the fit's objective; it needs --fit")
    if args.fit:
        print("fitting on the fitted part of the corpus:")
        start = with_workers(ServingCalibration.shipped())
        if args.kv_allocation:
            start = dataclasses.replace(start, engine_options={"kv_allocation": args.kv_allocation})
        cal = fit(corpus, start=start, itl=not args.fit_headline)
    else:
        cal = with_workers(before_calibration() if args.before else ServingCalibration.shipped())
    if args.no_frontend:
        cal = dataclasses.replace(cal, frontends={})
    if args.scale:
        cal = apply_scales(cal, args.scale)
    if args.kv_allocation:
        cal = dataclasses.replace(cal, engine_options={**cal.engine_options, "kv_allocation": args.kv_allocation})
    cases = corpus.cases if args.split == "all" else corpus.split(args.split)
    results = evaluate(cases, corpus, cal)
    print(f"llm_lb_gym {__version__}; corpus sha256 {corpus_digest()[:16]}, {len(corpus.cases)} cases; "
          f"{'kernel-profile presets, no frontend' if args.before else 'serving fit'}"
          f"{', frontend dropped' if args.no_frontend and not args.before else ''}")
    print(f"{'case':<46}{'split':<9}{'figure':<16}{'measured':>11}{'simulated':>11}{'error':>8}")
    for r in results:
        for k, v in r.case.measured.items():
            if k in r.errors:
                print(f"{r.case.id:<46}{r.case.split:<9}{k:<16}{v:>11.4g}{r.simulated[k]:>11.4g}{r.errors[k]:>+8.1%}")
    print("\nmedian / max |error| of the headline figures (duration, mean TTFT, median TPOT or their stand-ins):")
    groups: dict[tuple[str, str], list] = {}
    for r in results:
        groups.setdefault((r.case.split, r.case.source), []).append(r)
    for (split, src), rs in sorted(groups.items()):
        med, mx, n = summary(rs, headline_errors)
        print(f"  {split:<9}{src:<40}{med:>7.1%} / {mx:>6.1%}  ({n} figures)")
    report = {"version": __version__, "corpus_sha256": corpus_digest(), "before": args.before,
              "frontend": bool(cal.frontends), "splits": {}}
    for split in ("fitted", "held_out"):
        for k in ("gpu-bound", "api-bound"):
            rs = [r for r in results if r.case.split == split and kind(r.case) == k]
            if rs:
                med, mx, n = summary(rs, headline_errors)
                report["splits"][f"{split}/{k}"] = {"median": med, "max": mx, "figures": n}
                print(f"  {split + ', ' + k:<49}{med:>7.1%} / {mx:>6.1%}  ({n} figures)")
        rs = [r for r in results if r.case.split == split and "median_itl_ms" in r.errors
              and "median_itl_ms" not in headline_errors(r)]
        if rs:   # the decode step alone, where a case publishes it beside its headline figures
            med, mx, n = summary(rs, lambda r: {"itl": r.errors["median_itl_ms"]})
            report["splits"][f"{split}/median-itl"] = {"median": med, "max": mx, "figures": n}
            print(f"  {split + ', median ITL beside them':<49}{med:>7.1%} / {mx:>6.1%}  ({n} figures)")
    if args.readings:
        report["readings"] = readings_report(results, corpus, cal, headline_errors)
    if args.json:
        rows = [{"id": r.case.id, "split": r.case.split, "source": r.case.source, "measured": r.case.measured,
                 "simulated": {k: r.simulated[k] for k in r.case.measured if k in r.simulated},
                 "errors": r.errors} for r in results]
        with open(args.json, "w") as f:
            json.dump({**report, "cases": rows}, f, indent=1)
    return report


if __name__ == "__main__":
    main()
