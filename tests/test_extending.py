"""The README's "How to extend" examples run as printed, and each does what it claims.

Each code block under that heading carries a marker ``<!-- example: NAME; files: a, b -->``.
The block is run verbatim in a fresh interpreter (its registrations must not leak into other
tests' registries), in an empty working directory, followed by the checks below, which read
the block's own variables: the new router routes a whole episode, the agent trains and
round-trips through save/load, the trace format loads a tiny file, the observation feature is in
the observation space with the right values, the declared GPU simulates. The ``files`` list is
what the example asks a contributor to touch in the package: at most 3, each named in the
prose before it, each existing (or, for a new file, its folder).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SECTION = README.split("## How to extend", 1)[1].split("\n## ", 1)[0]
MARKER = re.compile(r"<!-- example: (\w+); files: (.*?) -->\n```(\w+)\n(.*?)```", re.S)
EXAMPLES = {m.group(1): (m.group(2), m.group(3), m.group(4)) for m in MARKER.finditer(SECTION)}

CHECKS = {
    "router": """
        from llm_lb_gym.routers.registry import ROUTERS
        assert "most_free_kv" in ROUTERS
        assert m["completed"] + m["rejected"] == 300 and m["unfinished"] == 0, m
        assert sum(e.n_finished for e in env.cluster.engines) == m["completed"]
        assert type(make_env_router("most_free_kv", env)) is MostFreeKV
        rr = rollout_router(env, make_env_router("round_robin", env), seed=1000).metrics
        assert rr["mean_e2e_s"] != m["mean_e2e_s"]   # it routed otherwise than round robin
    """,
    "agent": """
        assert agent.count.sum() == 3_000 and (agent.count > 0).sum() >= 2
        assert result.metrics["completed"] + result.metrics["rejected"] == 200
        agent.save("bandit.npz")
        again = BanditAgent.load("bandit.npz", env)
        assert np.array_equal(again.total, agent.total) and np.array_equal(again.count, agent.count)
        from llm_lb_gym.agents import agent_spec
        assert agent_spec("bandit").load_class() is BanditAgent
    """,
    "trace_format": """
        assert m["completed"] + m["rejected"] == 30 == m["num_requests"], m
        prompts = {50 + 37 * i for i in range(40)}
        assert set(int(p) for p in env.cluster.table.prompt) <= prompts
        from llm_lb_gym.data import read_trace
        assert len(read_trace("gateway.jsonl", "gateway_log")) == 40
    """,
    "observation_feature": """
        assert env.observation_space.shape == (40,) and env.unwrapped.obs_layout.instance_dim == 9
        running = [len(e.running) for e in env.unwrapped.cluster.engines]
        assert sum(running) > 0, running
        assert np.allclose(obs[4:].reshape(4, 9)[:, -1] * 128, running), (obs, running)
        assert env.observation_space.contains(obs)
        d = gym.make("LLMCluster-v0", num_requests=20,
                     obs={"features": ["running_requests"], "as_dict": True})
        assert d.observation_space["running_requests"].shape == (4,)
        o, _ = d.reset(seed=0)
        assert d.observation_space.contains(o)
    """,
    "hardware_preset": """
        blocks = env.cluster_cfg.engines[0].total_blocks
        assert 100 < blocks < 1889, blocks   # less memory than the default 32 GB V100
        assert m["completed"] + m["rejected"] == 200 and m["completed"] > 0, m
    """,
}
"""Run after each block, in its namespace (``np`` is imported for them)."""


def test_every_example_block_is_marked_and_checked():
    fenced = re.findall(r"^```(\w+)$", SECTION, re.M)
    assert len(fenced) == len(EXAMPLES), "an example block without its <!-- example: ... --> marker"
    assert set(CHECKS) == {n for n, (_, lang, _) in EXAMPLES.items() if lang == "python"}


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_touches_at_most_three_named_files(name):
    files = [f.strip() for f in EXAMPLES[name][0].split(",")]
    assert 1 <= len(files) <= 3, files
    prose = SECTION.split(f"<!-- example: {name};", 1)[0].rsplit("\n**", 1)[-1]   # its paragraph on
    for f in files:
        assert f"`{f}`" in prose, f"{f} is not named in the text before example {name}"
        path = ROOT / f
        assert (path.parent if "<name>" in f else path).exists(), f


def _run(code: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_example_runs_end_to_end(name, tmp_path):
    if name == "agent":
        pytest.importorskip("stable_baselines3", reason="the agents package needs the rl extra")
    _, lang, block = EXAMPLES[name]
    assert lang == "python"
    code = block + "\nimport numpy as np\n" + textwrap.dedent(CHECKS[name])
    out = _run(code, tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip(), "the example prints what it did"


def test_hardware_yaml_declares_the_same_gpu_as_the_python_example():
    omegaconf = pytest.importorskip("omegaconf")   # what Hydra parses conf/ with
    yaml_cfg = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.create(EXAMPLES["hardware_preset_yaml"][2]))
    a30 = ast.literal_eval(re.search(r"^A30 = (\{.*?\})$", EXAMPLES["hardware_preset"][2], re.S | re.M).group(1))
    assert yaml_cfg == {"model_config": "llama2-7b", "gpu": a30, "tensor_parallel": 1}


def test_registering_a_taken_or_nameless_router_is_refused():
    from llm_lb_gym.routers import RouterBase, register_router
    from llm_lb_gym.routers.registry import ROUTER_CLASSES

    class Impostor(RouterBase):
        name = "jsq"

    class Nameless(RouterBase):
        pass

    with pytest.raises(ValueError, match="router name 'jsq' is taken by JoinShortestQueue"):
        register_router(Impostor)
    with pytest.raises(ValueError, match="Nameless.name is empty"):
        register_router(Nameless)
    with pytest.raises(TypeError, match="RouterBase subclass"):
        register_router(object)
    assert ROUTER_CLASSES["jsq"].__name__ == "JoinShortestQueue"


def test_a_bad_instance_feature_names_the_field():
    from llm_lb_gym.envs.observation import InstanceFeature

    with pytest.raises(ValueError, match=r"normalize_by='blocks'; allowed: none, max_num_seqs, kv_blocks"):
        InstanceFeature("x", lambda cluster, i: 0.0, high=1.0, normalize_by="blocks")
    with pytest.raises(ValueError, match="'speed' is empty or built in"):
        InstanceFeature("speed", lambda cluster, i: 0.0, high=1.0)
    with pytest.raises(ValueError, match="low=2.0 must be below high=1.0"):
        InstanceFeature("x", lambda cluster, i: 0.0, high=1.0, low=2.0)
