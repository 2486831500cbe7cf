"""Simulate your own vLLM server: read its constants off a few lone requests, write its engine config.

    llm-lb-gym read_host --model-config path/to/config.json --gpu h100-80gb --endpoint completions \\
        --engine-version 0.30.0 --reading 128,128,14.2,6.83 --reading 8192,512,254,7.30 --out-dir myconf
    llm-lb-gym train 'hydra.searchpath=[file://myconf]' engine=myhost   # or evaluate, benchmark, ...

Send your server requests one at a time (nothing else running; e.g. ``vllm bench serve
--max-concurrency 1 --random-input-len P --random-output-len O --ignore-eos``) and give each
shape's prompt and output tokens with its measured TTFT and median ITL (ms) as
``--reading P,O,TTFT_MS,ITL_MS``: one shape pins the frontend's per-request cost and the
weight-read factor, two shapes whose prompts are at least 2x apart also the compute (prefill) and
KV-read (long-context decode) factors (``calibration/host_readings.py``, docs/calibration.md: on
silybench's H100 the five lone-request shapes bring its 25 loaded cases from 49.7% to 4.0% median
error; the closed loops' TTFT tails and a busy API server's per-stream cost are not in lone
requests). The engine config written is the serving fit's (``engine.latency_fit=serving``, the
endpoint's frontend, the engine generation's defaults at that release) with the fitted latency
coefficients and frontend written out, as ``DIR/engine/NAME.yaml``. A server started with
``--quantization fp8`` is read with ``--quantization fp8`` (docs/hardware.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ENGINE_NAME = "myhost"


def parser() -> argparse.ArgumentParser:
    from llm_lb_gym.calibration.corpus import ENDPOINTS
    from llm_lb_gym.sim.architecture import QUANTIZATIONS

    ap = argparse.ArgumentParser(prog="llm-lb-gym read_host", description=__doc__.splitlines()[0])
    ap.add_argument("--model-config", required=True, help="the served model's Hugging Face config.json (or its folder)")
    ap.add_argument("--gpu", required=True, help="a built-in GPU name (llm_lb_gym.sim.gpus.GPUS)")
    ap.add_argument("--tensor-parallel", type=int, default=1)
    ap.add_argument("--endpoint", choices=ENDPOINTS, default="completions",
                    help="the API your clients call: completions (/v1/completions) or chat (/v1/chat/completions)")
    ap.add_argument("--generation", default="vllm-v1", help="the engine generation (sim/generations.py)")
    ap.add_argument("--engine-version", required=True,
                    help="the vLLM release, e.g. 0.30.0 (its defaults: async scheduling from 0.14.0)")
    ap.add_argument("--max-model-len", type=int, default=None, help="the server's --max-model-len (default: the model's)")
    ap.add_argument("--quantization", default=None, choices=tuple(QUANTIZATIONS),
                    help="the server's --quantization (default: the model config's)")
    ap.add_argument("--reading", action="append", default=[], metavar="P,O,TTFT_MS,ITL_MS",
                    help="one lone-request shape: prompt tokens, output tokens, measured TTFT and median ITL in ms "
                         "(repeatable)")
    ap.add_argument("--out-dir", default=None, help="write DIR/engine/NAME.yaml (a Hydra search path's engine option)")
    ap.add_argument("--name", default=ENGINE_NAME, help=f"the engine option's name (default {ENGINE_NAME})")
    return ap


def parse_reading(item: str) -> tuple[int, int, float, float]:
    parts = item.split(",")
    try:
        p, o, ttft, itl = int(parts[0]), int(parts[1]), float(parts[2]), float(parts[3])
        ok = len(parts) == 4 and p >= 1 and o >= 2 and ttft > 0 and itl > 0
    except (ValueError, IndexError):
        ok = False
    if not ok:
        raise SystemExit(f"llm-lb-gym read_host: --reading {item!r}; expected P,O,TTFT_MS,ITL_MS: prompt tokens >= 1, "
                         "output tokens >= 2, TTFT and median ITL in ms > 0 (e.g. 128,128,14.2,6.83)")
    return p, o, ttft, itl


def readings_corpus(args, readings):
    """A corpus of one model (the config.json) and one case per reading: a closed loop of one."""
    from llm_lb_gym.calibration.corpus import Case, Corpus, Workload

    path = Path(args.model_config)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"llm-lb-gym read_host: --model-config {args.model_config!r}: cannot read a config.json ({err})")
    corpus = Corpus((), {"yours": {"hf_id": str(path), "config": config}}, {}, "")
    options = {k: v for k, v in (("max_model_len", args.max_model_len), ("quantization", args.quantization)) if v}
    cases = tuple(Case(id=f"reading-{i}-p{p}", source="yours", split="fitted", engine="vllm",
                       engine_version=args.engine_version, generation=args.generation, model="yours",
                       gpu=args.gpu, tensor_parallel=args.tensor_parallel, endpoint=args.endpoint,
                       workload=Workload("closed", 2, p, o, 1), engine_options=options,
                       measured={"median_ttft_ms": ttft, "median_itl_ms": itl})
                  for i, (p, o, ttft, itl) in enumerate(readings))
    return dataclasses.replace(corpus, cases=cases), path


def _plain(v):
    """YAML's types: dataclasses as mappings, tuples as lists, numpy scalars as Python's."""
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v.item() if hasattr(v, "item") else v


def engine_yaml(engine, model_config: Path, comment: str) -> str:
    """The engine group's YAML: every ``EngineConfig`` field, the fitted coefficients written out."""
    import yaml

    fields_ = _plain(engine)
    fields_["model_config"] = str(model_config.resolve())
    return comment + yaml.safe_dump(fields_, sort_keys=False)


