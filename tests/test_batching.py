"""The batching policies are defined once (llm_lb_gym/sim/batching.py) and read everywhere."""

from __future__ import annotations

import pytest

from llm_lb_gym._validate import ConfigError
from llm_lb_gym.sim import batching, config, engine, reference
from llm_lb_gym.sim.config import EngineConfig


def test_registry_names_and_rules():
    assert batching.SCHEDULERS == ("fcfs", "least_work_left", "bin_packing")
    assert config.SCHEDULERS is batching.SCHEDULERS
    fcfs, lwl, bp = (batching.get_policy(n) for n in batching.SCHEDULERS)
    assert fcfs.key is None and not fcfs.skip_unfit
    assert not lwl.skip_unfit and bp.skip_unfit
    # (p, o, pred): fewest predicted tokens left first; largest p + o first
    assert sorted([(10, 0, 50.0), (10, 30, 40.0), (5, 0, 20.0)], key=lambda r: lwl.key(*r)) == \
        [(10, 30, 40.0), (5, 0, 20.0), (10, 0, 50.0)]
    assert sorted([(10, 0, 50.0), (10, 30, 40.0), (5, 0, 20.0)], key=lambda r: bp.key(*r)) == \
        [(10, 30, 40.0), (10, 0, 50.0), (5, 0, 20.0)]


def test_unknown_policy_lists_the_valid_names():
    with pytest.raises(ConfigError, match="unknown engine.scheduler 'lifo'; allowed: bin_packing, fcfs, least_work_left"):
        batching.get_policy("lifo")
    with pytest.raises(ConfigError, match=r"engine\.scheduler='lifo' is not valid; allowed: fcfs, least_work_left, bin_packing"):
        EngineConfig(scheduler="lifo")


def test_no_implementation_switches_on_scheduler_names():
    """The engine and the reference read the policy object, never compare scheduler strings."""
    for module in (engine, reference):
        src = open(module.__file__).read()
        for name in batching.SCHEDULERS:
            assert f'"{name}"' not in src, (module.__name__, name)
