"""The router service serves what the package trains and searches (experiments/_serve_policy.py):
an ``improve`` run's network, a ``train`` run's agent, policy-search options from a file or
an experiment, typed ``-o`` options; a named error for what it cannot serve."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("starlette")
pytest.importorskip("aiohttp")
torch = pytest.importorskip("torch")
httpx = pytest.importorskip("httpx")

from llm_lb_gym._validate import ConfigError  # noqa: E402
from llm_lb_gym.experiments._serve_policy import (  # noqa: E402
    load_policy, router_options_from, served_router_options)
from llm_lb_gym.serve.config import RouterServiceConfig, typed_router_options  # noqa: E402

BACKENDS2 = ("http://127.0.0.1:1", "http://127.0.0.1:2")


def improve_run(d, overrides=(), seed=0):
    """An ``llm-lb-gym improve``-shaped run directory: the composed config (the main job's
    setting, 2 instances) and a ``best_policy.pt`` whose output layers are random (a network
    that departs from its teacher), as policy iteration saves it."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from llm_lb_gym.agents.policy_iteration import NetPolicy, make_net
    from llm_lb_gym.envs.cluster_env import LLMClusterEnv
    from llm_lb_gym.experiments._hydra import env_kwargs
    from llm_lb_gym.experiments._training import policy_iteration_config

    torch.set_num_threads(1)
    with initialize_config_module("llm_lb_gym.conf", version_base=None):
        cfg = compose("improve", overrides=["env.num_instances=2", "env.num_requests=100", *overrides])
    (d / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    kw = env_kwargs(cfg)
    kw.pop("max_episode_steps", None)
    layout = LLMClusterEnv(**kw).obs_layout.as_dict()
    pc = policy_iteration_config(cfg)
    net = make_net(layout, pc, seed)
    torch.manual_seed(seed)
    for head in (net.pair_out, net.defer):
        for mod in head.modules():
            if isinstance(mod, torch.nn.Linear):
                torch.nn.init.normal_(mod.weight, std=0.5)
    NetPolicy(net, pc.prior, pc.teacher, pc.teacher_options).save(d / "best_policy.pt", layout, pc)
    return d


@pytest.fixture(scope="module")
def improve_dir(tmp_path_factory):
    return improve_run(tmp_path_factory.mktemp("improve"))


def test_an_improve_run_loads_with_its_env_and_teacher(improve_dir):
    router = load_policy(str(improve_dir), None, RouterServiceConfig(backends=BACKENDS2))
    assert type(router.agent).__name__ == "DistilledAgent"
    env = router.env
    assert env.cfg.action.order == "scored" and env.cfg.action.candidates == 4   # as trained
    assert env.cfg.action.masked == "as_taken"
    assert "arrivals_left" in env.obs_cfg.features
    assert router.fallback.name == "scored_binding" == router.agent.policy.teacher   # its own fallback
    assert router.options["source"].endswith("best_policy.pt")
    # the model file itself names the run too
    assert load_policy(str(improve_dir / "best_policy.pt"), None, RouterServiceConfig(backends=BACKENDS2))


def test_an_improve_run_routes_five_of_five_through_the_service(improve_dir):
    from llm_lb_gym.serve.launch import ServerThread
    from llm_lb_gym.serve.router_app import create_app as router_app
    from llm_lb_gym.serve.sim_backend import SimBackendConfig
    from llm_lb_gym.serve.sim_backend import create_app as sim_app

    servers = [ServerThread(sim_app(SimBackendConfig(time_scale=4.0))) for _ in range(2)]
    try:
        cfg = RouterServiceConfig(backends=tuple(s.url for s in servers), poll_interval_s=0.05)
        with ServerThread(router_app(cfg, load_policy(str(improve_dir), None, cfg))) as r:
            with httpx.Client(base_url=r.url, timeout=30) as c:
                for k in range(5):
                    body = {"model": "sim-model", "prompt": "w " * (5 + 20 * k), "max_tokens": 3 + k}
                    resp = c.post("/v1/completions", json=body)
                    assert resp.status_code == 200, resp.text
                    assert resp.json()["usage"]["completion_tokens"] == 3 + k
            text = httpx.get(r.url + "/metrics").text
            assert 'outcome="ok"} 5.0' in text
    finally:
        for s in servers:
            s.stop()


def test_the_main_jobs_options_route_five_of_five_through_the_service(tmp_path):
    """``llm-lb-gym robust`` writes ``scored_binding.yaml`` in its run directory: served with
    ``--router scored_binding --options-from RUN`` (holding, hedged), 5 of 5 requests answered;
    ``--policy RUN`` says how to serve it instead of looking for a network."""
    import yaml

    from llm_lb_gym.experiments._hydra import default_router_options
    from llm_lb_gym.experiments.serve import build_app, parser
    from llm_lb_gym.serve.launch import ServerThread
    from llm_lb_gym.serve.sim_backend import SimBackendConfig
    from llm_lb_gym.serve.sim_backend import create_app as sim_app

    run = tmp_path / "robust_run"
    run.mkdir()
    (run / "scored_binding.yaml").write_text(yaml.safe_dump({"scored_binding": default_router_options("scored_binding")}))
    servers = [ServerThread(sim_app(SimBackendConfig(time_scale=4.0))) for _ in range(2)]
    try:
        argv = ["router", "--port", "0", "--router", "scored_binding", "--options-from", str(run),
                "--poll-interval-s", "0.05"]   # the port is ServerThread's own
        for s in servers:
            argv += ["--backend", s.url]
        with ServerThread(build_app(parser().parse_args(argv))) as r:
            with httpx.Client(base_url=r.url, timeout=30) as c:
                for k in range(5):
                    body = {"model": "sim-model", "prompt": "w " * (5 + 20 * k), "max_tokens": 3 + k}
                    resp = c.post("/v1/completions", json=body)
                    assert resp.status_code == 200, resp.text
            assert 'outcome="ok"} 5.0' in httpx.get(r.url + "/metrics").text
    finally:
        for s in servers:
            s.stop()
    with pytest.raises(ConfigError, match="holds searched options .*--router scored_binding --options-from"):
        load_policy(str(run), None, RouterServiceConfig(backends=BACKENDS2))


def test_an_improve_network_decides_as_in_the_simulator(improve_dir):
    from llm_lb_gym.serve.lockstep import served_run, simulated_run
    from llm_lb_gym.sim.config import ClusterConfig, EngineConfig
    from llm_lb_gym.workload import make_workload

    scfg = RouterServiceConfig(backends=BACKENDS2)
    reqs = make_workload("task_mix", rate_rps=14.0).sample(np.random.default_rng(4), 120)
    cfg = ClusterConfig(num_instances=2, engine=EngineConfig(preset="llama2-7b-v100"))
    a = load_policy(str(improve_dir), None, scfg)
    b = load_policy(str(improve_dir), None, scfg)
    seen = {id(a): [], id(b): []}
    for r in (a, b):
        act = r.act
        r.act = lambda obs, mask, act=act, out=seen[id(r)]: out.append(np.array(obs)) or act(obs, mask)
    sim, order_sim = simulated_run(reqs, cfg, a, np.random.default_rng(0), 0.02)
    svc, order_svc = served_run(reqs, cfg, b, np.random.default_rng(0), 0.02)
    assert sim.table.instance == svc.table.instance and sim.table.routed_s == svc.table.routed_s
    assert order_sim == order_svc
    assert len(seen[id(a)]) == len(seen[id(b)]) > 50
    for x, y in zip(seen[id(a)], seen[id(b)]):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)


