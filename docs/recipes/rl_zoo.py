"""RL Baselines3 Zoo on LLMCluster-v0: its own command line, with this package's registration.

    pip install -e ".[rl]" rl_zoo3
    python -m rl_zoo3.train --algo dqn --env LLMCluster-v0 --gym-packages llm_lb_gym \\
        --env-kwargs num_requests:200 -conf docs/recipes/zoo_dqn.yml -f logs/ --eval-freq -1

``--gym-packages llm_lb_gym`` imports the package, which registers the id (Gymnasium 1.x reads
no entry points); the ``llm_lb_gym:LLMCluster-v0`` form fails the zoo's own registry check.
``--env-kwargs num_requests:200`` shortens episodes from 2,000 requests to 200, so the zoo's
Monitor logs episodes within a short run (each 2,000-request episode is ~2,000 steps). The zoo
has no hyperparameters for this env: ``-conf docs/recipes/zoo_dqn.yml`` gives them. This file
runs exactly that command (``--quick``: 600 steps) and reads the Monitor file it wrote.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path

from rl_zoo3.train import train

from _common import parse

HERE = Path(__file__).resolve().parent


def main() -> None:
    args = parse(__doc__.splitlines()[0], steps=5_000)
    logs = Path(tempfile.mkdtemp(prefix="zoo_"))
    sys.argv = ["rl_zoo3.train", "--algo", "dqn", "--env", "LLMCluster-v0",
                "--gym-packages", "llm_lb_gym", "--env-kwargs", "num_requests:200",
                "-conf", str(HERE / "zoo_dqn.yml"), "-n", str(max(args.steps, 600)),
                "--eval-freq", "-1", "-f", str(logs), "--seed", str(args.seed)]
    train()
    monitor = next(logs.rglob("*.monitor.csv"))
    with open(monitor) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    print(f"RL zoo DQN: {len(rows)} episodes logged in {monitor}")
    if not rows:
        raise SystemExit("no episode finished: raise --steps")


if __name__ == "__main__":
    main()
