"""RL Baselines3 Zoo near capacity: its own command line, with this package's registration.

    python -m venv zoo && . zoo/bin/activate && pip install -e ".[rl,zoo]"   # not beside ".[all]" (see below)
    python -m rl_zoo3.train --algo dqn --env LLMCluster-NearCapacity-v0 --gym-packages llm_lb_gym \\
        -conf docs/recipes/zoo_dqn.yml -f logs/ --eval-freq 20000 --eval-episodes 5
    python docs/recipes/rl_zoo.py --quick     # the same command, 600 steps on 200-request episodes

One file you can copy (with ``zoo_dqn.yml``, the hyperparameters). ``--gym-packages llm_lb_gym``
imports the package, which registers the ids (Gymnasium 1.x reads no entry points); the
``llm_lb_gym:LLMCluster-v0`` form fails the zoo's own registry check. The hyperparameter file
has an entry for ``LLMCluster-NearCapacity-v0`` (the zoo's own files have none) with the env
wrapper ``RouterRL``: rewards at O(1) and the semi-MDP discount folded into episode ends, hence
``gamma: 1.0``. The zoo's evaluation runs on the same wrapped env (its mean reward is the scaled
discounted return of the pieces between ends). rl_zoo3 2.9 requires optuna>=3 and this
package's ``sweep`` extra (in ``all``) optuna 2.x, so the zoo gets a venv of its own. This file
runs exactly that command and reads the Monitor file it wrote.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path

from rl_zoo3.train import train

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="600 steps on 200-request episodes (the tests)")
    args = p.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="zoo_"))
    quick = ["--env-kwargs", "num_requests:200", "--eval-freq", "300", "--eval-episodes", "1"]
    sys.argv = ["rl_zoo3.train", "--algo", "dqn", "--env", "LLMCluster-NearCapacity-v0",
                "--gym-packages", "llm_lb_gym", "-conf", str(HERE / "zoo_dqn.yml"),
                "-n", str(600 if args.quick else args.steps), "-f", str(logs), "--seed", str(args.seed),
                *(quick if args.quick else ["--eval-freq", "20000", "--eval-episodes", "5"])]
    train()
    monitor = next(logs.rglob("*.monitor.csv"))
    with open(monitor) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    print(f"RL zoo DQN: {len(rows)} episodes logged in {monitor}")
    if not rows:
        raise SystemExit("no episode finished: raise --steps")


if __name__ == "__main__":
    main()
