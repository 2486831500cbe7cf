"""Mutation check of the central functions: flip one sign or operator, run the related tests.

    python -m llm_lb_gym.experiments.probe_mutations                 # every mutation below
    python -m llm_lb_gym.experiments.probe_mutations --only order_key  # names containing a word
    python -m llm_lb_gym.experiments.probe_mutations --list

A test suite that passes with a flipped sign in a router's score, the KV accounting, the
reward, the observation or a learning target does not test that function. Each mutation below
replaces one exact snippet (which must occur once in its file) by its mutant, runs the test
files that cover the function (``pytest -x -q``, the pure-Python engine and env kernels where
the function has a compiled twin: ``LLM_LB_GYM_PURE_PYTHON=1``), restores the file and
reports *killed* (a test failed) or *survived*. The source is restored even when interrupted.
A probe, not a test: it rewrites source files of the checkout it runs in and takes minutes, so
it stays out of the test suite. Figures: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    pure: bool = False
    """Run with the pure-Python engine and env kernels (the function has a compiled twin)."""


ROUTER_TESTS = ("tests/test_lever_directions.py", "tests/test_routers.py", "tests/test_policy_search.py",
                "tests/test_release_guarantee.py")
SB = "llm_lb_gym/routers/scored_binding.py"
LB = "llm_lb_gym/routers/late_binding.py"
MUTATIONS: tuple[Mutation, ...] = (
    # --- routers: scored_binding's order and gates
    Mutation("order_key age sign", SB, "math.log1p(prompt[r]) + age_per_s * wait",
             "math.log1p(prompt[r]) - age_per_s * wait", ROUTER_TESTS),
    Mutation("order_key prompt sign", SB, "math.log(inv[r]) - prompt_weight * math.log1p(prompt[r])",
             "math.log(inv[r]) + prompt_weight * math.log1p(prompt[r])", ROUTER_TESTS),
    Mutation("order_key late sign", SB, "            s -= late", "            s += late", ROUTER_TESTS),
    Mutation("order_key late comparison", SB, "if late and wait > dl[r]:", "if late and wait < dl[r]:", ROUTER_TESTS),
    Mutation("need_blocks reserve_frac swapped", SB, "f * tb.pred[rid] + (1.0 - f) * tb.o_base[rid]",
             "(1.0 - f) * tb.pred[rid] + f * tb.o_base[rid]", ROUTER_TESTS),
    Mutation("rooms growth sign", SB, "return [room - g * (e.decode_tokens_left()", "return [room + g * (e.decode_tokens_left()",
             ROUTER_TESTS),
    Mutation("fits room_margin sign", SB, "e.watermark + o.room_margin * e.total_blocks",
             "e.watermark - o.room_margin * e.total_blocks", ROUTER_TESTS),
    Mutation("fits seq_cap comparison", SB, "< o.seq_cap_frac * e.max_seqs", "<= o.seq_cap_frac * e.max_seqs", ROUTER_TESTS),
    Mutation("instance_value work sign", SB, "return room / e.total_blocks - w *", "return room / e.total_blocks + w *",
             ROUTER_TESTS),
    # --- routers: late_binding, max_capacity, JSQ, argmin, the release guarantee
    Mutation("late_binding starvation comparison", LB, "t - tb.arrival_s[q[0]] > cap", "t - tb.arrival_s[q[0]] < cap",
             ROUTER_TESTS),
    Mutation("late_binding shortest -> longest", LB, "best = heapq.nlargest(1,", "best = heapq.nsmallest(1,", ROUTER_TESTS),
    Mutation("late_binding fits sign", LB, "return room - need >= e.watermark", "return room + need >= e.watermark",
             ROUTER_TESTS),
    Mutation("late_binding most room -> least", LB, "if best_room is None or v > best_room:",
             "if best_room is None or v < best_room:", ROUTER_TESTS),
    Mutation("late_binding rooms waiting sign", LB, "room -= self.need_blocks(cluster, r, i)",
             "room += self.need_blocks(cluster, r, i)", ROUTER_TESTS),
    Mutation("late_binding round opening", LB, "if not (t - last >= p * (1 - _TICK_SLACK) or last == t):",
             "if not (t - last < p * (1 - _TICK_SLACK) or last == t):", ROUTER_TESTS),
    Mutation("max_capacity most capacity -> least", "llm_lb_gym/routers/max_capacity.py", "and c > best_cap:",
             "and c < best_cap:", ROUTER_TESTS),
    Mutation("argmin -> argmax", "llm_lb_gym/routers/base.py", "if best_i < 0 or v < best_v:",
             "if best_i < 0 or v > best_v:", ("tests/test_routers.py",)),
    Mutation("release: running blocks nothing", "llm_lb_gym/routers/release.py",
             "        if e.B or e.prefilling:\n            return False", "        if e.B or e.prefilling:\n            return True",
             ("tests/test_release_guarantee.py", "tests/test_routers.py")),
    Mutation("release: hard cap comparison", "llm_lb_gym/routers/release.py", "if wait > MAX_HOLD_S:",
             "if wait < MAX_HOLD_S:", ("tests/test_release_guarantee.py",)),
    # --- KV accounting (pure-Python engine)
    Mutation("engine free_blocks sign", "llm_lb_gym/sim/engine.py", "return self.kv.total_blocks - self.kv.used",
             "return self.kv.total_blocks + self.kv.used", ("tests/test_lever_directions.py", "tests/test_routers.py"),
             pure=True),
    Mutation("scheduler admission free blocks", "llm_lb_gym/sim/scheduler.py", "free = kv.total_blocks - kv.used",
             "free = kv.total_blocks + kv.used", ("tests/test_reference.py", "tests/test_engine_golden.py"), pure=True),
    Mutation("kv drop sign", "llm_lb_gym/sim/kv_cache.py", "self.used -= -(-(self.table.prompt[rid] + o - 1) // self.bs)",
             "self.used += -(-(self.table.prompt[rid] + o - 1) // self.bs)",
             ("tests/test_reference.py", "tests/test_engine_golden.py"), pure=True),
    Mutation("kv block rounding", "llm_lb_gym/sim/kv_cache.py", "self.used -= -(-(self.table.prompt[rid] + o - 1) // self.bs)",
             "self.used -= (self.table.prompt[rid] + o - 1) // self.bs",
             ("tests/test_reference.py", "tests/test_engine_golden.py"), pure=True),
    # --- reward
    Mutation("reward penalty sign", "llm_lb_gym/envs/cluster_env.py", "penalty = -self._pen_unit * pen",
             "penalty = self._pen_unit * pen", ("tests/test_env.py", "tests/test_semi_mdp.py")),
    Mutation("reward completion sign", "llm_lb_gym/envs/cluster_env.py", "completion = self._completion_reward * comp",
             "completion = -self._completion_reward * comp", ("tests/test_env.py", "tests/test_semi_mdp.py")),
    Mutation("guidance h sign", "llm_lb_gym/envs/reward.py", "pred_decode_tokens, p) - best",
             "pred_decode_tokens, p) + best", ("tests/test_env.py", "tests/test_routers.py"), pure=True),
    Mutation("guidance decay sign", "llm_lb_gym/envs/reward.py", "math.exp(-cfg.decay * episode)",
             "math.exp(cfg.decay * episode)", ("tests/test_env.py",)),
    # --- observation
    Mutation("observation capacity sign", "llm_lb_gym/sim/engine.py", "cap = 1.0 - self.committed_tokens / kv_tokens",
             "cap = 1.0 + self.committed_tokens / kv_tokens", ("tests/test_env.py", "tests/test_step_kernels.py"), pure=True),
    # --- learning targets
    Mutation("policy-iteration advantage sign", "agents/policy_iteration.py", "d = S[:, [teacher]] - S ",
             "d = S - S[:, [teacher]] ", ("tests/test_improve.py",)),
    Mutation("improvement target sign", "agents/policy_iteration.py", "logits + np.nan_to_num(adv, nan=0.0) / temperature",
             "logits - np.nan_to_num(adv, nan=0.0) / temperature", ("tests/test_improve.py",)),
    Mutation("advantage regression sign", "agents/policy_iteration.py", "d = q - q.gather(1, A[idx].clamp(min=0)[:, None])",
             "d = q.gather(1, A[idx].clamp(min=0)[:, None]) - q", ("tests/test_improve.py",)),
    Mutation("double DQN target: online -> target argmax", "agents/double_dqn.py",
             "next_actions = online.argmax(dim=1, keepdim=True)",
             "next_actions = self.q_net_target(next_observations).argmax(dim=1, keepdim=True)",
             ("tests/test_double_dqn.py",)),
    Mutation("double DQN target: done mask", "agents/double_dqn.py", "return rewards + (1 - dones) * discounts * next_q_values",
             "return rewards + dones * discounts * next_q_values", ("tests/test_double_dqn.py",)),
)


def run(m: Mutation, timeout_s: float) -> tuple[str, float, str]:
    """(killed | survived | timeout, seconds, the failing test's line)."""
    path = ROOT / m.path
    src = path.read_text()
    if src.count(m.old) != 1:
        raise SystemExit(f"{m.name}: the snippet occurs {src.count(m.old)} times in {m.path}, expected once")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if m.pure:
        env["LLM_LB_GYM_PURE_PYTHON"] = "1"
    t0 = time.perf_counter()
    try:
        path.write_text(src.replace(m.old, m.new))
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                   "-W", "ignore", *m.tests], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return "timeout", time.perf_counter() - t0, ""
    finally:
        path.write_text(src)
    failed = next((line for line in proc.stdout.splitlines() if line.startswith("FAILED")), "")
    return ("killed" if proc.returncode else "survived"), time.perf_counter() - t0, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="run the mutations whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per mutation")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if args.only in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name}: {m.path}: {m.old!r} -> {m.new!r}")
        return 0
    rows = []
    for m in chosen:
        outcome, wall, failed = run(m, args.timeout_s)
        rows.append((m, outcome, wall, failed))
        print(f"{outcome:9s} {wall:6.1f} s  {m.name}  {failed}", flush=True)
    survivors = [m.name for m, o, _, _ in rows if o != "killed"]
    print(f"\n{len(rows)} mutations, {len(rows) - len(survivors)} killed, {len(survivors)} survived"
          + (f": {', '.join(survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