def main(argv=None) -> dict:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from llm_lb_gym._validate import ConfigError
    from llm_lb_gym.calibration.host_readings import fit_host
    from llm_lb_gym.calibration.serving import ServingCalibration, case_engine
    from llm_lb_gym.sim.generations import GENERATIONS, generation_options
    from llm_lb_gym.sim.gpus import GPUS, get_gpu

    if args.gpu not in GPUS:
        raise SystemExit(f"llm-lb-gym read_host: --gpu {args.gpu!r}; allowed: {', '.join(GPUS)}")
    if args.generation not in GENERATIONS:
        raise SystemExit(f"llm-lb-gym read_host: --generation {args.generation!r}; allowed: {', '.join(GENERATIONS)}")
    if not args.reading:
        raise SystemExit("llm-lb-gym read_host: give at least one --reading P,O,TTFT_MS,ITL_MS (a lone request's)")
    if not args.name.isidentifier():
        raise SystemExit(f"llm-lb-gym read_host: --name {args.name!r}; allowed: a name of letters, digits and _")
    try:   # the release names the engine generation's defaults (sim/generations.py)
        generation_options(args.generation, get_gpu(args.gpu), args.engine_version)
    except ConfigError as err:
        raise SystemExit(f"llm-lb-gym read_host: --engine-version: {err}")
    corpus, path = readings_corpus(args, [parse_reading(r) for r in args.reading])
    try:
        host = fit_host(corpus.cases, corpus, ServingCalibration.shipped())
        engine = case_engine(corpus.cases[0], corpus, host.calibration)
    except (ConfigError, ValueError) as err:
        raise SystemExit(f"llm-lb-gym read_host: {err}")
    print("multipliers of the serving fit's constants: "
          + ", ".join(f"{k} x{v:.3g}" for k, v in host.multipliers.items()))
    for key, err in host.residuals.items():
        print(f"  {key:<36} simulated / measured - 1 = {err:+.1%}")
    out = {"multipliers": host.multipliers, "residuals": host.residuals}
    if args.out_dir:   # the option is for the Hydra commands: their extra writes it
        from llm_lb_gym.extras import require

        require("eval", "llm-lb-gym read_host --out-dir", ("yaml", "omegaconf"))
        target = Path(args.out_dir) / "engine" / f"{args.name}.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        readings = " ".join(args.reading)
        target.write_text(engine_yaml(engine, path, f"# llm-lb-gym read_host: {args.gpu}, {args.endpoint}, "
                                                    f"{args.generation} {args.engine_version}; readings "
                                                    f"{readings}\n# multipliers {json.dumps(host.multipliers)}\n"
                                                    "# latency: the fitted coefficients (they override latency_fit's)\n"))
        print(f"wrote {target}; use it with: 'hydra.searchpath=[file://{Path(args.out_dir).resolve()}]' engine={args.name}")
        out["engine_yaml"] = str(target)
    return out


if __name__ == "__main__":
    main()
