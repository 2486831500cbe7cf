"""RL Baselines3 Zoo near capacity: its own command line, with this package's registration.

    python -m venv zoo && . zoo/bin/activate && pip install -e ".[rl,zoo]"   # not beside ".[all]" (see below)
    python -m rl_zoo3.train --algo dqn --env LLMCluster-NearCapacity-v0 --gym-packages llm_lb_gym \\
        -conf docs/recipes/zoo_dqn.yml -f logs/ --eval-freq 20000 --eval-episodes 5
    python docs/recipes/rl_zoo.py --quick     # the same command, 600 steps on 200-request episodes
    python docs/recipes/rl_zoo.py --algo ppo_mask   # MaskablePPO (added to the zoo's table) with zoo_ppo_mask.yml
    python docs/recipes/rl_zoo.py --algo ppo_mask --conf docs/recipes/zoo_ppo_mask_guided.yml

One file you can copy (with ``zoo_dqn.yml`` / ``zoo_ppo_mask.yml``, the hyperparameters). For
``ppo_mask`` the yml's top-level ``env_kwargs`` (an action space: ``action.kv_room`` puts
late_binding's KV-room rule in the mask) are passed as the zoo's ``--env-kwargs``, in its own
syntax (``action:dict(candidates=1,...)``), so the command printed is the one to type; without
them MaskablePPO runs on the plain action space.

``--gym-packages llm_lb_gym``
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
import json
import shlex
import sys
import tempfile
from pathlib import Path

from rl_zoo3.train import train

HERE = Path(__file__).resolve().parent


def zoo_env_kwargs(conf: Path) -> list[str]:
    """The yml's top-level ``env_kwargs`` as the zoo's ``--env-kwargs`` items (``key:value``,
    values as Python literals: the zoo evaluates them)."""
    import yaml

    kw = (yaml.safe_load(conf.read_text()) or {}).get("env_kwargs") or {}

    def lit(v):
        if isinstance(v, dict):
            return "dict(" + ",".join(f"{k}={lit(x)}" for k, x in v.items()) + ")"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(lit(x) for x in v) + "]"
        return json.dumps(v) if isinstance(v, str) else repr(v)   # "..." quotes: one shell word in '...'

    return [f"{k}:{lit(v)}" for k, v in kw.items()]


def add_maskable_ppo() -> None:
    """rl_zoo3 2.9's algorithm table has no MaskablePPO (its ``--algo`` choices: a2c, ddpg, dqn,
    ppo, sac, td3, ars, crossq, qrdqn, tqc, trpo, ppo_lstm): add sb3-contrib's under the name
    older zoos used, before the zoo builds its parser. The zoo's evaluation then calls
    ``predict`` without masks (the env's ``action.masked=fallback`` decides a masked action)."""
    from rl_zoo3.utils import ALGOS
    from sb3_contrib import MaskablePPO

    ALGOS.setdefault("ppo_mask", MaskablePPO)


def run(algo: str, steps: int, seed: int, quick: bool, conf: str | None = None) -> None:
    if algo == "ppo_mask":
        add_maskable_ppo()
    conf = Path(conf) if conf else HERE / f"zoo_{algo}.yml"
    logs = Path(tempfile.mkdtemp(prefix="zoo_"))
    env_kwargs = zoo_env_kwargs(conf) + (["num_requests:200"] if quick else [])
    quick_args = ["--eval-freq", "300", "--eval-episodes", "1"]
    if quick and algo == "ppo_mask":   # one short rollout instead of the yml's 8,192 steps
        quick_args += ["--hyperparams", "n_steps:256", "batch_size:64"]
    sys.argv = ["rl_zoo3.train", "--algo", algo, "--env", "LLMCluster-NearCapacity-v0",
                "--gym-packages", "llm_lb_gym", "-conf", str(conf),
                "-n", str(600 if quick else steps), "-f", str(logs), "--seed", str(seed),
                *(["--env-kwargs", *env_kwargs] if env_kwargs else []),
                *(quick_args if quick else ["--eval-freq", "20000", "--eval-episodes", "5"])]
    note = "  # ppo_mask: with this file's add_maskable_ppo()" if algo == "ppo_mask" else ""
    print("python -m " + shlex.join(sys.argv) + note)
    train()
    monitor = next(logs.rglob("*.monitor.csv"))
    with open(monitor) as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    print(f"RL zoo {algo}: {len(rows)} episodes logged in {monitor}")
    if not rows:
        raise SystemExit("no episode finished: raise --steps")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", choices=("dqn", "ppo_mask"), default=None,
                   help="default: dqn, or both with --quick")
    p.add_argument("--steps", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="600 steps on 200-request episodes (the tests)")
    p.add_argument("--conf", default=None, help="hyperparameter file (default: zoo_<algo>.yml beside this "
                                                 "file), e.g. zoo_ppo_mask_guided.yml with --algo ppo_mask")
    args = p.parse_args()
    algos = [args.algo] if args.algo else (["dqn", "ppo_mask"] if args.quick else ["dqn"])
    for algo in algos:
        run(algo, args.steps, args.seed, args.quick, args.conf)


if __name__ == "__main__":
    main()
