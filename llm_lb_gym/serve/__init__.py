"""Serving: an OpenAI-compatible router service in front of real or simulated backends.

Needs the ``serve`` extra (``pip install -e ".[serve]"``: Starlette, uvicorn,
aiohttp, prometheus_client; httpx for the tests). Nothing here is imported by ``import llm_lb_gym``. Modules:
``protocol`` (request validation), ``scrape`` (backend metrics), ``view`` (the router's view of
its backends, shaped like the simulator's cluster), ``router_app`` (the service),
``sim_backend`` (a backend paced by the simulator's engine), ``loadgen`` (open-loop replay),
``launch`` (run servers on 127.0.0.1). docs/serving.md explains how they fit.
"""
