"""Latency model, its presets, and the calibration that produced them (experiments/calibrate.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from experiments import calibrate as cal
from llm_lb_gym._validate import ConfigError
from llm_lb_gym.data import DataNotFoundError, default_data_dir
from llm_lb_gym.sim.latency import PRESETS, LatencyModel, get_preset

COEFFS = [f.name for f in dataclasses.fields(LatencyModel)]
VIDUR = default_data_dir() / "profiling" / "vidur"
needs_data = pytest.mark.skipif(not VIDUR.is_dir(), reason=f"profiling data absent at {VIDUR}")


def _synthetic_points(truth: LatencyModel) -> list[cal.CalibrationPoint]:
    """Prefill chunks with and without a cached prefix, decode batches over batch x context."""
    pts = []
    for chunk in (16, 128, 512, 2048, 4096):
        for prefix in (0, 1024):
            pairs = chunk * (prefix + chunk)
            pts.append(cal.CalibrationPoint("prefill", "", chunk, pairs, 0, 0,
                                            truth.iteration_s(chunk, pairs)))
    for batch in (1, 8, 32, 128):
        for ctx in (64, 512, 2048):
            pts.append(cal.CalibrationPoint("decode", "", 0, 0, batch, batch * ctx,
                                            truth.iteration_s(0, 0, batch, batch * ctx)))
    return pts


@pytest.mark.parametrize("weighting", cal.WEIGHTINGS)
def test_fit_recovers_known_coefficients(weighting: str) -> None:
    truth = LatencyModel(base_s=0.012, prefill_token_s=7.5e-5, prefill_attn_s=1.1e-8,
                         decode_seq_s=4.0e-5, decode_ctx_s=2.5e-7)
    fitted = cal.fit_latency_model(_synthetic_points(truth), weighting)
    for name in COEFFS:
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_fit_keeps_an_absent_term_at_zero() -> None:
    truth = LatencyModel(base_s=0.01, prefill_token_s=5e-5, prefill_attn_s=0.0,
                         decode_seq_s=0.0, decode_ctx_s=3e-7)
    fitted = cal.fit_latency_model(_synthetic_points(truth))
    assert fitted.prefill_attn_s == pytest.approx(0.0, abs=1e-15)
    assert fitted.decode_seq_s == pytest.approx(0.0, abs=1e-12)


def test_fit_rejects_unknown_weighting() -> None:
    with pytest.raises(ConfigError, match="weighting.*relative, absolute"):
        cal.fit_latency_model([], "squared")


def test_v100_derivation_hits_paper_anchors_from_any_a100_fit() -> None:
    a100 = LatencyModel(0.01, 5e-5, 9e-9, 9e-5, 3e-7)
    v100 = cal.derive_v100(a100, log=lambda _: None)
    assert v100.prefill_token_s == cal.PAPER_GRAD1_S
    assert v100.isolated_request_s(1000, 1000) == pytest.approx(17.0, rel=1e-12)
    # compute-bound prefill attention follows the FP16 throughput ratio only
    assert v100.prefill_attn_s == pytest.approx(9e-9 * 312 / 125)
    # memory-bound terms keep their proportions
    assert v100.decode_ctx_s / v100.base_s == pytest.approx(3e-7 / 0.01)


def test_round_sig() -> None:
    assert cal.round_sig(8.8876e-05) == 8.888e-05
    assert cal.round_sig(0.0096754) == 0.009675
    assert cal.round_sig(0.0) == 0.0


# --- real profiling data ------------------------------------------------------------------


@needs_data
def test_loaders_parse_real_files() -> None:
    l2 = cal.load_operator_profile(VIDUR / "compute/a100/Llama-2-7b-hf/mlp.csv")
    l3 = cal.load_operator_profile(VIDUR / "compute/a100/Meta-Llama-3-8B/mlp.csv")
    assert (l2.query_heads, l2.kv_heads) == (32, 32) and (l3.query_heads, l3.kv_heads) == (32, 8)
    assert l2.num_tokens[0] == 1 and l2.num_tokens[-1] == 4096
    assert np.all(np.diff(l2.num_tokens) > 0)
    # a 4096-token batch costs far more than a 1-token one (compute bound vs weight reads)
    assert 20 < l2.step_ms(4096) / l2.step_ms(1) < 40

    att = cal.load_attention_medians(VIDUR / "attention_medians_llama2_7b_a100.txt")
    dec = {(p.query_tokens, p.context_tokens): p for p in att if p.phase == "decode"}
    pre = {(p.query_tokens, p.context_tokens): p for p in att if p.phase == "prefill"}
    assert len(dec) == 10 and len(pre) == 22
    assert dec[(64, 2048)].attention_ms == 1.186 and dec[(1, 1984)].reshape_ms == 0.001
    assert pre[(4096, 0)].attention_ms == pytest.approx((2.742 + 2.725) / 2)
    assert pre[(1792, 1024)].reshape_ms == pytest.approx(0.019)  # borrowed from chunk 1792 kv0

    cpu = cal.load_cpu_overheads(VIDUR / "cpu_overheads_a100.csv")
    assert list(cpu.batch_sizes) == [*range(8, 65, 8), 80, 96, 112, 128]
    bs8 = 0.15551686131708756 + 0.5091560514690819 + 0.3365525879195709 + 0.17187271812714278 \
        + 0.22040716915701827
    assert cpu.at(8) == pytest.approx(bs8)
    assert cpu.at(1) < cpu.at(8) < cpu.at(128)


@pytest.fixture(scope="module")
def calibration() -> cal.Calibration:
    try:   # the registered profiles, found and checksum-checked by llm_lb_gym.data
        return cal.calibrate(log=lambda _: None)
    except DataNotFoundError as err:
        pytest.skip(f"profiling data absent: {err}")


@needs_data
def test_a100_fit_error_is_within_measured_bound(calibration: cal.Calibration) -> None:
    # measured: prefill mean 6.1% / max 16.6%, decode mean 6.4% / max 11.5% (docs/calibration.md)
    rep = calibration.fits["llama2-7b-a100"]
    for phase in ("prefill", "decode"):
        mean, worst = rep.summary(phase)
        assert mean < 0.08, (phase, mean)
        assert worst < 0.20, (phase, worst)


@needs_data
def test_relative_weighting_beats_absolute_on_mean_relative_error(calibration: cal.Calibration) -> None:
    for name, rep in calibration.fits.items():
        alt = cal.FitReport(name, cal.fit_latency_model(rep.points, "absolute"), rep.points, "absolute")
        assert np.abs(rep.rel_errors()).mean() < np.abs(alt.rel_errors()).mean(), name


@needs_data
def test_presets_are_the_calibrated_coefficients(calibration: cal.Calibration) -> None:
    models = {n: r.model for n, r in calibration.fits.items()} | calibration.derived
    assert set(models) == set(cal.FITTED_PRESETS + cal.DERIVED_PRESETS)
    for name, model in models.items():
        preset = get_preset(name).latency
        for c in COEFFS:
            assert getattr(preset, c) == pytest.approx(getattr(model, c), rel=1e-3), (name, c)


# --- presets and the model ---------------------------------------------------------------


def test_v100_preset_matches_paper() -> None:
    v100 = get_preset("llama2-7b-v100").latency
    assert v100.prefill_token_s == 3.2e-4
    assert v100.isolated_request_s(1000, 1000) == pytest.approx(17.0, rel=0.02)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_has_kv_cache_and_a_source(name: str) -> None:
    preset = get_preset(name)
    assert preset.num_kv_blocks(block_size=16, gpu_memory_utilization=0.9) > 0
    assert "experiments/calibrate" in preset.source   # calibrate.py or calibrate_hardware.py


@pytest.mark.parametrize("field", COEFFS)
def test_negative_coefficient_is_rejected_naming_the_field(field: str) -> None:
    good = dict(base_s=0.01, prefill_token_s=1e-4, prefill_attn_s=1e-8, decode_seq_s=1e-4,
                decode_ctx_s=1e-7)
    with pytest.raises(ConfigError, match=f"latency.{field}"):
        LatencyModel(**{**good, field: -1e-9})


def test_unknown_preset_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="llama2-7b-a100.*llama2-7b-v100"):
        get_preset("llama2-7b-t4")
