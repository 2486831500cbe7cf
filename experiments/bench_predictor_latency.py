"""CPU latency of saved bucket predictors per batch of held-out prompts (default 64), measured.

    python -m llm_lb_gym.experiments.bench_predictor_latency artifacts/predictor/transformer-time4 \\
        artifacts/predictor/light-time4 [--repeats 20] [--threads 2] [--reference]
    python -m llm_lb_gym.experiments.bench_predictor_latency \\
        artifacts/predictor/transformer-time4@runtime=torch artifacts/predictor/transformer-time4

``PATH@key=value,...`` loads a transformer with inference overrides (runtime, quantize,
micro_batch, inference_max_length, threads). Every model runs on the same random batches of
the test split (its task names as the hint), one batch after another in turn, after one
warm-up batch. Reported per model: wall-clock median, minimum and 90th percentile, and the
median process CPU time per batch (other processes stretch wall time, not the CPU time this
one uses). The machine may be shared, so the 1-minute load average is printed before and
after the run (the one after includes this process, about ``--threads`` while running), and
``other_processes_cores``: the CPU time all other processes used during the measurement, per
second of it (0 on an idle machine, 1 while another job keeps one core busy; from /proc/stat).

``--reference`` adds the plain MiniLM-L6 forward pass (torch fp32, max length 64, one padded
batch, no hint), a fixed point of comparison across machines and commits, not a target.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

REFERENCE = "reference: MiniLM-L6 torch fp32, length 64, one padded batch"


def reference_model(max_length: int = 64):
    """The plain MiniLM classifier forward pass (fp32, one padded batch)."""
    import torch
    from llm_lb_gym.predictor.transformer import PACKAGED_MODEL, _load, resolve_base_model

    tok, model = _load(resolve_base_model(PACKAGED_MODEL), 4)
    model.eval()

    def run(corpus):
        enc = tok(list(corpus.prompts), truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        with torch.inference_mode():
            model(**enc)
    return run


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has been busy (all processes), from /proc/stat; None
    where there is no /proc/stat."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(v) for v in fh.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def parse_spec(spec: str) -> tuple[str, dict]:
    """``PATH[@key=value,...]`` -> (path, overrides); values are ints, booleans or strings."""
    path, _, opts = spec.partition("@")
    out = {}
    for item in filter(None, opts.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"bad override {item!r} in {spec!r}: expected key=value")
        low = value.lower()
        out[key] = True if low == "true" else False if low == "false" else int(value) if value.isdigit() else value
    return path, out


def measure(fns: dict, batches: list) -> dict:
    """Interleaved timing: batch 0 warms every model up and is not counted."""
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for i, b in enumerate(batches):
        for name, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn(b)
            if i:
                wall[name].append((time.perf_counter() - t0) * 1e3)
                cpu[name].append((time.process_time() - c0) * 1e3)
    out = {}
    for name in fns:
        w, c = np.asarray(wall[name]), np.asarray(cpu[name])
        out[name] = {"median_ms": round(float(np.median(w)), 2), "min_ms": round(float(w.min()), 2),
                     "p90_ms": round(float(np.percentile(w, 90)), 2),
                     "cpu_ms_median": round(float(np.median(c)), 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="saved predictor directories, optionally PATH@key=value,...")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads; ONNX Runtime micro-batches at once")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reference", action="store_true", help="also time the plain fp32 MiniLM forward pass")
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from llm_lb_gym.data import DEFAULT_CORPUS, locate, read_corpus
    from llm_lb_gym.predictor.card import ModelCard
    from llm_lb_gym.predictor.evaluation import load_bucket_model, predict_corpus

    specs = [parse_spec(s) for s in args.models]
    cards = [ModelCard.load(path) for path, _ in specs]
    uses_torch = args.reference or any(
        c.kind == "transformer" and o.get("runtime", c.settings.get("runtime", "onnx")) == "torch"
        for (_, o), c in zip(specs, cards))
    if uses_torch:
        import torch
        torch.set_num_threads(args.threads)

    test = read_corpus(locate(DEFAULT_CORPUS)).split("test")
    rng = np.random.default_rng(args.seed)
    batches = [test.take(rng.choice(len(test), args.batch, replace=False)) for _ in range(args.repeats + 1)]
    fns = {}
    if args.reference:
        fns[REFERENCE] = reference_model()
    for (path, opts), card in zip(specs, cards):
        if card.kind == "transformer":
            opts = {"threads": args.threads} | opts
        model = load_bucket_model(path, **opts)
        name = path + ("@" + ",".join(f"{k}={v}" for k, v in opts.items()) if opts else "")
        fns[name] = lambda c, m=model: predict_corpus(m, c)
    load_before = os.getloadavg()[0]
    busy0, own0, t0 = busy_cpu_s(), time.process_time(), time.perf_counter()
    results = measure(fns, batches)
    busy1, own1, wall = busy_cpu_s(), time.process_time(), time.perf_counter() - t0
    out = {"threads": args.threads, "batch": args.batch, "repeats": args.repeats, "seed": args.seed,
           "cpu_count": os.cpu_count(), "load_average_1min_before": round(load_before, 2),
           "load_average_1min_after": round(os.getloadavg()[0], 2)}
    if busy0 is not None:
        # Cores kept busy by everything but this process while it measured: ~0 on an idle machine.
        out["other_processes_cores"] = round(max(0.0, (busy1 - busy0) - (own1 - own0)) / wall, 2)
    out["models"] = results
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
