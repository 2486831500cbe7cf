"""Workloads: the paper's five-task mix, arrival processes, and replayed request traces.

Every workload has ``sample(rng, num_requests) -> RequestBatch``; ``make_workload(name,
**options)`` builds one by name. Trace files are read by ``llm_lb_gym.data`` (re-exported here:
``read_trace``, ``TRACE_FORMATS``, ``TraceFormatError``, ``TraceData``), which also finds the
registered datasets.
"""

from ..data import (DATA_ENV_VAR, TRACE_FORMATS, TraceData, TraceFormatError, default_data_dir,
                    read_trace)
from .arrivals import (ArrivalProcess, DeterministicArrivals, GammaArrivals, PoissonArrivals,
                       TraceArrivals, trace_window)
from .base import Workload
from .batch import RequestBatch
from .length_dist import TokenLengthDist, fit_lognormal, fit_spliced
from .registry import (ARRIVAL_KINDS, WORKLOADS, arrival_process, make_workload,
                       synthetic_arrival_workloads, uses_synthetic_arrivals)
from .task_mix import (DEFAULT_HEAVY_DECODE_TOKENS, PAPER_TASKS, TASK_NAMES, TaskMixWorkload,
                       TaskSpec)
from .trace_workload import TraceWorkload, load_trace

__all__ = [
    "ARRIVAL_KINDS", "ArrivalProcess", "DATA_ENV_VAR", "DEFAULT_HEAVY_DECODE_TOKENS",
    "DeterministicArrivals", "GammaArrivals", "PAPER_TASKS", "PoissonArrivals", "RequestBatch",
    "TASK_NAMES", "TRACE_FORMATS", "TaskMixWorkload", "TaskSpec", "TokenLengthDist",
    "TraceArrivals", "TraceData", "TraceFormatError", "TraceWorkload", "WORKLOADS", "Workload",
    "arrival_process", "default_data_dir", "fit_lognormal", "fit_spliced", "load_trace",
    "make_workload", "read_trace", "synthetic_arrival_workloads", "trace_window",
    "uses_synthetic_arrivals",
]
