"""Serve: the OpenAI-compatible router service, or a simulated backend (needs the serve extra).

    llm-lb-gym serve sim --port 8001 --time-scale 1 --preset llama2-7b-v100
    llm-lb-gym serve router --port 8000 --backend http://127.0.0.1:8001 --backend http://127.0.0.1:8002 \\
        --router late_binding -o period_s=0.1 -o reserve=prompt
    llm-lb-gym serve router ... --router late_binding --options-from paper_v100   # tuned options
    llm-lb-gym serve router ... --router scored_binding --options-from runs/search/scored_binding.yaml
    llm-lb-gym serve router ... --policy outputs/improve/RUN          # the network improve trained

Router options: ``-o key=value`` (typed by the router's options: ``period_s=1e9`` is a number,
``max_wait_s=null`` None), or ``--options-from SPEC``: an experiment (``conf/evaluate.yaml``
composed with ``experiment=SPEC``, ``eval.policy_options[ROUTER]``), an options file
(``{ROUTER: {...}}``, e.g. ``policy_search``'s ``scored_binding.yaml``, or a run's
``resolved_config.yaml``) or a directory holding ``ROUTER.yaml``; ``-o`` overrides it.
``--policy``: an ``improve`` or ``train`` run directory (or its model file); ``--router`` is then
the router while a backend is down (default: the network's own fallback).
Binds 127.0.0.1 unless ``--host`` says otherwise. docs/serving.md has the whole picture.
"""

from __future__ import annotations

import argparse
import sys

from llm_lb_gym.experiments._hydra import CONF_DIR
from llm_lb_gym.experiments._serve_policy import experiment_router_options, load_policy, served_router_options

