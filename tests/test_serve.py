"""The router service over real sockets on 127.0.0.1: streaming, metrics, routing, bad input,
faults, client disconnects (llm_lb_gym/serve, docs/serving.md).

Servers run on ephemeral ports in threads of this process (one backend in a child process where
a test kills it); every wait is a bounded loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

pytest.importorskip("starlette")
pytest.importorskip("aiohttp")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("prometheus_client")

from llm_lb_gym.serve.config import RouterServiceConfig, served_routers  # noqa: E402
from llm_lb_gym.serve.launch import ServerThread, free_port, spawn_sim_backend  # noqa: E402
from llm_lb_gym.serve.loadgen import replay, summarize  # noqa: E402
from llm_lb_gym.serve.protocol import BadRequest, parse_request  # noqa: E402
from llm_lb_gym.serve.router_app import create_app as router_app  # noqa: E402
from llm_lb_gym.serve.scrape import parse_metrics  # noqa: E402
from llm_lb_gym.serve.sim_backend import SimBackendConfig  # noqa: E402
from llm_lb_gym.serve.sim_backend import create_app as sim_app  # noqa: E402
from llm_lb_gym.sim.config import EngineConfig  # noqa: E402

MODEL = "sim-model"


def metric(text: str, name: str, **labels) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total, found = 0.0, False
    for line in text.splitlines():
        m = re.match(r"^([\w:]+)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(lab.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
            found = True
    assert found, f"no sample of {name} {labels}"
    return total


def wait_for(pred, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture
def backends():
    servers = [ServerThread(sim_app(SimBackendConfig(time_scale=2.0))) for _ in range(2)]
    yield servers
    for s in servers:
        s.stop()


def start_router(urls, **kw):
    kw.setdefault("poll_interval_s", 0.05)
    return ServerThread(router_app(RouterServiceConfig(backends=tuple(urls), **kw)))


def test_streaming_passes_tokens_through_as_they_are_made(backends):
    with start_router([b.url for b in backends], router="jsq") as r:
        stamps = []
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 8, "stream": True}
        with httpx.stream("POST", r.url + "/v1/chat/completions", json=body, timeout=20) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    stamps.append((time.monotonic(), line))
        tokens = [t for t, line in stamps if '"content":" tok"' in line]
        assert len(tokens) == 8 and stamps[-1][1] == "data: [DONE]"
        # Seven decode iterations of the V100 preset (~15 ms simulated each, time scale 2)
        # separate the first token from the last: not one burst at the end.
        assert tokens[-1] - tokens[0] > 0.02
        assert json.loads(stamps[0][1][6:])["object"] == "chat.completion.chunk"


def test_bad_input_gets_a_4xx_with_the_reason(backends):
    with start_router([backends[0].url], context_tokens=100) as r:
        cases = [
            (b"{not json", 400, "not valid JSON"),
            (b"[1, 2]", 400, "JSON object"),
            (json.dumps({"model": "gpt-9", "prompt": "hi"}).encode(), 404, "does not exist"),
            (json.dumps({"model": MODEL, "prompt": "w " * 90, "max_tokens": 20}).encode(), 400,
             "maximum context length is 100"),
            (json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 0}).encode(), 400, "max_tokens"),
            (json.dumps({"model": MODEL, "prompt": 5}).encode(), 400, "'prompt'"),
        ]
        for raw, status, reason in cases:
            resp = httpx.post(r.url + "/v1/completions", content=raw, timeout=10)
            assert resp.status_code == status, resp.text
            assert reason in resp.json()["error"]["message"]
        resp = httpx.post(r.url + "/v1/chat/completions", json={"model": MODEL, "messages": []}, timeout=10)
        assert resp.status_code == 400 and "messages" in resp.json()["error"]["message"]
        assert httpx.get(r.url + "/v1/completions", timeout=10).status_code == 405
        text = httpx.get(r.url + "/metrics").text
        assert metric(text, "llm_lb_router_requests_total", outcome="rejected") == 7
        assert httpx.get(backends[0].url + "/metrics").text.count("sim_backend_requests_total 0") == 1


def test_round_robin_alternates_and_metrics_count(backends):
    with start_router([b.url for b in backends], router="round_robin") as r:
        with httpx.Client(base_url=r.url, timeout=20) as c:
            for _ in range(6):
                resp = c.post("/v1/completions", json={"model": MODEL, "prompt": "a b c", "max_tokens": 2})
                assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 2
            text = c.get("/metrics").text
            models = c.get("/v1/models").json()
        assert [m["id"] for m in models["data"]] == [MODEL]
        for b in backends:
            assert metric(httpx.get(b.url + "/metrics").text, "sim_backend_requests_total") == 3
        assert metric(text, "llm_lb_router_requests_total", outcome="ok") == 6
        assert metric(text, "llm_lb_router_decision_seconds_count") == 6
        assert metric(text, "llm_lb_router_queue_length") == 0
        for b in backends:
            assert metric(text, "llm_lb_router_backend_in_flight", backend=b.url) == 0
            assert metric(text, "llm_lb_router_backend_up", backend=b.url) == 1


def test_a_seeded_random_router_draws_as_the_simulator_does_and_names_each_backend(backends):
    """``seed`` gives the served random router the simulated one's draws for the same request
    sequence (sim_to_real sets the two side by side), and ``backend_header`` names the backend
    of each reply, streamed, assembled or passed through, which the load generator records."""
    import numpy as np

    from llm_lb_gym.routers.drive import run_router
    from llm_lb_gym.routers.registry import make_router
    from llm_lb_gym.sim.config import ClusterConfig
    from llm_lb_gym.workload.batch import RequestBatch

    n = 12
    batch = RequestBatch(arrival_s=np.arange(n) * 0.04, prompt_tokens=np.full(n, 3), decode_tokens=np.full(n, 2),
                         task_id=np.zeros(n, np.int64))
    urls = [b.url for b in backends]

    def simulated(seed):
        cluster = run_router(batch, ClusterConfig(num_instances=2), make_router("random"), np.random.default_rng(seed), 0.0)
        return [int(i) for i in cluster.table.instance]

    def served(seed, stream=True, **kw):
        with start_router(urls, router="random", seed=seed, **kw) as r:   # a fresh generator each
            res = asyncio.run(replay(r.url, batch.arrival_s, batch.prompt_tokens, batch.decode_tokens,
                                     model=MODEL, stream=stream))
        assert all(x.error is None for x in res)
        return [urls.index(x.backend) if x.backend else -1 for x in res]

    assert simulated(3) != simulated(4)           # the draws tell the seeds apart
    for seed, stream in ((3, True), (4, True), (3, False)):
        assert served(seed, stream, backend_header=True) == simulated(seed)
    assert served(3) == [-1] * n                  # off by default: no backend named
    with start_router(urls[:1], backend_header=True, assemble_upstream=False) as r:   # passed through whole
        resp = httpx.post(r.url + "/v1/completions", json={"model": MODEL, "prompt": "a b", "max_tokens": 2}, timeout=20)
        assert resp.status_code == 200 and resp.headers["x-llm-lb-backend"] == urls[0]


def test_least_requests_spreads_concurrent_streams(backends):
    with start_router([b.url for b in backends], router="least_requests") as r:
        n = 6
        res = asyncio.run(replay(r.url, [0.0] * n, [4] * n, [20] * n, time_scale=2.0))
        assert all(x.error is None for x in res), [x.error for x in res]
        counts = [metric(httpx.get(b.url + "/metrics").text, "sim_backend_requests_total") for b in backends]
        assert counts == [3, 3]


def test_late_binding_holds_requests_at_the_router():
    # 64 blocks of 16 tokens; each request needs 300 tokens = 19 blocks with full reservation,
    # so at most three are released at once and the rest wait at the router, not in the backend.
    eng = EngineConfig(num_kv_blocks=64)
    with ServerThread(sim_app(SimBackendConfig(engine=eng, time_scale=4.0))) as b, \
            start_router([b.url], router="late_binding",
                         router_options={"period_s": 0.0, "reserve": "full"}) as r:
        svc = r.server.config.app.state.service
        wait_for(lambda: svc.views[0].total_blocks == 64, what="the first metrics poll")
        held = []

        async def go():
            task = asyncio.ensure_future(replay(r.url, [0.0] * 8, [200] * 8, [100] * 8, time_scale=4.0))
            for _ in range(200):
                held.append(len(svc.cluster.queue))
                await asyncio.sleep(0.01)
                if task.done():
                    break
            return await task

        res = asyncio.run(go())
        assert all(x.error is None for x in res), [x.error for x in res]
        assert max(held) >= 4 and held[-1] == 0


def test_no_backend_up_is_a_503_not_a_hang():
    port = free_port()
    with start_router([f"http://127.0.0.1:{port}"], queue_timeout_s=0.5) as r:
        wait_for(lambda: httpx.get(r.url + "/health").status_code == 503, what="backend marked down")
        t = time.monotonic()
        resp = httpx.post(r.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=10)
        assert resp.status_code == 503 and "no backend" in resp.json()["error"]["message"]
        assert time.monotonic() - t < 5


def test_client_disconnect_cancels_the_upstream_request(backends):
    b = backends[0]
    with start_router([b.url]) as r:
        body = {"model": MODEL, "prompt": "a", "max_tokens": 500, "stream": True}
        with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=20) as resp:
            got = 0
            for line in resp.iter_lines():
                got += line.startswith("data: ")
                if got >= 3:
                    break
        svc = r.server.config.app.state.service
        wait_for(lambda: metric(httpx.get(b.url + "/metrics").text, "sim_backend_cancelled_total") == 1,
                 what="the backend to see the cancellation")
        wait_for(lambda: not svc.views[0].inflight, what="the router's in-flight table to empty")
        text = httpx.get(r.url + "/metrics").text
        assert metric(text, "llm_lb_router_requests_total", outcome="cancelled") == 1


def _leave_after(url: str, body: dict, after_s: float) -> None:
    """POST ``body`` and drop the connection after ``after_s`` without reading a reply."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url, json=body, timeout=httpx.Timeout(10.0, read=after_s))


