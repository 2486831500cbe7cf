"""Calibrate the iteration-time model against Vidur's GPU profiles; fit the V100 preset.

The fit itself is ``llm_lb_gym/calibration/calibrate.py`` (its module docstring says how and why).
Run: ``python -m llm_lb_gym.experiments.calibrate [--data-dir DIR] [--preset NAME ...] [--weighting W] [--bound]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from llm_lb_gym.calibration.calibrate import DERIVED_PRESETS, FITTED_PRESETS, WEIGHTINGS, Calibration, calibrate


def main(argv: Sequence[str] | None = None) -> Calibration:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="folder holding profiling/vidur/ (default: the registered datasets, found "
                         "and checked by llm_lb_gym.data: $LLM_LB_GYM_DATA, ../shared/data or the "
                         "user cache)")
    ap.add_argument("--preset", action="append", choices=FITTED_PRESETS + DERIVED_PRESETS,
                    help="preset to calibrate (repeatable; default: all)")
    ap.add_argument("--weighting", choices=WEIGHTINGS, default="relative",
                    help="least squares on relative (default) or absolute errors")
    ap.add_argument("--bound", action="store_true",
                    help="also print, per profiled preset, the least max |relative error| any "
                         "coefficients of the formula can reach (minimax linear programs; ~10 s)")
    args = ap.parse_args(argv)
    return calibrate(args.data_dir, args.preset or FITTED_PRESETS + DERIVED_PRESETS, args.weighting,
                     bound=args.bound)


if __name__ == "__main__":
    main()
