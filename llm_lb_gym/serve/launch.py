"""Run an ASGI app on 127.0.0.1 in a background thread or a child process (tests, benches, CLI).

Servers here only ever bind the loopback interface unless the CLI is told otherwise: the load
generator and the tests send traffic to 127.0.0.1 only. ``ServerThread`` serves on an
ephemeral port (the OS picks; ``port`` says which) with its own event loop, so a test can run a
router and several backends in one process; ``spawn_sim_backend`` starts a backend as a separate
process, which is what a fault test kills (a thread cannot be killed mid-request).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time


class ServerThread:
    """uvicorn serving ``app`` on host:port (0: ephemeral) in a daemon thread."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, timeout_s: float = 20.0):
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                                access_log=False, timeout_graceful_shutdown=1,
                                proxy_headers=False, server_header=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {host}:{port} did not start within {timeout_s} s")
            time.sleep(0.01)
        self.host = host
        self.port = self.server.servers[0].sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def free_port(host: str = "127.0.0.1") -> int:
    """A port free at the time of the call (a child process is told to bind it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url``/health until it answers 200; raise naming the URL after ``timeout_s``."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server process for {url} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s} s")


def spawn_sim_backend(port: int, *args: str, timeout_s: float = 60.0) -> subprocess.Popen:
    """``python -m llm_lb_gym.experiments.serve sim --port PORT ARGS`` as a child process, once healthy."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "llm_lb_gym.experiments.serve", "sim", "--port", str(port), *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout_s, proc)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc
