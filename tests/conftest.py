"""Test-session settings: one torch/OpenMP thread (two threads on a busy 2-core machine slow
SB3 about eight-fold), and SB3's default loggers write under pytest's temporary directory
instead of leaving ``SB3-<date>`` folders in the system temp dir."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True, scope="session")
def _quiet_sb3_and_one_thread(tmp_path_factory):
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    yield