def test_what_cannot_be_served_is_a_named_error(improve_dir, tmp_path):
    cfg = RouterServiceConfig(backends=BACKENDS2)
    with pytest.raises(ConfigError, match="does not exist"):
        load_policy(str(tmp_path / "nowhere"), None, cfg)
    with pytest.raises(ConfigError, match="holds neither best_policy.pt.*nor best_model.zip"):
        load_policy(str(tmp_path), None, cfg)
    with pytest.raises(ConfigError, match="best_model.zip does not exist"):
        load_policy(str(improve_dir), "best_model.zip", cfg)
    three = RouterServiceConfig(backends=BACKENDS2 + ("http://127.0.0.1:3",))
    with pytest.raises(ConfigError, match="trained for 2 instances; 3 --backend given"):
        load_policy(str(improve_dir), None, three)
    # an improve config beside an SB3-named model: no agent to load it as
    import shutil

    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(improve_dir / "resolved_config.yaml", d / "resolved_config.yaml")
    (d / "best_model.zip").write_bytes(b"PK")
    with pytest.raises(ConfigError, match="names no agent.*improve run's network is best_policy.pt"):
        load_policy(str(d), None, cfg)
    (d / "best_policy.pt").write_bytes(b"not torch")
    with pytest.raises(ConfigError, match="could not be loaded as a distilled model"):
        load_policy(str(d), "best_policy.pt", cfg)


