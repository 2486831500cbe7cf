"""Progress bars appear on a terminal and nowhere else; figures render from a run's files."""

from __future__ import annotations

import io
import json
import math
import sys

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from llm_lb_gym.experiments._hydra import CONF_DIR

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _compose(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def test_bars_only_on_a_terminal_and_only_when_asked():
    from llm_lb_gym.experiments._progress import bars_enabled, progress_bar

    assert bars_enabled(True, FakeTerminal()) and not bars_enabled(False, FakeTerminal())
    assert not bars_enabled(True, io.StringIO())     # a log file, pytest's capture, a worker's pipe
    for stream, option, drawn in ((FakeTerminal(), True, True), (FakeTerminal(), False, False),
                                  (io.StringIO(), True, False)):
        with progress_bar(3, "stage", option, stream=stream) as bar:
            bar.update(3)
        assert ("stage" in stream.getvalue()) is drawn
        assert ("3/3" in stream.getvalue()) is drawn


def test_training_bar_shows_episodes_and_validation(tmp_path, monkeypatch):
    """On a terminal: steps/s, episodes and the last validation E2E; the inner evaluation's bar
    is cleared. progress=false: nothing on the same terminal."""
    from llm_lb_gym.experiments.train import train

    term = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term)
    res = train(_compose("train", ["experiment=debug", "train.episodes=2", "train.eval_every_episodes=1"]),
                out=tmp_path / "on")
    text = term.getvalue()
    last = text.replace("\n", "\r").split("\r")
    train_lines = [s for s in last if s.startswith("train ")]
    assert train_lines, text[-500:]
    final = train_lines[-1]
    val = res["validation"][-1]["mean_e2e_s"]
    assert "step/s" in final and f"val E2E={val:.2f}s" in final
    assert f"episodes={len(res['history'])}" in final
    assert "evaluate" in text   # the final evaluation drew its own bar

    term2 = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", term2)
    train(_compose("train", ["experiment=debug", "train.episodes=1", "train.eval_every_episodes=0",
                             "progress=false"]), out=tmp_path / "off")
    assert "step/s" not in term2.getvalue() and "episode/s" not in term2.getvalue()


def _results(rows: list[tuple[str, int, float]]) -> list[dict]:
    return [{"policy": p, "seed": s, "mean_e2e_s": e} for p, s, e in rows]


def test_reductions_are_paired_with_the_paper_sign():
    from llm_lb_gym.experiments.figures import reductions

    rows = _results([("round_robin", 0, 10.0), ("round_robin", 1, 20.0), ("a", 0, 9.0), ("a", 1, 18.0),
                     ("b", 0, 11.0), ("b", 1, 24.0)])
    red = reductions(rows)
    assert set(red) == {"a", "b"}
    assert red["a"][0] == pytest.approx(10.0) and red["a"][1] == pytest.approx(0.0)
    # b: +10% and +20% slower -> reduction -15%, CI t(0.975, 1) * std([10, 20]) / sqrt(2)
    assert red["b"][0] == pytest.approx(-15.0)
    assert red["b"][1] == pytest.approx(12.706204736174707 * np.std([10, 20], ddof=1) / math.sqrt(2))


def _fake_reproduce_run(run) -> None:
    """The files a reproduce run leaves that the figures read."""
    setting = run / "paper_v100"
    (setting / "eval").mkdir(parents=True)
    lines = ["policy,seed,mean_e2e_s,wall_s"]
    for seed in (1000, 1001, 1002):
        for policy, factor in (("round_robin", 1.0), ("jsq", 0.99), ("wg_rl", 0.9 + 0.01 * (seed - 1000))):
            lines.append(f"{policy},{seed},{10.0 * factor * (1 + seed - 1000)},0.1")
    (setting / "eval" / "results.csv").write_text("\n".join(lines) + "\n")
    (setting / "eval" / "resolved_config.yaml").write_text("baseline: round_robin\n")
    (setting / "wg_rl").mkdir()
    (setting / "wg_rl" / "train_summary.json").write_text(json.dumps({
        "episode_steps": 100, "validation": [
            {"step": 100, "mean_e2e_s": 30.0, "round_robin_mean_e2e_s": 12.0, "unfinished": 5.0},
            {"step": 200, "mean_e2e_s": 11.0, "round_robin_mean_e2e_s": 12.0, "unfinished": 0.0}]}))
    (run / "reproduction.json").write_text(json.dumps([{
        "setting": "paper_v100", "load_factor": 0.59,
        "trained": {"wg_rl": {"model": str(setting / "wg_rl" / "best_model.zip")}}}]))
    (run / "resolved_config.yaml").write_text(
        "variants: {wg_rl: {reward: workload_guided, label: WG-RL}}\n"
        "paper: {paper_v100: {wg_rl: 11.43, jsq: 0.46}}\npaper_as: {}\n")


def test_figures_command_renders_a_reproduce_run_elsewhere(tmp_path, capsys):
    from llm_lb_gym.experiments.figures import main

    _fake_reproduce_run(tmp_path / "run")
    main([str(tmp_path / "run"), "--out", str(tmp_path / "docs")])
    printed = capsys.readouterr().out.split()
    expected = [str(tmp_path / "docs" / f"paper_v100_{kind}.png") for kind in ("reduction", "learning_curves")]
    assert printed == expected
    for path in expected:
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC
    assert not list((tmp_path / "run").rglob("*.png"))   # the run itself is only read


def test_figures_command_names_what_it_did_not_find(tmp_path):
    from llm_lb_gym.experiments.figures import render

    with pytest.raises(FileNotFoundError, match="no reproduce run"):
        render(tmp_path)
