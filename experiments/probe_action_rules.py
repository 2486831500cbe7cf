"""Simple rules on a masked action space, no learning: what an agent of that space could learn
beyond its random policy (``docs/environment.md``, "Stock agents near capacity").

    python -m llm_lb_gym.experiments.probe_action_rules \\
        --action '{"candidates": 4, "order": "shortest", "kv_room": "full", "hold_without_room_only": true}' \\
        --seeds 1000 1001 1002 1003 1004 1005 1006 1007 1008 1009 --rules random c0_room c0_rand crand_room

A rule is ``<candidate>_<instance>`` over the valid actions (``info["action_mask"]``):
candidate ``c0`` (the first slot with a valid route), ``crand`` (a random one), ``cshort`` /
``clong`` (the smallest / largest predicted ideal latency); instance ``room`` (the most KV room,
``late_binding``'s ``rooms``), ``rand`` or ``low`` (the lowest index). ``random`` is uniform over
the valid actions (defer included where valid), as the stock-agent probe's random policy.
``lb<period>`` / ``lbp<period>`` play ``late_binding`` with that ``period_s`` and reserve full /
prompt through the action space (its choice must be valid there; the count that was not is
printed). Prints each rule's mean E2E change vs round robin over the seeds (95% CI).
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

import llm_lb_gym
from llm_lb_gym.envs.presets import preset
from llm_lb_gym.rollout import make_env_router, rollout_agent, rollout_router
from llm_lb_gym.routers.drive import decide


class Rule:
    """One rule as an agent with ``predict`` (``rollout_agent`` passes the mask)."""

    def __init__(self, env, kind: str, seed: int):
        self.env, self.kind = env.unwrapped, kind
        self.rng = np.random.default_rng([seed, 0xA11])
        self.invalid = 0
        self.router = None
        if kind.startswith("lb"):
            prompt = kind.startswith("lbp")
            self.router = make_env_router("late_binding", self.env, period_s=float(kind[3 if prompt else 2:]),
                                          reserve="prompt" if prompt else "full")
            self.router.reset(np.random.default_rng(0), self.env.m)

    def predict(self, obs, deterministic=True, action_masks=None):
        e, mask = self.env, np.asarray(action_masks, bool)
        valid = np.flatnonzero(mask)
        if self.router is not None:
            choice = decide(e.cluster, self.router)
            a = e.defer_action if choice is None else e.action_for(*choice)
            if a is None or not mask[a]:
                self.invalid += 1
                a = int(valid[0])
            return a, None
        if self.kind == "random" or len(valid) == 1:
            return int(self.rng.choice(valid)), None
        m = e.m
        routes = valid[valid < e.defer_action]
        slots = sorted({int(a) // m for a in routes})
        cand, inst = self.kind.split("_")
        inv, ids = e.cluster.table.inv_ideal, e.candidates
        j = {"c0": lambda: slots[0], "crand": lambda: int(self.rng.choice(slots)),
             "cshort": lambda: max(slots, key=lambda s: (inv[ids[s]], -ids[s])),
             "clong": lambda: min(slots, key=lambda s: (inv[ids[s]], -ids[s]))}[cand]()
        insts = [int(a) % m for a in routes if int(a) // m == j]
        if inst == "room":
            rooms = e._room_rule.rooms(e.cluster) if e._room_rule is not None else [0] * m
            i = max(insts, key=lambda i: (rooms[i], -i))
        elif inst == "low":
            i = insts[0]
        else:
            i = int(self.rng.choice(insts))
        return j * m + i, None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="near_capacity")
    p.add_argument("--action", required=True, help="action options as JSON")
    p.add_argument("--seeds", type=int, nargs="+", default=[500, 501, 502])
    p.add_argument("--rules", nargs="+", default=["random", "c0_room", "c0_rand", "crand_room"])
    a = p.parse_args()
    env_id, action = preset(a.preset).env_id, json.loads(a.action)
    rr_env = gym.make(env_id).unwrapped
    rr = np.array([rollout_router(rr_env, make_env_router("round_robin", rr_env), s).metrics["mean_e2e_s"]
                   for s in a.seeds])
    for kind in a.rules:
        xs, invalid = [], 0
        for s in a.seeds:
            env = gym.make(env_id, action=action)
            agent = Rule(env, kind, s)
            xs.append(rollout_agent(env, agent, s).metrics["mean_e2e_s"])
            invalid += agent.invalid
        d = 100 * (np.array(xs) - rr) / rr
        ci = 1.96 * d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else float("nan")
        extra = f", {invalid} choices invalid in the mask" if kind.startswith("lb") else ""
        print(f"{a.preset} (package {llm_lb_gym.__version__}) action {action}: {kind} {np.mean(xs):.3f} s, "
              f"{d.mean():+.2f} +- {ci:.2f}% vs round robin over seeds {a.seeds}{extra}", flush=True)


if __name__ == "__main__":
    main()
