"""The workload interface: anything that can draw one episode's requests.

A Protocol rather than a base class so a workload is any object with ``sample`` (a frozen
config dataclass, a test double, another package's text-corpus workload) without inheriting
from this package. All randomness comes from the generator the caller passes (the
environment's ``np_random``), so the same seed gives the same batch bit for bit.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from .batch import RequestBatch


@runtime_checkable
class Workload(Protocol):
    def sample(self, rng: np.random.Generator, num_requests: int) -> RequestBatch:
        """Draw ``num_requests`` requests (arrivals from about 0 s, sorted) using only ``rng``."""
        ...