def test_non_streamed_client_disconnect_cancels_the_upstream_request(backends):
    b = backends[0]
    with start_router([b.url]) as r:
        svc = r.server.config.app.state.service
        # 500 tokens at ~15 ms simulated (time scale 2): ~4 s; the client leaves after 0.3 s.
        _leave_after(r.url + "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 500}, 0.3)
        wait_for(lambda: metric(httpx.get(b.url + "/metrics").text, "sim_backend_cancelled_total") == 1,
                 what="the backend to see the cancellation")
        # The backend aborted it: no request left running there (its slot and KV are free).
        backend_text = httpx.get(b.url + "/metrics").text
        assert metric(backend_text, "vllm:num_requests_running") == 0
        assert metric(backend_text, "vllm:gpu_cache_usage_perc") == 0
        wait_for(lambda: not svc.views[0].inflight, what="the router's in-flight table to empty")
        text = httpx.get(r.url + "/metrics").text
        assert metric(text, "llm_lb_router_requests_total", outcome="cancelled") == 1
        # The service keeps serving.
        ok = httpx.post(r.url + "/v1/completions", json={"model": MODEL, "prompt": "a", "max_tokens": 3}, timeout=20)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_client_leaving_a_held_request_takes_it_out_of_the_router_queue():
    one_slot = SimBackendConfig(time_scale=2.0, engine=EngineConfig(max_num_seqs=1))
    with ServerThread(sim_app(one_slot)) as b, \
            start_router([b.url], router="late_binding", max_seqs=1, decision_interval_s=0.01) as r:
        svc = r.server.config.app.state.service

        async def go():
            import aiohttp

            async with aiohttp.ClientSession() as client:
                first = asyncio.ensure_future(client.post(r.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "a", "max_tokens": 300}))
                await asyncio.sleep(0.2)
                held = asyncio.ensure_future(client.post(r.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "b", "max_tokens": 5}))
                await asyncio.sleep(0.3)
                assert len(svc.cluster.queue) == 1   # late_binding holds it: the one slot is busy
                held.cancel()                        # the client gives up on the held request
                with pytest.raises(asyncio.CancelledError):
                    await held
                first.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await first

        asyncio.run(go())
        wait_for(lambda: not svc.cluster.queue and not svc.views[0].inflight,
                 what="the queue and the in-flight table to empty")
        text = httpx.get(r.url + "/metrics").text
        assert metric(text, "llm_lb_router_requests_total", outcome="cancelled") == 2
        # Only the first request ever reached the backend, and it was aborted there.
        wait_for(lambda: metric(httpx.get(b.url + "/metrics").text, "sim_backend_cancelled_total") == 1,
                 what="the backend to abort the first request")
        assert metric(httpx.get(b.url + "/metrics").text, "sim_backend_requests_total") == 1


