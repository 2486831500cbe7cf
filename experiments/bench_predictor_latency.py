"""Paired CPU latency of saved bucket predictors against a fixed reference, per batch of 64.

On a shared machine wall times swing 2-3x with other users' load, so each saved model is timed
interleaved, batch by batch, with a reference: the plain MiniLM-L6 forward pass in fp32 at max
length 64, one padded batch, no hint (the configuration the project issue quotes at about
370 ms on this machine when idle). The ratio model / reference is stable under load, and
ratio x 370 ms estimates the idle latency.

    python -m experiments.bench_predictor_latency artifacts/predictor/transformer-time4 \\
        artifacts/predictor/light-time4 [--repeats 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    torch.set_num_threads(args.threads)
    from llm_lb_gym.predictor.corpus import default_corpus_path, read_corpus
    from llm_lb_gym.predictor.evaluation import load_bucket_model, predict_corpus

    test = read_corpus(default_corpus_path()).split("test")
    rng = np.random.default_rng(args.seed)
    batches = [test.take(rng.choice(len(test), args.batch, replace=False)) for _ in range(args.repeats + 1)]
    fns = {"reference_fp32_L64": reference_model()}
    for path in args.models:
        model = load_bucket_model(path)
        fns[path] = lambda c, m=model: predict_corpus(m, c)
    times = {k: [] for k in fns}
    for i, b in enumerate(batches):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(b)
            if i:
                times[name].append((time.perf_counter() - t0) * 1e3)
    ref = np.asarray(times["reference_fp32_L64"])
    out = {"threads": args.threads, "batch": args.batch, "repeats": args.repeats,
           "load_average_1min": os.getloadavg()[0], "models": {}}
    for name, t in times.items():
        t = np.asarray(t)
        out["models"][name] = {"median_ms": float(np.median(t)), "min_ms": float(t.min()),
                               "ratio_to_reference_median": float(np.median(t / ref)),
                               "idle_estimate_ms": float(np.median(t / ref) * 370.0)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
