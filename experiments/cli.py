"""``llm-lb-gym COMMAND [ARGS...]``: one installed name for the experiment commands.

Each command is a module of this package, and its arguments go to it unchanged (Hydra
overrides, or the options of the argparse commands), so ``llm-lb-gym train reward=baseline``
runs ``python -m llm_lb_gym.experiments.train reward=baseline``; ``llm-lb-gym train --help`` shows Hydra's
help for it. Commands are also accepted with dashes (``load-sweep``).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from typing import Sequence

from llm_lb_gym.extras import missing_extra_message

PROG = "llm-lb-gym"
COMMANDS = ("train", "evaluate", "reproduce", "load_sweep", "bench", "soak", "calibrate",
            "calibrate_hardware", "paper_v100", "tune_late_binding", "train_predictor",
            "eval_predictor", "bench_lookahead", "bench_predictor_latency", "merge", "improve",
            "policy_search", "serve", "loadgen", "bench_serve", "calibrate_llamacpp", "sim_to_real",
            "validate", "read_host", "benchmark", "robust")
"""Modules of ``llm_lb_gym.experiments`` with a ``main()`` that reads ``sys.argv``."""


def summary(command: str) -> str:
    """The first line of the command module's docstring, read without importing it (the
    commands import torch and SB3; ``--help`` should not)."""
    spec = importlib.util.find_spec(f"llm_lb_gym.experiments.{command}")
    with open(spec.origin, encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read())) or ""
    return doc.strip().splitlines()[0].replace("``", "") if doc.strip() else ""


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"usage: {PROG} COMMAND [ARGS...]", "",
             "Runs python -m llm_lb_gym.experiments.COMMAND with ARGS (Hydra overrides such as",
             "experiment=debug env.arrival_rate_rps=40, or the command's own options);",
             f"'{PROG} COMMAND --help' shows the command's help.", "", "commands:"]
    lines += [f"  {c:<{width}}  {summary(c)}" for c in COMMANDS]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to ``experiments.<command>.main`` with ``sys.argv`` set as that command sees
    it; returns the exit status (the command's own errors exit as they would alone)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(usage(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        from llm_lb_gym import __version__

        print(f"{PROG} {__version__}")
        return 0
    command = args[0].replace("-", "_")
    if command not in COMMANDS:
        print(f"{PROG}: unknown command {args[0]!r}; allowed: {', '.join(COMMANDS)} "
              f"(see {PROG} --help)", file=sys.stderr)
        return 2
    saved = sys.argv
    sys.argv = [f"{PROG} {command}", *args[1:]]   # argparse's prog, and the run record's command
    try:
        importlib.import_module(f"llm_lb_gym.experiments.{command}").main()
    except ModuleNotFoundError as exc:   # a core-only install: name the extra, skip the traceback
        message = missing_extra_message(exc)
        if message is None:
            raise
        print(f"{PROG} {command}: {message}", file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