def test_simulated_backend_gives_an_aborted_request_s_slot_to_the_next():
    """One slot; a 1,000-token request (~8 s at time scale 2) whose client leaves must not delay
    the next request by its remaining generation."""
    one_slot = SimBackendConfig(time_scale=2.0, engine=EngineConfig(max_num_seqs=1))
    with ServerThread(sim_app(one_slot)) as b:
        for stream in (False, True):
            body = {"model": MODEL, "prompt": "a", "max_tokens": 1000, "stream": stream}
            if stream:
                with httpx.stream("POST", b.url + "/v1/completions", json=body, timeout=20) as resp:
                    next(resp.iter_lines())
            else:
                _leave_after(b.url + "/v1/completions", body, 0.3)
            t0 = time.monotonic()
            ok = httpx.post(b.url + "/v1/completions", json={"model": MODEL, "prompt": "b", "max_tokens": 4},
                            timeout=20)
            assert ok.status_code == 200
            assert time.monotonic() - t0 < 2.0, f"stream={stream}: the aborted request kept its slot"
        text = httpx.get(b.url + "/metrics").text
        assert metric(text, "sim_backend_cancelled_total") == 2
        assert metric(text, "vllm:num_requests_running") == 0


def test_backend_killed_mid_replay_fails_over_and_comes_back(tmp_path):
    port = free_port()
    proc = spawn_sim_backend(port, "--time-scale", "2")
    killed_url = f"http://127.0.0.1:{port}"
    with ServerThread(sim_app(SimBackendConfig(time_scale=2.0))) as alive, \
            start_router([killed_url, alive.url], router="round_robin") as r:
        svc = r.server.config.app.state.service
        n = 16

        async def go():
            task = asyncio.ensure_future(replay(r.url, [0.05 * i for i in range(n)], [8] * n, [40] * n,
                                                time_scale=2.0, stream=False))
            await asyncio.sleep(0.3)
            proc.kill()
            return await task

        try:
            res = asyncio.run(go())
        finally:
            proc.kill()
            proc.wait()
        # Non-streamed requests are retried on the other backend: none is lost.
        assert [x.error for x in res] == [None] * n
        text = httpx.get(r.url + "/metrics").text
        assert metric(text, "llm_lb_router_backend_down_total", backend=killed_url) >= 1
        assert metric(text, "llm_lb_router_failovers_total", backend=killed_url) >= 1
        assert metric(text, "llm_lb_router_requests_total", outcome="ok") == n
        wait_for(lambda: not svc.views[0].up, what="the killed backend marked down")
        proc = spawn_sim_backend(port, "--time-scale", "2")
        try:
            wait_for(lambda: svc.views[0].up, what="the restarted backend taken back")
            for _ in range(4):
                resp = httpx.post(r.url + "/v1/completions", json={"model": MODEL, "prompt": "x",
                                                                   "max_tokens": 1}, timeout=20)
                assert resp.status_code == 200
            assert metric(httpx.get(killed_url + "/metrics").text, "sim_backend_requests_total") >= 1
        finally:
            proc.kill()
            proc.wait()


