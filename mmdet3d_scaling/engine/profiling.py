"""Summaries of a ``torch.profiler`` run that explain scaling losses.

What makes a multi-GPU run slower per GPU than a single one is usually one of: the CPU
waiting for the GPU (host synchronisations: ``.item()``, boolean-mask indexing,
``nonzero``; each drains the launch queue of a host-bound model), time in collectives
(NCCL kernels on the GPU, gloo calls on the CPU), or plain GPU work. The summary counts
and times exactly these, per training iteration, plus the top operators.
"""
import re
import traceback
import warnings
from collections import Counter
from typing import Any, Dict, List, Optional

import torch

# CUDA runtime calls that block the calling CPU thread until the GPU is done.
HOST_SYNC_CALLS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize',
                   'cudaEventSynchronize', 'cudaMemcpy')
# Record-function prefixes of collectives on the CPU side (c10d, NCCL, gloo).
COMM_CPU_PREFIXES = ('nccl:', 'gloo:', 'c10d::')
TOP_K = 10
# Operators that make the CPU wait for the GPU on a CUDA tensor: ``.item()`` / ``bool()``
# / ``.tolist()`` (_local_scalar_dense), boolean-mask indexing and ``nonzero``, and ops
# whose output size depends on the data.
SYNCING_OPS = ('aten::_local_scalar_dense', 'aten::nonzero', 'aten::masked_select',
               'aten::_unique2', 'aten::unique_dim', 'aten::unique_consecutive')
# What is attributed to call sites: the syncing operators, the CUDA calls that block,
# and host <-> device copies (each a driver call, most a wait as well).
SITE_EVENTS = SYNCING_OPS + HOST_SYNC_CALLS + ('cudaMemcpyAsync',)
_PY_FRAME = re.compile(r'^.+\(\d+\): .+$')  # 'file(line): function'
# Frames inside these packages are the mechanism, not the caller worth naming.
_SKIP_FRAMES = ('/torch/', '<built-in')


def _ms(us: float, iters: int) -> float:
    return us / 1000.0 / max(iters, 1)


def _top(events: List[Any], attr: str, iters: int) -> List[Dict[str, Any]]:
    ranked = sorted(events, key=lambda e: getattr(e, attr), reverse=True)
    return [dict(name=e.key, calls_per_iter=e.count / max(iters, 1),
                 ms_per_iter=_ms(getattr(e, attr), iters))
            for e in ranked[:TOP_K] if getattr(e, attr) > 0]


def _site(event: Any) -> Optional[str]:
    """``file(line): function`` of the innermost Python frame above ``event`` outside
    torch (recorded when the profiler runs with ``with_stack=True``), or None."""
    parent = getattr(event, 'cpu_parent', None)
    while parent is not None:
        name = parent.name
        if _PY_FRAME.match(name) and not any(skip in name for skip in _SKIP_FRAMES):
            return name
        parent = parent.cpu_parent
    return None


def call_sites(prof: Any, iters: int, names: tuple = SITE_EVENTS) -> List[Dict[str, Any]]:
    """Where host waits and copies come from: per (Python call site, event name), calls
    per iteration, most frequent first (``TOP_K``). Needs ``with_stack=True``."""
    counts: Counter = Counter()
    for event in prof.events():
        if event.name in names:
            site = _site(event)
            if site is not None:
                counts[(site, event.name)] += 1
    return [dict(site=site, op=op, calls_per_iter=n / max(iters, 1))
            for (site, op), n in counts.most_common(TOP_K)]


def _innermost_outside_torch(frames: List[traceback.FrameSummary]) -> str:
    """``file(line): function`` of the innermost frame not inside torch or this module."""
    for frame in reversed(frames):
        where = f'{frame.filename}({frame.lineno}): {frame.name}'
        if not any(skip in frame.filename for skip in _SKIP_FRAMES + (__file__,)) \
                and 'warnings.py' not in frame.filename:
            return where
    return '<no Python caller>'


class SyncSiteRecorder:
    """Counts the CUDA operations that make the CPU wait for the GPU, by Python call site.

    Inside ``with SyncSiteRecorder() as rec:`` torch's sync debug mode is 'warn', so every
    ``.item()``, ``.cpu()``, ``nonzero``, boolean-mask index or stream synchronisation on
    a CUDA tensor raises torch's "called a synchronizing CUDA operation" warning; the
    recorder takes the innermost caller outside torch from the Python stack and counts
    it instead of printing. Other warnings pass through. Syncs that CUDA extensions make
    by themselves (mmcv ops calling ``cudaMemcpy``) are not seen; the profiler's
    ``host_syncs_per_iter`` counts those. A no-op without CUDA.

    Why not the profiler's stacks: in the PV-RCNN profile on an H200 (torch 2.11) its
    events had no Python parents, so :func:`call_sites` found nothing there.
    """

    MESSAGE = 'called a synchronizing CUDA operation'

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self._enabled = torch.cuda.is_available()
        self._catch: Optional[warnings.catch_warnings] = None
        self._previous_mode: Any = None
        self._show: Any = None

    def __enter__(self) -> 'SyncSiteRecorder':
        if not self._enabled:
            return self
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.filterwarnings('always', message=self.MESSAGE)  # not once per line
        self._show = warnings.showwarning
        warnings.showwarning = self._on_warning
        self._previous_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode('warn')
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._enabled:
            return
        torch.cuda.set_sync_debug_mode(self._previous_mode)
        self._catch.__exit__(*exc)

    def _on_warning(self, message: Any, category: Any, filename: str, lineno: int,
                    file: Any = None, line: Optional[str] = None) -> None:
        if self.MESSAGE not in str(message):
            self._show(message, category, filename, lineno, file, line)
            return
        self.counts[_innermost_outside_torch(traceback.extract_stack())] += 1

    def sites(self, iters: int) -> List[Dict[str, Any]]:
        """The ``TOP_K`` call sites, as :func:`call_sites` reports them."""
        return [dict(site=site, op='synchronizing CUDA operation',
                     calls_per_iter=n / max(iters, 1))
                for site, n in self.counts.most_common(TOP_K)]


def summarize_profile(prof: Any, iters: int, wall_s: float) -> Dict[str, Any]:
    """Per-iteration figures of a finished ``torch.profiler.profile`` over ``iters``
    training iterations that took ``wall_s`` seconds (wall clock, CPU side)."""
    events = list(prof.key_averages())
    syncs = {name: 0 for name in HOST_SYNC_CALLS}
    for e in events:
        if e.key in syncs:
            syncs[e.key] += e.count
    comm_kernels = [e for e in events if 'nccl' in e.key.lower()
                    and e.self_device_time_total > 0]
    comm_cpu = [e for e in events if e.key.startswith(COMM_CPU_PREFIXES)]
    return dict(
        iterations=iters,
        wall_ms_per_iter=wall_s * 1000.0 / max(iters, 1),
        host_syncs_per_iter=sum(syncs.values()) / max(iters, 1),
        host_syncs_by_call={k: v for k, v in syncs.items() if v},
        device_kernel_ms_per_iter=_ms(sum(e.self_device_time_total for e in events),
                                      iters),
        comm_kernel_ms_per_iter=_ms(sum(e.self_device_time_total for e in comm_kernels),
                                    iters),
        comm_cpu_ms_per_iter=_ms(sum(e.cpu_time_total for e in comm_cpu), iters),
        top_cpu=_top(events, 'self_cpu_time_total', iters),
        top_device=_top(events, 'self_device_time_total', iters),
        sync_sites=call_sites(prof, iters),
    )