__all__ = ["experiment_router_options", "load_policy", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="llm-lb-gym serve", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    r = sub.add_parser("router", help="the router service")
    r.add_argument("--backend", action="append", required=True, help="backend base URL (repeat)")
    r.add_argument("--router", default=None, help="a served router (default round_robin; with --policy "
                   "the router while a backend is down, default the network's own fallback)")
    r.add_argument("-o", "--option", action="append", default=[], help="router option key=value")
    r.add_argument("--options-from", default=None,
                   help="an experiment, an options file ({ROUTER: {...}}) or a directory holding ROUTER.yaml")
    r.add_argument("--policy", default=None,
                   help="an llm-lb-gym improve or train run directory (or its model file): route with its "
                        "trained network")
    r.add_argument("--policy-model", default=None,
                   help="model file in the --policy directory (default: best_policy.pt, then best_model.zip)")
    r.add_argument("--model", action="append", default=None, help="model name served (repeat)")
    r.add_argument("--context-tokens", type=int, default=4096)
    r.add_argument("--tokenizer", default=None, help="local HF tokenizer directory")
    r.add_argument("--engine", default=None,
                   help="the backends' engine as the simulator models it: a conf/engine name (vllm_v1_h100, ...) "
                        "or a YAML file of its fields; it then sets the latency model, async scheduling, frontend, "
                        "KV blocks, block size and batch slots (instead of the four options below)")
    r.add_argument("--preset", default=None, help="latency preset of the estimates (default llama2-7b-v100)")
    r.add_argument("--decision-interval-s", type=float, default=0.02)
    r.add_argument("--poll-interval-s", type=float, default=0.25)
    r.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks per backend that does not export them (default: the preset's)")
    r.add_argument("--block-size", type=int, default=None, help="(default 16)")
    r.add_argument("--max-seqs", type=int, default=None, help="batch slots per backend (default 128)")
    r.add_argument("--max-attempts", type=int, default=3,
                   help="backends tried per request before its first byte (default 3)")
    faults = r.add_argument_group("faults (docs/serving.md, Faults)")
    for flag, help_ in (("--connect-timeout-s", "upstream connect deadline (3)"),
                        ("--first-byte-timeout-s", "deadline for a backend's response headers (30)"),
                        ("--idle-timeout-s", "longest silence of an upstream stream, first token included (120)"),
                        ("--request-timeout-s", "whole-reply deadline of a non-streamed pass-through request (600)"),
                        ("--queue-timeout-s", "longest wait at the router before a 503 (60)"),
                        ("--retry-backoff-s", "wait before a retry, doubling per attempt (0.05)"),
                        ("--health-interval-s", "period of each backend's /health probe (0.5)"),
                        ("--health-timeout-s", "a probe not answered within this fails (2)"),
                        ("--drain-timeout-s", "on SIGTERM, how long requests in flight may finish (30)")):
        faults.add_argument(flag, type=float, default=None, help=help_)
    for flag, help_ in (("--health-fails", "failed probes in a row that take a backend out (3)"),
                        ("--health-successes", "good probes in a row that bring it back (2)"),
                        ("--fail-threshold", "failed requests in a row that take it out (3)"),
                        ("--max-body-bytes", "largest request body accepted (8 MiB)")):
        faults.add_argument(flag, type=int, default=None, help=help_)
    r.add_argument("--no-assemble-upstream", dest="assemble_upstream", action="store_false",
                   help="pass non-streamed requests through as sent (default: stream them upstream "
                        "and assemble the reply, so a client that leaves cancels them at llama.cpp)")
    r.add_argument("--seed", type=int, default=0,
                   help="seed of the router's generator (random, power_of_two; default 0)")
    r.add_argument("--backend-header", action="store_true",
                   help="name each reply's backend in an x-llm-lb-backend header (its URL; default off)")
    s = sub.add_parser("sim", help="a simulated backend")
    s.add_argument("--model", default="sim-model")
    s.add_argument("--engine", default=None,
                   help="a conf/engine name (vllm_v1_h100, ...) or a YAML file of EngineConfig fields; "
                        "--max-num-seqs and --num-kv-blocks override it when given")
    s.add_argument("--preset", default=None, help="latency preset (default llama2-7b-v100; not with --engine)")
    s.add_argument("--time-scale", type=float, default=1.0)
    s.add_argument("--max-num-seqs", type=int, default=None, help="(default 128, or the engine's)")
    s.add_argument("--num-kv-blocks", type=int, default=None)
    for p in (r, s):
        p.add_argument("--host", default="127.0.0.1")
        p.add_argument("--port", type=int, required=True)
    return ap


_FAULT_OPTIONS = ("connect_timeout_s", "first_byte_timeout_s", "idle_timeout_s", "request_timeout_s",
                  "queue_timeout_s", "retry_backoff_s", "health_interval_s", "health_timeout_s",
                  "drain_timeout_s", "health_fails", "health_successes", "fail_threshold", "max_body_bytes")


def _fault_options(args) -> dict:
    """The fault options given on the command line (the rest keep RouterServiceConfig's defaults)."""
    return {k: getattr(args, k) for k in _FAULT_OPTIONS if getattr(args, k, None) is not None}


def engine_options(spec: str) -> dict:
    """``--engine SPEC``: the fields of a ``conf/engine`` file named SPEC (``vllm_v1_h100``), or
    of the YAML file SPEC; what ``engine=SPEC`` gives an experiment, so the service estimates
    with the engine a router was trained on."""
    from pathlib import Path

    import yaml

    from llm_lb_gym._validate import ConfigError

    path = Path(spec)
    if not path.is_file():
        named = Path(CONF_DIR) / "engine" / f"{spec}.yaml"
        if not named.is_file():
            names = sorted(p.stem for p in (Path(CONF_DIR) / "engine").glob("*.yaml"))
            raise ConfigError(f"--engine {spec}: no such file or conf/engine name; allowed: a YAML file or one of "
                              f"{', '.join(names)}")
        path = named
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"--engine {path}: not YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"--engine {path}: expected a mapping of EngineConfig fields, found {type(data).__name__}")
    return data


def build_app(args):
    from llm_lb_gym._validate import ConfigError

    try:
        if args.what == "sim":
            from llm_lb_gym.serve.sim_backend import SimBackendConfig, create_app
            from llm_lb_gym.sim.config import EngineConfig

            if args.engine and args.preset:
                raise ConfigError(f"--engine {args.engine} sets the latency model: drop --preset {args.preset}")
            # Unset: EngineConfig's own defaults (preset llama2-7b-v100, 128 sequences).
            opts = engine_options(args.engine) if args.engine else {}
            for key, value in (("preset", args.preset), ("max_num_seqs", args.max_num_seqs),
                               ("num_kv_blocks", args.num_kv_blocks)):
                if value is not None:
                    opts[key] = value
            eng = EngineConfig(**opts)
            return create_app(SimBackendConfig(model=args.model, engine=eng, time_scale=args.time_scale))
        from llm_lb_gym.serve.config import RouterServiceConfig
        from llm_lb_gym.serve.router_app import create_app

        from llm_lb_gym.serve.config import typed_router_options

        name = args.router or "round_robin"
        opts = served_router_options(args.options_from, name)
        opts.update(typed_router_options(name, args.option))
        backend = {k: getattr(args, k) for k in ("preset", "num_blocks", "block_size", "max_seqs")
                   if getattr(args, k) is not None}
        if args.engine:
            if backend:
                raise ConfigError(f"--engine {args.engine} sets the latency model, KV blocks, block size and batch "
                                  f"slots: drop {', '.join('--' + k.replace('_', '-') for k in backend)}")
            backend = {"engine": engine_options(args.engine)}
        cfg = RouterServiceConfig(
            backends=tuple(args.backend), router=name, router_options=opts,
            models=tuple(args.model or ["sim-model"]), context_tokens=args.context_tokens,
            tokenizer=args.tokenizer, decision_interval_s=args.decision_interval_s,
            poll_interval_s=args.poll_interval_s, max_attempts=args.max_attempts, seed=args.seed,
            assemble_upstream=args.assemble_upstream, backend_header=args.backend_header, **backend, **_fault_options(args))
        router = None
        if args.policy:
            fallback = None if args.router is None and not (args.option or args.options_from) else name
            router = load_policy(args.policy, args.policy_model, cfg, fallback, opts)
        return create_app(cfg, router)
    except (ConfigError, TypeError, ValueError, OSError) as exc:
        raise SystemExit(f"llm-lb-gym serve {args.what}: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    from llm_lb_gym.extras import require

    require("serve", "llm-lb-gym serve")
    app = build_app(args)
    import uvicorn

    # On SIGTERM uvicorn stops accepting, lets requests in flight finish for the drain bound,
    # then cancels the rest (each closes its upstream connection) and runs the app's shutdown.
    drain = app.state.service.cfg.drain_timeout_s if args.what == "router" else 5.0
    # proxy_headers off: no X-Forwarded-* rewriting layer per request (the router is the edge).
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                timeout_graceful_shutdown=drain, proxy_headers=False, server_header=False)


if __name__ == "__main__":
    main()
