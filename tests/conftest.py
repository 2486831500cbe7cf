"""Test-session settings: one torch/OpenMP thread (two threads on a busy 2-core machine slow
SB3 about eight-fold), SB3's default loggers write under pytest's temporary directory
instead of leaving ``SB3-<date>`` folders in the system temp dir, and hypothesis profiles.

Hypothesis: ``pytest`` runs the property tests **derandomized** (profile ``ci``: the examples
are a function of the test's code, no example database), so the test command passes or fails
the same way on every run and machine; a rare corner must not fail CI at random, as the
prefix-caching one of 2026-12-06 could. Searching for new corners is a separate, deliberate
run: ``pytest --hypothesis-profile=explore`` (fresh random examples each run, failures kept in
``.hypothesis/`` and replayed first next time), with ``LLM_LB_GYM_HYPOTHESIS_EXAMPLES=3000`` for
a wide one; a corner it finds is pinned with ``@example`` in the test."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    from hypothesis import settings as _hyp_settings
except ImportError:      # the core install has no test tools; its tests do not use hypothesis
    _hyp_settings = None
else:
    # From hypothesis' own default: with $CI set it has loaded its "ci" profile already (no
    # example database), which "explore" must not inherit.
    _default = _hyp_settings.get_profile("default")
    _hyp_settings.register_profile("ci", _default, derandomize=True, database=None, print_blob=True)
    _hyp_settings.register_profile("explore", _default, derandomize=False, print_blob=True)
    # `pytest --hypothesis-profile=NAME` (the hypothesis plugin) overrides this default.
    _hyp_settings.load_profile(os.environ.get("LLM_LB_GYM_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True, scope="session")
def _quiet_sb3_and_one_thread(tmp_path_factory):
    os.environ["SB3_LOGDIR"] = str(tmp_path_factory.mktemp("sb3_logs"))
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass
    yield