def test_a_stream_broken_by_a_dead_backend_ends_with_a_counted_error():
    port = free_port()
    proc = spawn_sim_backend(port, "--time-scale", "1")
    url = f"http://127.0.0.1:{port}"
    try:
        with start_router([url]) as r:
            body = {"model": MODEL, "prompt": "a", "max_tokens": 400, "stream": True}
            lines = []
            with httpx.stream("POST", r.url + "/v1/completions", json=body, timeout=20) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        if len(lines) == 2:
                            proc.kill()
            assert "failed mid-stream" in lines[-1]
            text = httpx.get(r.url + "/metrics").text
            assert metric(text, "llm_lb_router_requests_total", outcome="upstream_error") == 1
    finally:
        proc.kill()
        proc.wait()


def test_replay_summary_counts_every_request(backends):
    with start_router([b.url for b in backends], router="jsq") as r:
        res = asyncio.run(replay(r.url, [0.0, 0.01, 0.02], [5, 50, 5], [3, 3, 3], time_scale=2.0))
    s = summarize(res)
    assert s["requests"] == 3 and s["errors"] == 0
    assert 0 < s["mean_ttft_s"] <= s["mean_e2e_s"]


def test_scrape_reads_vllm_and_llamacpp_names():
    vllm = ('vllm:num_requests_running{model_name="m"} 3\nvllm:num_requests_waiting{model_name="m"} 2\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="900"} 1.0\n')
    load = parse_metrics(vllm)
    got = (load.running, load.waiting, load.kv_usage, load.num_blocks, load.block_size)
    assert got == (3, 2, 0.25, 900, 16)
    lcpp = ("# HELP x\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 4\n"
            "llamacpp:kv_cache_usage_ratio 0.5\n")
    load = parse_metrics(lcpp)
    assert (load.running, load.waiting, load.kv_usage, load.num_blocks) == (1, 4, 0.5, None)


