"""Command-line helpers shared by the argparse entry points (no Hydra: the serving commands
run with the ``serve`` extra alone)."""

from __future__ import annotations


def key_values(pairs, what: str) -> dict:
    """``key=value`` command-line pairs as a dict, each value read as YAML (numbers, lists,
    null); a pair without ``=`` is an error naming ``what`` (the command and option)."""
    import yaml

    out = {}
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep:
            raise SystemExit(f"{what}: {p!r} is not key=value")
        out[k] = yaml.safe_load(v)
    return out
