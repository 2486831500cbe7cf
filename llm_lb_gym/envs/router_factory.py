"""Routers built for one env: the registry's routers, given what they must know of it.

A router from ``routers`` knows nothing of the env; some need a piece of it (Min-Min reads the
observation's decode-bucket edges to size jobs by bucket upper bounds). ``make_env_router`` is
the one place that injects those pieces (and the lookahead router its models), used by the env itself (a router as guidance teacher)
and by everything that evaluates or imitates routers on the env. It takes the env duck-typed,
so this module does not import the env class.
"""

from __future__ import annotations


def make_env_router(name: str, env, **options):
    """A fresh router ``name`` configured for ``env`` (an ``LLMClusterEnv``, unwrapped)."""
    from ..routers.registry import make_router

    if name == "min_min" and "decode_edges_tokens" not in options:
        options["decode_edges_tokens"] = env.obs_builder.decode_scheme.edges_tokens
    if name == "lookahead":
        # The rollouts need the env's models: its decision grid, the workload that imagines
        # future arrivals, the predictor and bucket schemes that fill the imagined rows.
        options.setdefault("decision_interval_s", env.cfg.decision_interval_s)
        router = make_router(name, **options)
        ob = env.obs_builder
        return router.attach(env.workload, env.predictor, ob.prompt_scheme, ob.decode_scheme,
                             base_router=make_env_router(router.options.base, env,
                                                         **dict(router.options.base_options)))
    return make_router(name, **options)
