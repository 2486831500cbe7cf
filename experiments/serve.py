"""Serve: the OpenAI-compatible router service, or a simulated backend (needs the serve extra).

    llm-lb-gym serve sim --port 8001 --time-scale 1 --preset llama2-7b-v100
    llm-lb-gym serve router --port 8000 --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 \\
        --router late_binding -o period_s=0.1 -o reserve=prompt
    llm-lb-gym serve router ... --router late_binding --options-from paper_v100   # tuned options

Router options: ``-o key=value`` (values read as YAML: numbers, true/false, null), or
``--options-from EXPERIMENT``, which composes ``conf/evaluate.yaml`` with
``experiment=EXPERIMENT`` and takes ``eval.policy_options[ROUTER]`` (``-o`` overrides it).
Binds 127.0.0.1 unless ``--host`` says otherwise. docs/serving.md has the whole picture.
"""

from __future__ import annotations

import argparse
import sys

from llm_lb_gym.experiments._serve_policy import load_policy


def _options(pairs: list[str]) -> dict:
    import yaml

    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise SystemExit(f"serve: -o {p!r} is not key=value")
        out[key] = yaml.safe_load(value)
    return out


def experiment_router_options(experiment: str, router: str) -> dict:
    """``eval.policy_options[router]`` of conf/evaluate.yaml composed with ``experiment``."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("llm_lb_gym.conf", version_base=None):
        cfg = compose("evaluate", overrides=[f"experiment={experiment}"])
    opts = OmegaConf.to_container(cfg.eval.policy_options or {}, resolve=True)
    return dict(opts.get(router) or {})


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llm-lb-gym serve", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("router", help="the router service")
    r.add_argument("--backend", action="append", required=True, help="backend base URL (repeat)")
    r.add_argument("--router", default="round_robin")
    r.add_argument("-o", "--option", action="append", default=[], help="router option key=value")
    r.add_argument("--options-from", default=None, help="experiment whose eval.policy_options to use")
    r.add_argument("--policy", default=None,
                   help="llm_lb_gym.experiments.train run directory: route with its trained policy (--router is the "
                        "fallback while a backend is down)")
    r.add_argument("--policy-model", default="best_model.zip", help="model file in the --policy directory")
    r.add_argument("--model", action="append", default=None, help="model name served (repeat)")
    r.add_argument("--context-tokens", type=int, default=4096)
    r.add_argument("--tokenizer", default=None, help="local HF tokenizer directory")
    r.add_argument("--preset", default="llama2-7b-v100")
    r.add_argument("--decision-interval-s", type=float, default=0.02)
    r.add_argument("--poll-interval-s", type=float, default=0.25)
    r.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks per backend that does not export them (default: the preset's)")
    r.add_argument("--block-size", type=int, default=16)
    r.add_argument("--max-seqs", type=int, default=128)
    r.add_argument("--max-attempts", type=int, default=3)
    r.add_argument("--no-assemble-upstream", dest="assemble_upstream", action="store_false",
                   help="pass non-streamed requests through as sent (default: stream them upstream "
                        "and assemble the reply, so a client that leaves cancels them at llama.cpp)")
    r.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("sim", help="a simulated backend")
    s.add_argument("--model", default="sim-model")
    s.add_argument("--preset", default="llama2-7b-v100")
    s.add_argument("--time-scale", type=float, default=1.0)
    s.add_argument("--max-num-seqs", type=int, default=128)
    s.add_argument("--num-kv-blocks", type=int, default=None)
    for p in (r, s):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, required=True)
    return ap


def build_app(args):
    from llm_lb_gym._validate import ConfigError

    try:
        if args.what == "sim":
            from llm_lb_gym.serve.sim_backend import SimBackendConfig, create_app
            from llm_lb_gym.sim.config import EngineConfig

            eng = EngineConfig(preset=args.preset, max_num_seqs=args.max_num_seqs,
                               num_kv_blocks=args.num_kv_blocks)
            return create_app(SimBackendConfig(model=args.model, engine=eng, time_scale=args.time_scale))
        from llm_lb_gym.serve.config import RouterServiceConfig
        from llm_lb_gym.serve.router_app import create_app

        opts = experiment_router_options(args.options_from, args.router) if args.options_from else {}
        opts.update(_options(args.option))
        cfg = RouterServiceConfig(
            backends=tuple(args.backend), router=args.router, router_options=opts,
            models=tuple(args.model or ["sim-model"]), context_tokens=args.context_tokens,
            tokenizer=args.tokenizer, preset=args.preset, decision_interval_s=args.decision_interval_s,
            poll_interval_s=args.poll_interval_s, num_blocks=args.num_blocks, block_size=args.block_size,
            max_seqs=args.max_seqs, max_attempts=args.max_attempts, seed=args.seed,
            assemble_upstream=args.assemble_upstream)
        router = load_policy(args.policy, args.policy_model, cfg) if args.policy else None
        return create_app(cfg, router)
    except (ConfigError, TypeError, ValueError, OSError) as exc:
        raise SystemExit(f"llm-lb-gym serve {args.what}: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from llm_lb_gym.extras import require

    require("serve", "llm-lb-gym serve")
    app = build_app(args)
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
