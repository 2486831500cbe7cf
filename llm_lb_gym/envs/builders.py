"""Turn the env's workload and predictor options into objects.

Options arrive as names, dicts (Hydra, ``gym.make`` keywords) or ready objects; the registries
validate names and options and list the allowed ones in their errors.
"""

from __future__ import annotations

from .config import as_name_and_options


ARRIVAL_OPTIONS = ("arrival", "arrivals", "rate_rps", "cv")


def build_workload(spec, arrival_rate_rps: float | None):
    """A workload object from a name, a dict or an object with ``sample``.

    ``arrival_rate_rps`` sets the Poisson rate of workloads whose arrivals are synthetic
    (the task mix, length-only traces, text corpora) unless their options choose arrivals
    themselves; timestamped traces keep their own arrivals (scale them with ``rate_scale``).
    """
    if hasattr(spec, "sample"):
        return spec
    from ..workload.registry import make_workload, uses_synthetic_arrivals

    name, opts = as_name_and_options(spec, "workload")
    synthetic = uses_synthetic_arrivals(name, opts)
    if synthetic and arrival_rate_rps is not None and not any(k in opts for k in ARRIVAL_OPTIONS):
        opts["rate_rps"] = arrival_rate_rps
    return make_workload(name, **opts)


def build_predictor(spec, workload=None):
    """A length predictor from a name, a dict or an object with ``predict``; ``workload`` is
    the history its calibration is fitted on (``predictor/calibration.py``)."""
    if hasattr(spec, "predict"):
        return spec
    from ..predictor.registry import make_predictor

    name, opts = as_name_and_options(spec, "predictor")
    return make_predictor(name, workload=workload, **opts)