def test_parse_request_names_the_field():
    with pytest.raises(BadRequest, match="'stream'"):
        parse_request(b'{"model": "m", "prompt": "x", "stream": "yes"}', "completions", ("m",), 10)
    ok = parse_request(b'{"model": "m", "prompt": "a b c", "max_tokens": 7}', "completions", ("m",), 10)
    assert (ok.prompt_tokens, ok.max_tokens, ok.stream) == (3, 7, False)


@pytest.mark.parametrize("name", served_routers())
def test_every_served_router_decides_on_the_service_view(name):
    """The view gives every served router what it reads: three backends, a request a
    decision, each one routed to a valid backend or held (no AttributeError, no bad index)."""
    import numpy as np

    from llm_lb_gym.routers.drive import decide
    from llm_lb_gym.routers.registry import make_router
    from llm_lb_gym.serve.view import BackendView, ServiceCluster, ServiceTable
    from llm_lb_gym.sim.latency import get_preset

    lat = get_preset("llama2-7b-v100").latency
    tb = ServiceTable()
    views = [BackendView(i, f"http://127.0.0.1:{i + 1}", tb, block_size=16, num_blocks=1000, max_seqs=128,
                         latency=lat, stale_s=2.0) for i in range(3)]
    cluster = ServiceCluster(views)
    router = make_router(name)
    router.reset(np.random.default_rng(0), 3)
    routed = 0
    for k in range(6):
        cluster.queue.append(tb.add(100 * (k + 1), 50.0, cluster.t, 1.0))
        choice = decide(cluster, router)
        if choice is not None:
            rid = cluster.route(choice[1], choice[0])
            assert rid in views[choice[1]].inflight
            routed += 1
    assert routed + len(cluster.queue) == 6
    assert sum(v.num_requests for v in views) == routed
    if not router.defers:
        assert routed == 6


def test_service_config_names_bad_options():
    from llm_lb_gym._validate import ConfigError

    with pytest.raises(ConfigError, match="allowed: round_robin"):
        RouterServiceConfig(backends=("http://127.0.0.1:1",), router="nope")
    with pytest.raises(ConfigError, match="lookahead.*cannot run in the service.*allowed: round_robin"):
        RouterServiceConfig(backends=("http://127.0.0.1:1",), router="lookahead")
    with pytest.raises(ConfigError, match="not an http"):
        RouterServiceConfig(backends=("127.0.0.1:1",))
    with pytest.raises(Exception, match="late_binding.*option"):
        router_app(RouterServiceConfig(backends=("http://127.0.0.1:1",), router="late_binding",
                                       router_options={"nope": 1}))


