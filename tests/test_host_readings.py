"""A host's constants read off its lone requests (``calibration/host_readings.py``, ``validate --readings``)."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from llm_lb_gym.calibration.corpus import load_corpus
from llm_lb_gym.calibration.host_readings import fit_host, is_reading, parameters
from llm_lb_gym.calibration.serving import ServingCalibration

SILY = "silybench-h100-qwen3-8b"


@pytest.fixture(scope="module")
def corpus():
    return load_corpus()


def _source(corpus, src):
    return [c for c in corpus.cases if c.source == src]


def test_one_prompt_length_pins_two_constants_and_two_lengths_four(corpus):
    l4 = [c for c in _source(corpus, "wmx-l4-qwen2.5-0.5b") if is_reading(c)]
    assert [c.id for c in l4] == ["wmx-l4-qwen2.5-0.5b/c1"]
    assert parameters(l4) == ("frontend", "bandwidth")
    sily = [c for c in _source(corpus, SILY) if is_reading(c)]
    assert len(sily) == 5 and all(c.workload.concurrency == 1 for c in sily)
    assert parameters(sily) == ("frontend", "bandwidth", "compute", "kv_bandwidth")
    # prompts of 128 and 128 only: no slope to read
    assert parameters([c for c in sily if c.workload.prompt_tokens == 128]) == ("frontend", "bandwidth")


def test_fit_host_refuses_what_is_not_one_hosts_lone_requests(corpus):
    cal = ServingCalibration.shipped()
    loaded = next(c for c in _source(corpus, SILY) if c.workload.concurrency == 16)
    with pytest.raises(ValueError, match="c16 are not lone-request cases"):
        fit_host([loaded], corpus, cal)
    mixed = [next(c for c in _source(corpus, SILY) if is_reading(c)),
             next(c for c in _source(corpus, "wmx-l4-qwen2.5-0.5b") if is_reading(c))]
    with pytest.raises(ValueError, match="one GPU and endpoint"):
        fit_host(mixed, corpus, cal)
    with pytest.raises(ValueError, match="no readings"):
        fit_host([], corpus, cal)


def test_a_fitted_host_reads_as_itself(corpus):
    """GPUStack's 8B latency page is in the fit: its lone ShareGPT requests move the constants
    by a few percent at most (and its drawn lengths are replayed whole, not cut to two)."""
    readings = [c for c in _source(corpus, "gpustack-qwen3-8b-h100-latency") if is_reading(c)]
    host = fit_host(readings, corpus, ServingCalibration.shipped())
    assert set(host.multipliers) == {"frontend", "bandwidth"}
    assert all(0.9 < v < 1.1 for v in host.multipliers.values()), host.multipliers
    assert all(abs(v) < 0.01 for v in host.residuals.values()), host.residuals


def test_silybench_read_off_its_lone_requests_predicts_its_loaded_decode(corpus, tmp_path):
    """silybench's five lone-request cases (one per shape) pin its host: a frontend ~5x lighter
    than kvcached's, prefill ~1.6x and KV reads ~1.8x faster than GPUStack's H100 pages imply.
    With them, the durations and ITLs of its 25 loaded cases (4 to 64 in flight) come within
    ~10% where the shipped constants are 20-80% slow, and every p95 TTFT within 20% (the closed
    loops of 128/1,024 at 16-64 in flight were +29% .. +90% while the streamed tokens' output
    work ran as one job per request from its first token: sim/output_stream.py); the L4's TTFT
    under load gets worse: lone requests cannot show the API server's CPU shared by many streams."""
    from llm_lb_gym.experiments import validate

    out = tmp_path / "readings.json"
    report = validate.main(["--split", "held_out", "--readings", "--json", str(out)])["readings"]
    assert set(report["sources"]) == {SILY, SILY + "-fp8", "wmx-l4-qwen2.5-0.5b"}   # GPUStack's 32B pages: none
    s = report["sources"][SILY]
    assert len(s["readings"]) == 5 and not set(s["readings"]) & set(s["after_cases"])
    assert len(s["after_cases"]) == 25
    assert all(abs(v) < 0.05 for v in s["reading_residuals"].values()), s["reading_residuals"]
    m = s["multipliers"]
    assert m["frontend"] < 0.4 and m["compute"] > 1.3 and m["kv_bandwidth"] > 1.5, m
    assert s["before"]["median"] > 0.3 and s["after"]["median"] < 0.08
    steady = [abs(e[k]) for e in s["after_cases"].values() for k in ("duration_s", "median_itl_ms")]
    before = json.loads(out.read_text())["cases"]
    steady_before = [abs(c["errors"][k]) for c in before if c["id"] in s["after_cases"]
                     for k in ("duration_s", "median_itl_ms")]
    assert sorted(steady)[len(steady) // 2] < 0.05 < 0.2 < sorted(steady_before)[len(steady_before) // 2]
    assert max(abs(e["p95_ttft_ms"]) for e in s["after_cases"].values()) < 0.2
    l4 = report["sources"]["wmx-l4-qwen2.5-0.5b"]
    assert l4["after"]["max"] > l4["before"]["max"]
    assert report["held_out/gpu-bound"]["after"]["figures"] == 165


def test_a_host_read_off_bf16_lone_requests_predicts_its_fp8_server(corpus):
    """silybench ran Qwen3-8B in BF16 and with ``--quantization fp8`` on one host (the corpus's
    ``host``). Read off the BF16 server's lone requests, the host's constants predict every FP8
    case (the weights' halved bytes and the FP8 GEMM rate come from ``engine.quantization``):
    duration and ITL within 13%, TTFT short (median -18%, to -46% where most prompts are cached)
    where prefill leans on the FP8 tensor cores (the fitted efficiency times the FP8 peak
    overstates them), none long. Read off the FP8 server's own lone requests, the weight-
    and KV-read factors agree with BF16's within 5%; the compute factor does not (1.17 vs 1.57)."""
    from llm_lb_gym.calibration.serving import evaluate, headline_errors

    bf16 = [c for c in _source(corpus, SILY) if is_reading(c)]
    fp8 = _source(corpus, SILY + "-fp8")
    host = fit_host(bf16, corpus, ServingCalibration.shipped())
    results = evaluate(fp8, corpus, host.calibration)
    steady = [abs(r.errors[k]) for r in results for k in ("duration_s", "median_itl_ms")]
    assert max(steady) < 0.13, max(steady)
    ttft = sorted(r.errors["p95_ttft_ms"] for r in results)
    assert ttft[len(ttft) // 2] < -0.05 and ttft[-1] < 0.05   # short on prefill, none long
    errs = sorted(abs(v) for r in results for v in headline_errors(r).values())
    assert errs[len(errs) // 2] < 0.06
    own = fit_host([c for c in fp8 if is_reading(c)], corpus, ServingCalibration.shipped()).multipliers
    for k in ("bandwidth", "kv_bandwidth"):
        assert own[k] == pytest.approx(host.multipliers[k], rel=0.05), (k, own, host.multipliers)
    assert own["compute"] < 0.85 * host.multipliers["compute"]


def test_readings_leave_the_start_s_other_constants(corpus):
    readings = [c for c in _source(corpus, "wmx-l4-qwen2.5-0.5b") if is_reading(c)]
    start = ServingCalibration.shipped()
    host = fit_host(readings, corpus, start).calibration
    fe0, fe1 = start.frontends["completions"], host.frontends["completions"]
    assert dataclasses.replace(fe1, delay_s=fe0.delay_s, request_s=fe0.request_s) == fe0
    assert fe1.delay_s / fe0.delay_s == pytest.approx(fe1.request_s / fe0.request_s)
    assert host.frontends["chat"] == start.frontends["chat"] and host.cpu_s == start.cpu_s
    assert {g: s for g, s in host.scales.items() if g != "l4"} == {g: s for g, s in start.scales.items() if g != "l4"}
    assert host.scale("l4").kv_bandwidth == start.scale("l4").kv_bandwidth


def test_read_host_writes_the_engine_of_the_host_it_read(corpus, tmp_path):
    """``llm-lb-gym read_host`` with silybench's five lone-request figures fits what ``validate
    --readings`` fits, and the engine option it writes, composed by Hydra from its search path,
    replays a loaded case of that host to the same figures as the fitted calibration does."""
    from omegaconf import OmegaConf

    from llm_lb_gym.calibration import replay as rp
    from llm_lb_gym.calibration.serving import case_engine
    from llm_lb_gym.experiments import read_host
    from llm_lb_gym.experiments._hydra import compose
    from llm_lb_gym.sim.config import EngineConfig

    mine = _source(corpus, SILY)
    readings = [c for c in mine if is_reading(c)]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(corpus.model_config("qwen3-8b")))
    argv = ["--model-config", str(config), "--gpu", "h100-80gb", "--endpoint", "completions",
            "--engine-version", "0.30.0", "--max-model-len", "16384", "--out-dir", str(tmp_path / "conf")]
    for c in readings:
        argv += ["--reading", f"{c.workload.prompt_tokens},{c.workload.output_tokens},"
                              f"{c.measured['p95_ttft_ms']},{c.measured['median_itl_ms']}"]
    out = read_host.main(argv)
    host = fit_host(readings, corpus, ServingCalibration.shipped())
    assert out["multipliers"] == pytest.approx(host.multipliers, rel=1e-9)
    cfg = compose("train", [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "engine=myhost"])
    engine = EngineConfig(**OmegaConf.to_container(cfg.engine, resolve=True))
    case = next(c for c in mine if c.id.endswith("longctx-8192-512-c16"))
    fitted = case_engine(case, corpus, host.calibration)
    # the two fits read the TTFT as a median (here) or a p95 (the corpus): equal to float noise
    for ours, theirs in ((engine.latency_model, fitted.latency_model), (engine.frontend_model, fitted.frontend_model)):
        a, b = dataclasses.asdict(ours), dataclasses.asdict(theirs)
        assert {k: v for k, v in a.items() if isinstance(v, tuple)} == {k: v for k, v in b.items() if isinstance(v, tuple)}
        assert ({k: v for k, v in a.items() if not isinstance(v, tuple)}
                == pytest.approx({k: v for k, v in b.items() if not isinstance(v, tuple)}, rel=1e-9))
    assert engine.total_blocks == fitted.total_blocks and engine.async_scheduling is True
    w = case.workload
    ours = rp._figures(*(lambda t, c: (t, None, c.engines[0].gap_log))(*rp._closed_loop(
        w.num_requests, w.concurrency, *rp.lengths(w), engine)))
    theirs = rp._figures(*(lambda t, c: (t, None, c.engines[0].gap_log))(*rp._closed_loop(
        w.num_requests, w.concurrency, *rp.lengths(w), fitted)))
    assert ours == pytest.approx(theirs, rel=1e-9) and abs(ours["duration_s"] / case.measured["duration_s"] - 1) < 0.1


@pytest.mark.parametrize("bad,match", [
    (["--reading", "128,1,14,6"], "--reading '128,1,14,6'; expected P,O,TTFT_MS,ITL_MS"),
    (["--reading", "128,128,14"], "output tokens >= 2"),
    (["--gpu", "h900", "--reading", "128,128,14,6"], "--gpu 'h900'; allowed: .*h100-80gb"),
    (["--reading", "128,128,14,6", "--name", "my host"], "--name 'my host'"),
    (["--reading", "128,128,14,6", "--engine-version", "0.x"], "--engine-version: engine version '0.x': expected"),
    ([], "at least one --reading"),
])
def test_read_host_names_the_bad_option(tmp_path, bad, match):
    from llm_lb_gym.experiments import read_host

    config = tmp_path / "config.json"
    config.write_text(json.dumps(load_corpus().model_config("qwen3-8b")))
    base = ["--model-config", str(config), "--gpu", "h100-80gb", "--engine-version", "0.30.0"]
    if "--gpu" in bad:
        base = base[:2] + base[4:]
    if "--engine-version" in bad:
        base = base[:4]
    with pytest.raises(SystemExit, match=match):
        read_host.main(base + bad)
    with pytest.raises(SystemExit, match="--model-config .*nowhere.json"):
        read_host.main(["--model-config", str(tmp_path / "nowhere.json"), "--gpu", "h100-80gb",
                        "--engine-version", "0.30.0", "--reading", "128,128,14,6"])


def test_a_run_that_resends_the_last_run_s_prompts_finds_them_cached(corpus):
    """``workload.resends``: silybench seeds repeat r of every point alike, so its 1,024/128 run
    at 4 in flight sends the 50 prompts of the run at 1 again. The replay runs that loop first
    and measures the second only: with vLLM's prefix caching the prompts are found cached and
    the p95 TTFT falls to about a lone request's (measured 32.2 ms, the lone run 34.3); without
    prefix caching the first loop changes nothing (the same figures as a fresh run)."""
    from llm_lb_gym.calibration import replay as rp
    from llm_lb_gym.calibration.serving import case_engine

    case = next(c for c in _source(corpus, SILY) if c.id.endswith("prefill-1024-128-c4"))
    w = case.workload
    assert w.resends == f"{SILY}/prefill-1024-128-c1" and (w.resend_concurrency, w.resend_requests) == (1, 50)
    fresh = dataclasses.replace(case, workload=dataclasses.replace(w, resends="", resend_concurrency=None,
                                                                   resend_requests=None))
    engine = case_engine(case, corpus, ServingCalibration.shipped())
    assert engine.enable_prefix_caching
    warm, cold = rp.replay(case, engine).figures, rp.replay(fresh, engine).figures
    assert warm["p95_ttft_ms"] < 0.4 * cold["p95_ttft_ms"] and warm["duration_s"] < cold["duration_s"]
    no_pc = dataclasses.replace(engine, enable_prefix_caching=False)
    a, b = rp.replay(case, no_pc).figures, rp.replay(fresh, no_pc).figures
    assert a == pytest.approx(b, rel=1e-6)


def test_resends_must_name_an_earlier_run_of_the_same_shape(tmp_path):
    from llm_lb_gym.calibration.corpus import CORPUS_PATH

    raw = json.loads(CORPUS_PATH.read_text())
    case = next(c for c in raw["cases"] if c["id"] == f"{SILY}/prefill-1024-128-c4")
    for bad, match in ((f"{SILY}/nowhere", "is not a case id of the corpus"),
                       (f"{SILY}/chat-128-128-c1", "requests of the same shape, the earlier one at most as many")):
        case["workload"]["resends"] = bad
        path = tmp_path / f"corpus{len(bad)}.json"
        path.write_text(json.dumps(raw))
        with pytest.raises(ValueError, match=f"prefill-1024-128-c4'.*workload.resends={bad!r}.*{match}"):
            load_corpus(path)


@pytest.mark.parametrize("src,median,largest", [(SILY, 0.0354, 0.198), (SILY + "-fp8", 0.0571, 0.391)])
def test_two_lone_requests_a_short_and_a_long_one_read_the_host(corpus, src, median, largest):
    """What ``read_host``'s help suggests a user send: one short (128/128) and one long
    (8,192/512) request alone. On silybench they read the host nearly as all five shapes do:
    the other 28 cases' median error 3.5% (BF16) / 5.7% (FP8), max 19.8% / 39.1%, against
    3.6% / 4.5% (max 18.7% / 40.0%) for the 25 loaded cases after five readings
    (docs/calibration.md)."""
    from llm_lb_gym.calibration.serving import evaluate, headline_errors

    cases = _source(corpus, src)
    two = [c for c in cases if c.id.endswith(("/chat-128-128-c1", "/longctx-8192-512-c1"))]
    assert len(two) == 2
    host = fit_host(two, corpus, ServingCalibration.shipped())
    assert set(host.multipliers) == {"frontend", "bandwidth", "compute", "kv_bandwidth"}
    errs = sorted(abs(v) for r in evaluate([c for c in cases if c not in two], corpus, host.calibration)
                  for v in headline_errors(r).values())
    assert len(errs) == 84 and statistics.median(errs) == pytest.approx(median, abs=0.002)
    assert errs[-1] == pytest.approx(largest, abs=0.005)   # a p95 TTFT: 1,024/128 x 64 (BF16), x 16 cached (FP8)
