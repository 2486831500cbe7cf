"""Routers built for one env: the registry's routers, given what they must know of it.

A router from ``policies`` knows nothing of the env; some need a piece of it (Min-Min reads the
observation's decode-bucket edges to size jobs by bucket upper bounds). ``make_env_router`` is
the one place that injects those pieces, used by the env itself (a router as guidance teacher)
and by everything that evaluates or imitates routers on the env. It takes the env duck-typed,
so this module does not import the env class.
"""

from __future__ import annotations


def make_env_router(name: str, env, **options):
    """A fresh router ``name`` configured for ``env`` (an ``LLMClusterEnv``, unwrapped)."""
    from ..policies.registry import make_router

    if name == "min_min" and "decode_edges_tokens" not in options:
        options["decode_edges_tokens"] = env.obs_builder.decode_scheme.edges_tokens
    return make_router(name, **options)