def test_the_service_and_a_simulated_backend_take_a_conf_engine():
    """``--engine vllm_v1_a100`` (what ``engine=vllm_v1_a100`` gives an experiment): the
    service's views time their estimates with that engine (latency model, async scheduling, KV
    blocks, batch slots), its routers' ideal latencies count its API server's frontend, and the
    simulated backend runs it: a lone request's TTFT carries the frontend's ~44 ms. The four
    options it replaces are refused beside it, by name."""
    from llm_lb_gym._validate import ConfigError
    from llm_lb_gym.experiments.serve import build_app, engine_options, parser
    from llm_lb_gym.serve.service import RouterService
    from llm_lb_gym.sim.speed import ideal_s

    opts = dict(engine_options("vllm_v1_a100"), async_scheduling=True)
    eng = EngineConfig(**opts)
    svc = RouterService(RouterServiceConfig(backends=("http://127.0.0.1:1",), engine=opts))
    v = svc.views[0]
    assert (v.async_scheduling, v.total_blocks, v.max_seqs, v.bs) == (True, eng.total_blocks, eng.max_num_seqs, 16)
    assert svc.latency == eng.latency_model
    fe = eng.frontend_model
    assert fe is not None
    assert 1.0 / svc.inv_ideal(300, 20) == pytest.approx(float(ideal_s(eng.latency_model, fe, [300], [20.0])[0]))
    engine_alone = float(ideal_s(eng.latency_model, None, [300], [20.0])[0])
    assert 1.0 / svc.inv_ideal(300, 20) - engine_alone == pytest.approx(fe.delay_s + fe.input_s(300))
    with pytest.raises(ConfigError, match="engine is given.*max_seqs=64 would be ignored"):
        RouterServiceConfig(backends=("http://127.0.0.1:1",), engine=opts, max_seqs=64)
    with pytest.raises(ConfigError, match="engine: unknown field.*bogus.*allowed: preset"):
        RouterServiceConfig(backends=("http://127.0.0.1:1",), engine=dict(opts, bogus=1))
    with pytest.raises(SystemExit, match="--engine nope: no such file or conf/engine name; allowed: .*vllm_v1_h100"):
        build_app(parser().parse_args(["router", "--port", "0", "--backend", "http://127.0.0.1:1", "--engine", "nope"]))
    with pytest.raises(SystemExit, match="drop --max-seqs"):
        build_app(parser().parse_args(["router", "--port", "0", "--backend", "http://127.0.0.1:1",
                                       "--engine", "vllm_v1_a100", "--max-seqs", "8"]))
    backend = build_app(parser().parse_args(["sim", "--port", "0", "--engine", "vllm_v1_a100"]))
    with ServerThread(backend) as b:
        router = build_app(parser().parse_args(["router", "--port", "0", "--backend", b.url,
                                                "--engine", "vllm_v1_a100", "--router", "late_binding"]))
        with ServerThread(router) as r:
            res = asyncio.run(replay(r.url, [0.0, 0.5], [100, 100], [5, 5], model=MODEL))
    ahead = fe.delay_s + fe.input_s(100)
    for x in res:
        assert x.error is None and x.tokens == 5
        assert x.ttft_s >= ahead + eng.latency_model.prefill_s(100) - 1e-3, (x.ttft_s, ahead)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """An ``llm-lb-gym train``-shaped run directory with a (fresh, untrained) Double-DQN for two
    instances: what the service loads is the file format and the observation, not the skill."""
    torch = pytest.importorskip("torch")
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from llm_lb_gym.agents.factory import make_agent
    from llm_lb_gym.experiments._hydra import env_kwargs
    from llm_lb_gym.envs.cluster_env import LLMClusterEnv

    torch.set_num_threads(1)
    with initialize_config_module("llm_lb_gym.conf", version_base=None):
        cfg = compose("train", overrides=["experiment=debug", "env.num_instances=2"])
    d = tmp_path_factory.mktemp("policy")
    (d / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    kw = env_kwargs(cfg)
    kw.pop("max_episode_steps", None)
    env = LLMClusterEnv(**kw)
    make_agent(cfg.agent.name, env, seed=0).save(str(d / "best_model.zip"))
    return d


def test_a_trained_policy_routes_through_the_service(backends, policy_dir):
    from llm_lb_gym.experiments.serve import load_policy

    cfg = RouterServiceConfig(backends=tuple(b.url for b in backends), router="least_requests",
                              poll_interval_s=0.05)
    router = load_policy(str(policy_dir), "best_model.zip", cfg)
    assert router.m == 2 and router.active
    with ServerThread(router_app(cfg, router)) as r:
        res = asyncio.run(replay(r.url, [0.01 * i for i in range(6)], [30] * 6, [5] * 6, time_scale=2.0))
        assert all(x.error is None for x in res), [x.error for x in res]
        text = httpx.get(r.url + "/metrics").text
    assert metric(text, "llm_lb_router_requests_total", outcome="ok") == 6
    assert metric(text, "llm_lb_router_decision_seconds_count") >= 6


def test_the_q_network_fast_path_equals_the_agents_predict(policy_dir):
    import numpy as np

    from llm_lb_gym.experiments.serve import load_policy
    from llm_lb_gym.rollout import predict_action

    cfg = RouterServiceConfig(backends=("http://127.0.0.1:1", "http://127.0.0.1:2"))
    router = load_policy(str(policy_dir), "best_model.zip", cfg)
    assert router._q_net is not None
    rng = np.random.default_rng(0)
    shape = router.env.observation_space.shape
    for _ in range(200):
        obs = rng.uniform(-1, 2, shape).astype(np.float32)
        mask = rng.random(router.defer_action + 1) < 0.7
        mask[rng.integers(len(mask))] = True
        assert router.act(obs, mask) == predict_action(router.agent, obs, mask)


def test_a_missing_or_corrupt_policy_file_is_a_named_error(backends, policy_dir, tmp_path):
    import shutil

    from llm_lb_gym.experiments.serve import load_policy
    from llm_lb_gym._validate import ConfigError

    cfg = RouterServiceConfig(backends=tuple(b.url for b in backends))
    with pytest.raises(ConfigError, match="best_model.zip does not exist"):
        load_policy(str(tmp_path), "best_model.zip", cfg)
    (tmp_path / "best_model.zip").write_bytes(b"not a zip file")
    with pytest.raises(ConfigError, match="resolved_config.yaml does not exist"):
        load_policy(str(tmp_path), "best_model.zip", cfg)
    shutil.copy(policy_dir / "resolved_config.yaml", tmp_path / "resolved_config.yaml")
    with pytest.raises(ConfigError, match="could not be loaded as a double_dqn model"):
        load_policy(str(tmp_path), "best_model.zip", cfg)
    three = RouterServiceConfig(backends=tuple(b.url for b in backends) + ("http://127.0.0.1:9",))
    with pytest.raises(ConfigError, match="trained for 2 instances; 3 --backend given"):
        load_policy(str(policy_dir), "best_model.zip", three)


def test_simulated_backend_paces_tokens_by_the_engine():
    """A lone request takes the engine's isolated latency on the wall clock: never less (no
    token leaves before its iteration ends), and not much more (the pacing loop keeps up)."""
    from llm_lb_gym.sim.latency import get_preset

    lat = get_preset("llama2-7b-v100").latency
    with ServerThread(sim_app(SimBackendConfig(time_scale=1.0))) as b:
        res = asyncio.run(replay(b.url, [0.0, 1.0], [100, 100], [20, 20]))
    want = lat.isolated_request_s(100, 20)
    for x in res:
        assert x.error is None
        assert want - 1e-3 <= x.e2e_s <= want + 0.1, (x.e2e_s, want)
        assert lat.prefill_s(100) - 1e-3 <= x.ttft_s <= lat.prefill_s(100) + 0.1


def test_simulated_backend_keeps_answering_while_a_request_is_in_its_frontend():
    """An engine with a frontend (here 0.5 s of delay): while the only request waits in it, the
    backend's event loop stays free (another request is answered at once), and the request's
    first token comes after the delay. The pacing loop once spun through that wait."""
    eng = EngineConfig(frontend={"delay_s": 0.5})

    async def go(url):
        async with httpx.AsyncClient(base_url=url, timeout=10) as c:
            t0 = time.monotonic()
            first = asyncio.create_task(c.post("/v1/completions", json={"model": MODEL, "prompt": "w " * 10,
                                                                         "max_tokens": 2}))
            await asyncio.sleep(0.1)
            t1 = time.monotonic()
            other = await c.get("/v1/models")
            answered_s = time.monotonic() - t1
            resp = await first
            return answered_s, other.status_code, resp.status_code, time.monotonic() - t0

    with ServerThread(sim_app(SimBackendConfig(engine=eng))) as b:
        answered_s, other, status, total_s = asyncio.run(go(b.url))
    assert other == 200 and status == 200
    assert answered_s < 0.25, f"the backend answered {answered_s:.3f} s late: its loop was held"
    assert total_s >= 0.5


def test_loadgen_command_writes_its_table(backends, tmp_path):
    from llm_lb_gym.experiments import loadgen

    with start_router([b.url for b in backends], router="jsq") as r:
        loadgen.main(["--url", r.url, "--requests", "6", "--time-scale", "4", "-w", "rate_rps=20",
                      "--out", str(tmp_path)])
    text = (tmp_path / "summary.md").read_text()
    assert "| service |" in text and text.count("\n") >= 4
    import csv

    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 and all(row["error"] == "" and row["status"] == "200" for row in rows)
    with pytest.raises(SystemExit, match="not on this machine"):
        loadgen.main(["--url", "http://example.com:8000", "--requests", "1", "--out", str(tmp_path)])


def test_loadgen_sends_again_once_only_what_a_closed_connection_never_took():
    """A request answered with nothing on a connection the server closed (a stale kept-alive
    one, as llama-server leaves after a streamed reply) is sent once more; one that fails that
    way twice is recorded as an error, after exactly two tries."""
    body = json.dumps({"usage": {"completion_tokens": 1}}).encode()
    ok = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: " + str(len(body)).encode()
          + b"\r\n\r\n" + body)

    async def run(closes: int):
        seen = []

        async def handle(reader, writer):
            await reader.readuntil(b"\r\n\r\n")
            seen.append(1)
            if len(seen) > closes:
                writer.write(ok)
                await writer.drain()
            writer.close()   # closed without a word the first ``closes`` times

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            res = await replay(f"http://127.0.0.1:{port}", [0.0], [2], [1], model=MODEL, stream=False)
        return res[0], len(seen)

    res, tries = asyncio.run(run(1))
    assert res.error is None and res.status == 200 and tries == 2
    res, tries = asyncio.run(run(2))
    assert res.error is not None and "ServerDisconnected" in res.error and tries == 2


