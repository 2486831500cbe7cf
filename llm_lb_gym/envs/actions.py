"""Action coercion for ``LLMClusterEnv.step``: integers only, in ``0..m``.

Accepted, as ``gymnasium.spaces.Discrete`` does: Python ints, numpy integers, 0-d and shape-(1,)
integer arrays, and other objects with ``__index__`` (a 0-d integer tensor). Rejected with
``TypeError``: floats (``int(2.7)`` would silently route to instance 2), bools, strings, float or
bool arrays, anything else; with ``ValueError``: other array shapes and out-of-range values.
"""

from __future__ import annotations

import operator

import numpy as np


def _allowed(n: int) -> str:
    return (f"allowed: an integer in 0..{n - 1} (Python or numpy int, or an integer array of "
            f"shape () or (1,))")


def coerce_action(action, n: int) -> int:
    """``action`` as a Python int in ``0..n-1``, or a TypeError/ValueError saying what is allowed."""
    if type(action) is int:
        a = action
    elif isinstance(action, np.ndarray):
        if action.shape not in ((), (1,)):
            raise ValueError(f"action array of shape {action.shape}; {_allowed(n)}")
        if action.dtype.kind not in "iu":
            raise TypeError(f"action array of dtype {action.dtype}; {_allowed(n)}")
        a = int(action.reshape(()))
    elif isinstance(action, (bool, np.bool_)):
        raise TypeError(f"action {action!r} is a bool; {_allowed(n)}")
    else:
        try:
            a = operator.index(action)
        except TypeError:
            raise TypeError(f"action {action!r} of type {type(action).__name__}; "
                            f"{_allowed(n)}") from None
    if not 0 <= a < n:
        raise ValueError(f"action {action!r} out of range; {_allowed(n)}")
    return a