def test_a_network_observing_the_prefix_cache_is_refused(tmp_path):
    d = improve_run(tmp_path, ["env.obs.features=[cached_prefix]", "engine.enable_prefix_caching=true"])
    with pytest.raises(ConfigError, match="observes 'cached_prefix'.*prefix cache"):
        load_policy(str(d), None, RouterServiceConfig(backends=BACKENDS2))


def test_options_from_a_file_a_search_directory_and_an_experiment(tmp_path):
    import yaml

    found = {"period_s": 0.07, "reserve_frac": 0.5, "prompt_weight": 0.25}
    (tmp_path / "scored_binding.yaml").write_text(yaml.safe_dump({"scored_binding": found}))
    assert router_options_from(str(tmp_path / "scored_binding.yaml"), "scored_binding") == found
    assert router_options_from(str(tmp_path), "scored_binding") == found   # policy_search's run dir
    near = router_options_from("v100_near_capacity", "late_binding")
    assert near["reserve"] == "full" and near["period_s"] == 0.1
    with pytest.raises(ConfigError, match="must hold late_binding.yaml"):
        router_options_from(str(tmp_path), "late_binding")
    with pytest.raises(ConfigError, match="expected a mapping \\{late_binding"):
        router_options_from(str(tmp_path / "scored_binding.yaml"), "late_binding")
    with pytest.raises(ConfigError, match="not a file, directory or experiment; experiments: .*v100_near_capacity"):
        router_options_from("v100_nowhere", "late_binding")


def test_a_router_served_without_options_runs_the_default_settings_options(tmp_path):
    """``serve router --router scored_binding`` is the router the benchmark judged: the default
    setting's options (the ones evaluate and the benchmark read through Hydra), not the class's."""
    from llm_lb_gym.experiments._hydra import compose, to_container

    composed = to_container(compose("evaluate", []).eval.policy_options)
    served = served_router_options(None, "scored_binding")
    assert served == composed["scored_binding"] and served["hedge"] == 1.0
    assert served_router_options(None, "late_binding") == composed["late_binding"] == {}
    assert served_router_options(None, "round_robin") == {}
    (tmp_path / "scored_binding.yaml").write_text("scored_binding: {period_s: 0.07}\n")
    assert served_router_options(str(tmp_path), "scored_binding") == {"period_s": 0.07}


def test_options_are_typed_by_the_router(capsys):
    from llm_lb_gym.experiments.serve import build_app, parser

    assert typed_router_options("late_binding", ["period_s=1e9", "max_wait_s=null"]) == \
        {"period_s": 1e9, "max_wait_s": None}
    with pytest.raises(ConfigError, match="router.late_binding.period_s='soon' is not a number"):
        typed_router_options("late_binding", ["period_s=soon"])
    with pytest.raises(ConfigError, match="has no option 'speed'; allowed: period_s"):
        typed_router_options("late_binding", ["speed=1"])
    app = build_app(parser().parse_args(["router", "--port", "1", "--backend", "http://127.0.0.1:1",
                                         "--router", "late_binding", "-o", "period_s=1e9"]))
    assert app.state.service.router.options.period_s == 1e9
    with pytest.raises(SystemExit, match="is not a number"):
        build_app(parser().parse_args(["router", "--port", "1", "--backend", "http://127.0.0.1:1",
                                       "--router", "late_binding", "-o", "period_s=x"]))


def test_loadgen_simulates_the_network_and_searched_options(improve_dir, tmp_path):
    """loadgen's simulated rows: ``--policy`` (the network deciding on the simulator's cluster)
    and ``--options-from`` (the setting's options), on the requests the service is sent."""
    from llm_lb_gym.experiments._serve_policy import router_options_from
    from llm_lb_gym.experiments.loadgen import simulate
    from llm_lb_gym.workload import make_workload

    reqs = make_workload("task_mix", rate_rps=10.0).sample(np.random.default_rng(0), 60)
    m = simulate(reqs, "learned", {}, 2, "llama2-7b-v100", 0, str(improve_dir))
    assert m["completed"] == 60
    opts = router_options_from("v100_near_capacity", "scored_binding")
    assert simulate(reqs, "scored_binding", opts, 2, "llama2-7b-v100", 0)["completed"] == 60
