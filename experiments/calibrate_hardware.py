"""Fit the roofline efficiency factors on the profiled GPUs; print errors and the preset catalog.

The fit itself is ``llm_lb_gym/calibration/calibrate_hardware.py`` (its module docstring says how and why).
Run: ``python -m llm_lb_gym.experiments.calibrate_hardware [--data-dir DIR] [--no-table]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

from llm_lb_gym.calibration.calibrate_hardware import HardwareCalibration, calibrate_hardware


def main(argv: Sequence[str] | None = None) -> HardwareCalibration:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, default=None,
                    help="folder holding profiling/vidur/ (default: the registered datasets)")
    ap.add_argument("--no-table", action="store_true", help="skip the table of shipped presets")
    args = ap.parse_args(argv)
    return calibrate_hardware(args.data_dir, table=not args.no_table)


if __name__ == "__main__":
    main()