def test_loadgen_stacks_set_the_served_decisions_beside_the_simulated(tmp_path):
    """``--sim-backends``: a fresh stack per router (child processes), and per request the backend
    the served router chose beside the simulated router's choice; round robin and the random
    router (seeded alike) agree on every request."""
    import csv

    from llm_lb_gym.experiments import loadgen

    loadgen.main(["--sim-backends", "2", "--routers", "round_robin,random", "--requests", "10", "--time-scale", "8",
                  "-w", "rate_rps=4", "--seed", "5", "--out", str(tmp_path)])
    with open(tmp_path / "results.csv") as f:
        rows = list(csv.DictReader(f))
    for router in ("round_robin", "random"):
        mine = [r for r in rows if r["router"] == router]
        assert len(mine) == 10 and all(r["error"] == "" for r in mine)
        assert [r["served_instance"] for r in mine] == [r["sim_instance"] for r in mine], mine
    assert [r["sim_instance"] for r in rows if r["router"] == "random"] != ["0", "1"] * 5   # not round robin's
    assert (tmp_path / "summary.md").read_text().count(" | 100.0% |") == 2


def test_simulated_backend_takes_a_fresh_engine_when_its_table_is_full():
    with ServerThread(sim_app(SimBackendConfig(time_scale=50.0, table_capacity=16))) as b:
        with httpx.Client(base_url=b.url, timeout=20) as c:
            for _ in range(40):
                resp = c.post("/v1/completions", json={"model": MODEL, "prompt": "a b", "max_tokens": 2})
                assert resp.status_code == 200, resp.text
            text = c.get("/metrics").text
    assert metric(text, "sim_backend_requests_total") == 40
    assert metric(text, "vllm:num_requests_running") == 0


def test_llamacpp_ensure_reuses_a_build_stamped_with_its_version(tmp_path):
    """CI's path (``.ci/run``): a cached build whose stamp names the version is used as it is."""
    from llm_lb_gym.serve import llamacpp

    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    (tmp_path / llamacpp.STAMP).write_text("0.3.36\n")
    assert llamacpp.ensure("0.3.36", tmp_path) == str(binary)
