"""Small validation helpers shared by every typed config.

Every error names the option and the allowed values, so a typo in a Hydra override or a
``gym.make`` keyword is caught at construction time instead of surfacing as a wrong number.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Mapping, TypeVar

import numpy as np

T = TypeVar("T")


class ConfigError(ValueError):
    """An option has a value outside its allowed set or range."""


class UnknownOptionError(ConfigError, TypeError):
    """An option name that does not exist (a typo, or a keyword this constructor does not take).

    A ``TypeError`` as well, as Python raises for an unexpected keyword argument: generic
    wrappers probe optional constructor keywords (``render_mode``, ``frameskip``, ...) by
    catching ``TypeError`` and retrying without them, and a typo still fails on the retry.
    """


def _interval(lo, hi, lo_open: bool, hi_open: bool) -> str:
    left = "-inf" if lo is None else f"{lo}"
    right = "inf" if hi is None else f"{hi}"
    return f"{'(' if lo_open or lo is None else '['}{left}, {right}{')' if hi_open or hi is None else ']'}"


def check_range(name: str, value: float, lo: float | None = None, hi: float | None = None,
                *, lo_open: bool = False, hi_open: bool = False, allow_inf: bool = False) -> None:
    """Raise ConfigError unless ``value`` is a real number (int, float or a numpy scalar; not a
    bool or a string), not NaN, finite unless ``allow_inf``, and ``lo (<|<=) value (<|<=) hi``."""
    interval = _interval(lo, hi, lo_open, hi_open)
    allowed = f"allowed: {'a number' if allow_inf else 'a finite number'} in {interval}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigError(f"{name}={value!r} is not a number ({type(value).__name__}); {allowed}")
    # Integers compare exactly (float() of a huge int would overflow).
    v = int(value) if isinstance(value, numbers.Integral) else float(value)
    if v != v:
        raise ConfigError(f"{name} is NaN; {allowed}")
    if not allow_inf and isinstance(v, float) and math.isinf(v):
        raise ConfigError(f"{name}={value!r} is not finite; {allowed}")
    bad_lo = lo is not None and (v <= lo if lo_open else v < lo)
    bad_hi = hi is not None and (v >= hi if hi_open else v > hi)
    if bad_lo or bad_hi:
        raise ConfigError(f"{name}={value!r} is out of range; allowed: {interval}")


def check_int(name: str, value: int, lo: int | None = None, hi: int | None = None) -> None:
    """Raise ConfigError unless value is an integer (Python or numpy; not a bool, a float or a
    string) within [lo, hi]."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name}={value!r} must be an integer; allowed: integers in "
                          f"{_interval(lo, hi, False, False)}")
    check_range(name, int(value), lo, hi)


def check_bool(name: str, value: bool) -> None:
    """Raise ConfigError unless value is a bool (a string such as "False" would be truthy)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name}={value!r} must be a bool; allowed: True, False")


def check_choice(name: str, value: str, allowed: Iterable[str]) -> None:
    """Raise ConfigError unless value is one of ``allowed``."""
    allowed = list(allowed)
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not valid; allowed: {', '.join(map(str, allowed))}")


def lookup(kind: str, registry: Mapping[str, T], key: str) -> T:
    """Registry lookup whose error lists the valid names."""
    try:
        return registry[key]
    except KeyError:
        raise ConfigError(
            f"unknown {kind} {key!r}; allowed: {', '.join(sorted(registry))}"
        ) from None


def reject_unknown(kind: str, given: Mapping[str, object], known: Iterable[str]) -> None:
    """Raise UnknownOptionError naming any key of ``given`` that is not in ``known``."""
    known = set(known)
    extra = sorted(set(given) - known)
    if extra:
        raise UnknownOptionError(
            f"unknown {kind} option(s): {', '.join(extra)}; allowed: {', '.join(sorted(known))}"
        )


def reject_unexpected_keywords(given: Mapping[str, object], known: Iterable[str]) -> None:
    """A constructor's ``**options`` check, worded as Python words it for a plain signature
    (``__init__() got an unexpected keyword argument 'x'``; wrappers match that text), then the
    allowed names."""
    known = set(known)
    extra = [k for k in given if k not in known]   # in the caller's order, as Python reports
    if extra:
        more = f" (and {', '.join(map(repr, extra[1:]))})" if len(extra) > 1 else ""
        raise UnknownOptionError(
            f"__init__() got an unexpected keyword argument {extra[0]!r}{more}; "
            f"allowed: {', '.join(sorted(known))}")


def plain_values(value):
    """``value`` with every numpy scalar inside (dicts, lists, tuples) as the Python scalar it
    holds (``np.float32(10.0)`` -> ``10.0``), so an option given as a numpy value computes in
    float64 as the plain value does (a float32 arrival rate drew float32-rounded arrival gaps)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: plain_values(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(plain_values(v) for v in value)
    return value
