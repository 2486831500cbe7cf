"""Each default defined once: the config tree mirrors the dataclasses, and differs only where
``docs/defaults.md`` says so (its table is parsed here, so a new difference fails until stated
there, and a stated one that no longer holds fails too). Router options per setting live in
``eval.policy_options`` only; ``horizon_s`` names the reward's discount only."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from llm_lb_gym.envs.config import ActionConfig, EnvConfig, ObsConfig, RewardConfig
from llm_lb_gym.routers.registry import ROUTERS, make_router
from llm_lb_gym.sim.clock import DEFAULT_DECISION_INTERVAL_S
from llm_lb_gym.sim.config import EngineConfig
from llm_lb_gym.sim.slo import SLOConfig

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ENTRY_POINTS = sorted(p for p in CONF.glob("*.yaml"))


def _defaults(cls) -> dict:
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def _stated_differences() -> set[tuple[str, str]]:
    """(group file, option) pairs of docs/defaults.md's table."""
    out = set()
    for line in (ROOT / "docs" / "defaults.md").read_text().splitlines():
        m = re.match(r"\| `reward\.(\w+)` \|[^|]*\|([^|]*)\|", line)
        if m:
            for f in re.findall(r"`(reward/\w+\.yaml)`", m.group(2)):
                out.add((f, m.group(1)))
    return out


def _mirrors():
    """(group file, dataclass, sub-tree) pairs where the conf tree mirrors a dataclass."""
    yield "env/default.yaml", EnvConfig, None
    for key, cls in (("obs", ObsConfig), ("action", ActionConfig), ("slo", SLOConfig)):
        yield "env/default.yaml", cls, key
    yield "engine/v100.yaml", EngineConfig, None
    for p in sorted((CONF / "reward").glob("*.yaml")):
        yield f"reward/{p.name}", RewardConfig, None


def _differences() -> set[tuple[str, str]]:
    found = set()
    for rel, cls, key in _mirrors():
        tree = yaml.safe_load((CONF / rel).read_text())
        tree = tree[key] if key else tree
        dflt = _defaults(cls)
        is_variant = rel.startswith("reward/") and tree.get("mode") != dflt["mode"]
        for name, value in (tree or {}).items():
            assert name in dflt, f"conf/{rel}: {name!r} is not a field of {cls.__name__}"
            d = dflt[name]
            if dataclasses.is_dataclass(d) or d is None and isinstance(value, dict):
                continue    # a nested group, compared on its own
            if is_variant and name in ("mode", "guidance_scale", "decay", "penalty", "penalty_scale",
                                       "completion_reward", "slo_reward"):
                # a named reward variant (baseline, latency, slo) is defined by these; the
                # guidance ones still count when the variant has guidance (workload_aware)
                if not (tree.get("mode") != "baseline" and name in ("guidance_scale", "decay")):
                    continue
            if _plain(value) != _plain(d):
                found.add((rel, name))
    return found


def test_the_conf_tree_mirrors_the_dataclasses_except_where_stated():
    stated = _stated_differences()
    assert stated, "docs/defaults.md's table was not found"
    found = _differences()
    assert not found - stated, f"defaults set twice with different values, not in docs/defaults.md: {sorted(found - stated)}"
    assert not stated - found, f"docs/defaults.md states differences that no longer exist: {sorted(stated - found)}"


def test_router_options_are_set_per_setting_only():
    """No entry point sets a router option: the default setting's are in conf/routers/default.yaml
    (empty: the class defaults; or a searched router, which must differ from them and be valid),
    and experiments set their own under eval.policy_options."""
    base = yaml.safe_load((CONF / "routers" / "default.yaml").read_text())
    assert base and base["late_binding"] == {}
    for name, given in base.items():
        if given:
            router = make_router(name, **given)          # valid options of that router
            dflt = _defaults(type(router.options))
            assert any(_plain(dflt.get(k)) != _plain(v) for k, v in given.items()), name
    for p in ENTRY_POINTS:
        tree = yaml.safe_load(p.read_text()) or {}
        assert not (tree.get("eval") or {}).get("policy_options"), f"{p.name} sets eval.policy_options"
        assert not tree.get("policy_options"), f"{p.name} sets policy_options"


def test_no_experiment_restates_a_routers_class_defaults():
    for p in sorted((CONF / "experiment").glob("*.yaml")):
        opts = ((yaml.safe_load(p.read_text()) or {}).get("eval") or {}).get("policy_options") or {}
        for name, given in opts.items():
            assert name in ROUTERS, f"{p.name}: eval.policy_options.{name} is not a router"
            options = getattr(make_router(name), "options", None)
            if not dataclasses.is_dataclass(options) or not isinstance(given, dict):
                continue
            dflt = _defaults(type(options))
            assert any(_plain(dflt.get(k)) != _plain(v) for k, v in given.items()), (
                f"{p.name}: eval.policy_options.{name} restates the class defaults")


def _dataclasses_of_the_package():
    import importlib
    import pkgutil

    import llm_lb_gym

    for mod in pkgutil.walk_packages(llm_lb_gym.__path__, "llm_lb_gym."):
        if any(s in mod.name for s in (".serve", "onnx", "transformer", "textmodel", "upstream")):
            continue
        try:
            m = importlib.import_module(mod.name)
        except ImportError:
            continue
        for obj in vars(m).values():
            if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == m.__name__:
                yield obj


def test_one_decision_interval_and_horizon_s_only_for_the_discount():
    classes = list(_dataclasses_of_the_package())
    assert RewardConfig in classes and EnvConfig in classes
    for cls in classes:
        d = _defaults(cls)
        if "decision_interval_s" in d and d["decision_interval_s"] is not None:
            assert d["decision_interval_s"] == DEFAULT_DECISION_INTERVAL_S, cls
        if "horizon_s" in d:
            assert cls is RewardConfig, f"{cls.__name__}.horizon_s: only the reward's discount is horizon_s"
    # in conf: the interval is set once (env/default.yaml), horizon_s only in reward groups
    for p in CONF.rglob("*.yaml"):
        rel = p.relative_to(CONF).as_posix()
        for path, value in _leaves(yaml.safe_load(p.read_text()) or {}, ()):
            if path[-1] == "decision_interval_s":
                assert rel == "env/default.yaml" or str(value).startswith("${"), (rel, path)
            if path[-1] == "horizon_s":
                assert rel.startswith("reward/") or "reward" in path, (rel, path)


def _leaves(tree, path):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _leaves(v, path + (str(k),))
    else:
        yield path, tree


@pytest.mark.parametrize("field", ["guidance_scale", "decay"])
def test_the_stated_differences_are_real(field):
    """The table's gym.make column is the dataclass's value."""
    row = next(line for line in (ROOT / "docs" / "defaults.md").read_text().splitlines()
               if line.startswith(f"| `reward.{field}`"))
    assert float(row.split("|")[2].strip()) == _defaults(RewardConfig)[field]
