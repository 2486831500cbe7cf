"""Workloads: the paper's five-task mix, arrival processes, and replayed request traces.

Every workload has ``sample(rng, num_requests) -> RequestBatch``; ``make_workload(name,
**options)`` builds one by name.
"""

from .arrivals import (ArrivalProcess, DeterministicArrivals, GammaArrivals, PoissonArrivals,
                       TraceArrivals, trace_window)
from .base import Workload
from .batch import RequestBatch
from .data_dir import DATA_ENV_VAR, default_data_dir, resolve_data_file
from .length_dist import TokenLengthDist, fit_lognormal, fit_spliced
from .registry import ARRIVAL_KINDS, WORKLOADS, arrival_process, make_workload
from .task_mix import (DEFAULT_HEAVY_DECODE_TOKENS, PAPER_TASKS, TASK_NAMES, TaskMixWorkload,
                       TaskSpec)
from .trace_readers import TRACE_FORMATS, TraceData, TraceFormatError, read_trace
from .trace_workload import TraceWorkload, load_trace

__all__ = [
    "ARRIVAL_KINDS", "ArrivalProcess", "DATA_ENV_VAR", "DEFAULT_HEAVY_DECODE_TOKENS",
    "DeterministicArrivals", "GammaArrivals", "PAPER_TASKS", "PoissonArrivals", "RequestBatch",
    "TASK_NAMES", "TRACE_FORMATS", "TaskMixWorkload", "TaskSpec", "TokenLengthDist",
    "TraceArrivals", "TraceData", "TraceFormatError", "TraceWorkload", "WORKLOADS", "Workload",
    "arrival_process", "default_data_dir", "fit_lognormal", "fit_spliced", "load_trace",
    "make_workload", "read_trace", "resolve_data_file", "trace_window",
]
