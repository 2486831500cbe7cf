"""Read a backend's load from its Prometheus ``/metrics``: vLLM's names and llama.cpp's.

The router polls each backend (``router_app``) and keeps the three numbers production gateways
route on: requests running, requests waiting, KV-cache usage (0-1). vLLM exports
``vllm:num_requests_running``, ``vllm:num_requests_waiting`` and ``vllm:gpu_cache_usage_perc``
(renamed ``vllm:kv_cache_usage_perc`` in v1; both read); llama.cpp's ``llama-server
--metrics`` exports ``llamacpp:requests_processing``, ``llamacpp:requests_deferred`` and
``llamacpp:kv_cache_usage_ratio``. vLLM's ``vllm:cache_config_info`` labels also give the KV
cache size (``num_gpu_blocks``, ``block_size``), so the router's KV view needs no configuration
for vLLM backends. Several series of one name (one per model) are summed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred")
KV_USAGE = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "llamacpp:kv_cache_usage_ratio")
CACHE_INFO = "vllm:cache_config_info"

_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class BackendLoad:
    """One scrape. ``None``: the backend does not export that quantity."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    num_blocks: int | None = None
    block_size: int | None = None


def parse_metrics(text: str) -> BackendLoad:
    """The load quantities of a Prometheus text exposition (unknown lines are ignored)."""
    sums: dict[str, float] = {}
    num_blocks = block_size = None
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if m is None:
            continue
        name, labels, value = m.groups()
        if name == CACHE_INFO and labels:
            lab = dict(_LABEL.findall(labels))
            try:
                num_blocks = int(float(lab["num_gpu_blocks"]))
                block_size = int(float(lab["block_size"]))
            except (KeyError, ValueError):
                pass
            continue
        if name in RUNNING or name in WAITING or name in KV_USAGE:
            try:
                sums[name] = sums.get(name, 0.0) + float(value)
            except ValueError:
                continue

    def first(names):
        for n in names:
            if n in sums:
                return sums[n]
        return None

    return BackendLoad(first(RUNNING), first(WAITING), first(KV_USAGE), num_blocks, block_size)
