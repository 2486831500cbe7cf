"""The paper's V100 figures with the shipped preset, and round robin in the paper's load regime.

The fit and the checks are ``llm_lb_gym/calibration/paper_v100.py`` (its module docstring says
how the paper's three figures are read).
"""

from __future__ import annotations

import argparse

from llm_lb_gym.calibration.paper_v100 import paper_regime, report_figures
from llm_lb_gym.sim.latency import get_preset


def main(argv=None) -> None:
    """python -m llm_lb_gym.experiments.paper_v100: the shipped V100 preset's three figures and round robin
    in the paper's load regime on the 32 GB, 16 GB and 16 GB / 1,024-window engines."""
    argparse.ArgumentParser(description=main.__doc__.splitlines()[0]).parse_args(argv)
    report_figures(get_preset("llama2-7b-v100").latency)
    paper_regime()


if __name__ == "__main__":
    main()
