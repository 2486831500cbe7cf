"""Figures of a finished run, re-rendered from the files it wrote (no simulation, no training).

    python -m llm_lb_gym.experiments.figures outputs/reproduce/<run>                 # PNGs into the run dir
    python -m llm_lb_gym.experiments.figures outputs/reproduce/<run> --out docs/figures
    python -m llm_lb_gym.experiments.figures outputs/load_sweep/<run> multirun/reproduce/<time>

What each kind of run gets (every PNG named after what it shows):

- a ``reproduce`` run (``reproduction.json``; every one found below the folder, so a sweep of
  reproductions works too): ``<setting>_reduction.png``, the reduction of mean E2E vs round
  robin per router (the paper's sign: positive = faster) with its paired 95% CI over the test
  episodes, the paper's value marked where it reported one (``eval/results.csv`` and the run's
  ``resolved_config.yaml``); and ``<setting>_learning_curves.png``, each trained variant's
  validation mean E2E against training episodes (``<variant>/train_summary.json``), round
  robin's on the same validation seeds dashed.
- a ``load_sweep`` run (``load_sweep.md`` and ``load_<factor>/results.csv``):
  ``load_sweep_gain.png``, each router's reduction of mean E2E vs round robin against the load
  factor, with 95% CIs.

``llm_lb_gym.experiments.reproduce`` and ``llm_lb_gym.experiments.load_sweep`` call the same functions at the end of a
run (``figures=true``); the copies in ``docs/figures/`` are made with ``--out docs/figures``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llm_lb_gym.experiments._figures import BASELINE, load_sweep_figure, read_results, reductions, reproduce_figures  # noqa: F401


def render(run: Path, out: Path | None = None) -> list[Path]:
    """Every figure of the runs found at or below ``run`` (reproduce and load_sweep runs)."""
    run = Path(run)
    found = sorted(run.rglob("reproduction.json")) + sorted(run.rglob("load_sweep.md"))
    written: list[Path] = []
    for f in found:
        dest = Path(out) if out is not None else f.parent
        dest.mkdir(parents=True, exist_ok=True)
        # Runs of a sweep written to one --out folder are told apart by their job folder.
        rel = f.parent.relative_to(run).as_posix()
        prefix = "" if out is None or rel == "." else rel.replace("/", "_") + "_"
        if f.name == "reproduction.json":
            written += reproduce_figures(f.parent, dest, prefix)
        else:
            written.append(load_sweep_figure(f.parent, dest, prefix))
    if not written:
        raise FileNotFoundError(f"{run}: no reproduce run (reproduction.json) or load_sweep run "
                                f"(load_sweep.md) found at or below it")
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llm_lb_gym.experiments.figures",
                                 description="Re-render the figures of finished reproduce / load_sweep runs.")
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (or folders above them)")
    ap.add_argument("--out", type=Path, default=None, help="write the PNGs here (default: each run's dir)")
    args = ap.parse_args(argv)
    for run in args.runs:
        for path in render(run, args.out):
            print(path)


if __name__ == "__main__":
    main()
