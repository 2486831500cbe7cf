"""What ``render()`` shows: the router queue and each instance, as text or as an image.

``snapshot`` reads the simulator's state without changing it; ``to_ansi`` and ``to_rgb_array``
draw the same snapshot. matplotlib is imported only when an image is asked for (Agg canvas, no
display, no pyplot state), so ``import llm_lb_gym`` and ``gym.make`` stay fast; without it (the
env-only install) ``rgb_array`` draws the same bars with numpy, without text, so every advertised
mode works there and Gymnasium's ``check_env`` passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RENDER_MODES = ("ansi", "rgb_array", "human")
"""``human`` prints the ``ansi`` table to stdout after every reset and step (Gymnasium's "current
display or terminal"; ``render()`` then returns None). Declaring it keeps ``gym.make`` from
wrapping the env in its pygame window (``HumanRendering``), which failed with pygame's import
error when pygame is absent; for a window, wrap a ``rgb_array`` env in ``HumanRendering``."""
RGB_SIZE_PX = (640, 360)
"""Width and height of an ``rgb_array`` frame."""


@dataclass(frozen=True)
class InstanceView:
    """One instance at the moment of the snapshot."""

    running: int
    """Requests decoding (the running batch)."""
    prefilling: int
    """Requests admitted whose prompt is still being computed (chunked prefill only)."""
    waiting: int
    """Requests queued at the instance, preempted ones included."""
    kv_used_blocks: int
    kv_total_blocks: int
    preemptions: int
    """Preemptions so far in the episode."""
    finished: int


@dataclass(frozen=True)
class ClusterView:
    """The router's view of the cluster at the current decision time."""

    time_s: float
    queue_len: int
    head_prompt_tokens: int | None
    """The router queue's head request (None with an empty queue)."""
    head_pred_decode_tokens: float | None
    arrived: int
    num_requests: int
    finished: int
    rejected: int
    instances: tuple[InstanceView, ...]


def snapshot(cluster) -> ClusterView:
    """The render state of a ``sim.cluster.Cluster``."""
    tb = cluster.table
    head = cluster.queue[0] if cluster.queue else None
    instances = tuple(
        InstanceView(running=len(e.running), prefilling=len(e.prefilling), waiting=e.num_waiting,
                     kv_used_blocks=e.total_blocks - e.free_blocks, kv_total_blocks=e.total_blocks,
                     preemptions=e.n_preemptions, finished=e.n_finished)
        for e in cluster.engines)
    return ClusterView(
        time_s=cluster.t, queue_len=len(cluster.queue),
        head_prompt_tokens=None if head is None else tb.prompt[head],
        head_pred_decode_tokens=None if head is None else tb.pred[head],
        arrived=cluster.n_arrived, num_requests=tb.n,
        finished=sum(i.finished for i in instances), rejected=cluster.n_rejected,
        instances=instances)


def _head_text(v: ClusterView) -> str:
    if v.head_prompt_tokens is None:
        return "empty"
    return f"head {v.head_prompt_tokens} prompt / ~{v.head_pred_decode_tokens:.0f} decode tokens"


def _title(v: ClusterView) -> str:
    return (f"t={v.time_s:.3f} s  arrived {v.arrived}/{v.num_requests}  finished {v.finished}  "
            f"rejected {v.rejected}")


def to_ansi(v: ClusterView, bar_width: int = 20) -> str:
    """A compact table: the router queue, then one line per instance."""
    lines = [_title(v), f"router queue {v.queue_len} ({_head_text(v)})",
             f"{'inst':>4} {'running':>7} {'prefill':>7} {'waiting':>7}  "
             f"{'KV used':<{bar_width + 2}} {'%':>4} {'preempt':>7} {'finished':>8}"]
    for i, e in enumerate(v.instances):
        frac = e.kv_used_blocks / e.kv_total_blocks
        filled = min(bar_width, round(frac * bar_width))
        bar = "[" + "#" * filled + "." * (bar_width - filled) + "]"
        lines.append(f"{i:>4} {e.running:>7} {e.prefilling:>7} {e.waiting:>7}  {bar} "
                     f"{100 * frac:>3.0f}% {e.preemptions:>7} {e.finished:>8}")
    return "\n".join(lines) + "\n"


_COLORS = {"running": (44, 160, 44), "prefilling": (255, 127, 14), "waiting": (214, 39, 40),
           "kv": (31, 119, 180), "axis": (120, 120, 120)}


def _rgb_plain(v: ClusterView) -> np.ndarray:
    """The view as bars drawn with numpy alone (no text): left, requests per instance stacked
    running / prefilling / waiting (scaled to the fullest instance); right, KV cache used (0-1).
    What ``rgb_array`` gives without matplotlib, so the mode works on the env-only install."""
    w, h = RGB_SIZE_PX
    img = np.full((h, w, 3), 255, np.uint8)
    m = max(1, len(v.instances))
    top, bottom = 20, h - 20
    for panel in (0, 1):
        x0, x1 = 20 + panel * (w // 2), (panel + 1) * (w // 2) - 20
        img[bottom, x0:x1] = _COLORS["axis"]
        slot = (x1 - x0) / m
        for i, e in enumerate(v.instances):
            a, b = int(x0 + i * slot + slot * 0.15), int(x0 + (i + 1) * slot - slot * 0.15)
            if panel == 0:
                most = max(1, max(x.running + x.prefilling + x.waiting for x in v.instances))
                y = bottom
                for name in ("running", "prefilling", "waiting"):
                    height = round(getattr(e, name) / most * (bottom - top))
                    img[y - height:y, a:b] = _COLORS[name]
                    y -= height
            else:
                height = round(e.kv_used_blocks / max(1, e.kv_total_blocks) * (bottom - top))
                img[bottom - height:bottom, a:b] = _COLORS["kv"]
    return img


def to_rgb_array(v: ClusterView) -> np.ndarray:
    """The same view drawn with matplotlib's Agg canvas (titles, legend, labels): uint8 array of
    shape (H, W, 3); without matplotlib (the env-only install) the same bars without text
    (``_rgb_plain``)."""
    from ..extras import missing

    if missing(("matplotlib",)):
        return _rgb_plain(v)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dpi = 80
    fig = Figure(figsize=(RGB_SIZE_PX[0] / dpi, RGB_SIZE_PX[1] / dpi), dpi=dpi)
    canvas = FigureCanvasAgg(fig)
    fig.suptitle(f"{_title(v)}\nrouter queue {v.queue_len} ({_head_text(v)})", fontsize=9)
    ax_q, ax_kv = fig.subplots(1, 2)
    x = np.arange(len(v.instances))
    bottom = np.zeros(len(x))
    for name, color in (("running", "tab:green"), ("prefilling", "tab:orange"),
                        ("waiting", "tab:red")):
        counts = np.array([getattr(e, name) for e in v.instances], dtype=float)
        ax_q.bar(x, counts, bottom=bottom, color=color, label=name)
        bottom += counts
    ax_q.set_title("requests per instance", fontsize=9, pad=18)
    ax_q.set_ylim(0.0, max(1.0, bottom.max()) * 1.05)
    ax_q.legend(fontsize=7, ncols=3, loc="lower center", bbox_to_anchor=(0.5, 1.0),
                frameon=False, handlelength=1.0)
    used = np.array([e.kv_used_blocks / e.kv_total_blocks for e in v.instances])
    ax_kv.bar(x, used, color="tab:blue")
    ax_kv.set_ylim(0.0, 1.0)
    ax_kv.set_title("KV cache used (label: preemptions)", fontsize=9, pad=18)
    for i, e in enumerate(v.instances):
        ax_kv.text(i, min(used[i], 0.9) + 0.02, str(e.preemptions), ha="center", fontsize=7)
    for ax in (ax_q, ax_kv):
        ax.set_xticks(x)
        ax.set_xlabel("instance", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.12, top=0.78, wspace=0.2)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()
