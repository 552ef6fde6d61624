"""Summaries of a ``torch.profiler`` run that explain scaling losses.

What makes a multi-GPU run slower per GPU than a single one is usually one of: the CPU
waiting for the GPU (host synchronisations: ``.item()``, boolean-mask indexing,
``nonzero``; each drains the launch queue of a host-bound model), time in collectives
(NCCL kernels on the GPU, gloo calls on the CPU), or plain GPU work. The summary counts
and times exactly these, per training iteration, plus the top operators.
"""
import re
from collections import Counter
from typing import Any, Dict, List, Optional

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
# CUDA runtime / driver API calls as the profiler names them (cudaLaunchKernel,
# cudaMemcpyAsync, cuLaunchKernel, ...): every call the host makes to the GPU.
DRIVER_CALL = re.compile(r'^cu(da)?[A-Z]\w*$')
# Frames inside these packages are the mechanism, not the caller worth naming.
NOT_A_SITE = ('/torch/', '<built-in')


def python_frames_recorded(prof: Any) -> bool:
    """Whether a ``with_stack=True`` profile holds Python frame events; the call-site
    tables need them. torch 2.11 + CUDA 13 (the H200 machine) records none: its sites
    all read ``(no Python frame)`` and only the totals hold."""
    return any(_PY_FRAME.match(e.name) for e in prof.events())


def profiler_records_python_frames() -> bool:
    """Probe this torch build: a tiny CPU profile with ``with_stack=True``."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        torch.ones(2).add_(1)
    return python_frames_recorded(prof)


def _on_device(event: Any) -> bool:
    """A GPU activity itself (kernel, copy, memset), not the CPU operator that issued
    it: torch credits a kernel's time to both, so summing every event's
    ``self_device_time_total`` counts most GPU time twice."""
    return not str(getattr(event, 'device_type', 'CPU')).endswith('CPU')


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
        if _PY_FRAME.match(name) and not any(skip in name for skip in NOT_A_SITE):
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


def _frames_by_time(frames: List[Any]) -> List[Any]:
    return sorted(frames, key=lambda e: (e.time_range.start, -e.time_range.end))


def _sites_by_time(frames: List[Any], calls: List[Any]) -> List[Optional[str]]:
    """Innermost Python frame (outside torch) whose time span holds each of ``calls``
    (sorted by start): the profiler links CUDA API events to no parent, so their site
    is found by time on the thread that ran the frames."""
    frames = _frames_by_time(frames)
    stack: List[Any] = []
    sites: List[Optional[str]] = []
    i = 0
    for call in calls:
        t = call.time_range.start
        while i < len(frames) and frames[i].time_range.start <= t:
            while stack and stack[-1].time_range.end < frames[i].time_range.start:
                stack.pop()
            stack.append(frames[i])
            i += 1
        while stack and stack[-1].time_range.end < t:
            stack.pop()
        sites.append(next((f.name for f in reversed(stack)
                           if not any(skip in f.name for skip in NOT_A_SITE)), None))
    return sites


def driver_call_sites(prof: Any, iters: int, top: int = TOP_K,
                      pattern: re.Pattern = DRIVER_CALL) -> Dict[str, Any]:
    """Every host-to-GPU call of a profile (events whose name matches ``pattern``: CUDA
    runtime and driver calls), per iteration: totals by call, and by Python call site
    (innermost frame outside torch on the thread with the most Python frames, i.e. the
    main thread; needs ``with_stack=True``) with the calls made there, most calls first
    (``top`` sites). Calls from other threads (autograd's backward threads) are filed
    under ``(other thread) `` + the main thread's frame at that time. Unlike a
    dispatcher census this sees the launches and copies made inside C++ / CUDA
    extensions (mmcv, spconv) too."""
    per = 1.0 / max(iters, 1)
    events = list(prof.events())
    frames = [e for e in events if _PY_FRAME.match(e.name)]
    main = Counter(e.thread for e in frames).most_common(1)
    main_thread = main[0][0] if main else None
    frames = [e for e in frames if e.thread == main_thread]
    calls = sorted((e for e in events if pattern.match(e.name)),
                   key=lambda e: e.time_range.start)
    totals: Counter = Counter()
    by_site: Dict[str, Counter] = {}
    for call, site in zip(calls, _sites_by_time(frames, calls)):
        site = site or '(no Python frame)'
        if call.thread != main_thread:
            site = '(other thread) ' + site
        totals[call.name] += 1
        by_site.setdefault(site, Counter())[call.name] += 1
    ranked = sorted(by_site.items(), key=lambda kv: sum(kv[1].values()), reverse=True)
    return dict(
        python_frames=bool(frames),
        calls_per_iter=sum(totals.values()) * per,
        by_call={k: v * per for k, v in totals.most_common()},
        sites=[dict(site=site, calls_per_iter=sum(c.values()) * per,
                    by_call={k: v * per for k, v in c.most_common()})
               for site, c in ranked[:top]])


def _work_kind(kernel_name: str) -> str:
    for prefix, kind in (('Memcpy DtoH', 'copy_to_host'), ('Memcpy HtoD', 'copy_to_gpu'),
                         ('Memcpy', 'copy_on_gpu'), ('Memset', 'memset')):
        if kernel_name.startswith(prefix):
            return kind
    return 'kernel'


def device_work_sites(prof: Any, iters: int, top: int = TOP_K) -> Dict[str, Any]:
    """GPU work per iteration by the Python call site of the operator that issued it
    (kernels, copies to / from the host, memsets; the profiler links each to the
    innermost CPU operator or ``record_function`` scope, whose parents are Python
    frames with ``with_stack=True``). Work issued by an extension outside any operator
    scope is not linked to a site; ``linked_share`` says how much was."""
    per = 1.0 / max(iters, 1)
    by_site: Dict[str, Counter] = {}
    linked: Counter = Counter()
    for event in prof.events():
        kernels = getattr(event, 'kernels', None)
        if not kernels:
            continue
        site = _site(event) or '(no Python frame)'
        for kernel in kernels:
            kind = _work_kind(kernel.name)
            by_site.setdefault(site, Counter())[kind] += 1
            linked[kind] += 1
    total = sum(1 for e in prof.events()
                if str(getattr(e, 'device_type', '')).endswith('CUDA'))
    ranked = sorted(by_site.items(), key=lambda kv: sum(kv[1].values()), reverse=True)
    return dict(
        python_frames=python_frames_recorded(prof),
        work_per_iter=total * per,
        linked_per_iter={k: v * per for k, v in linked.most_common()},
        linked_share=(sum(linked.values()) / total) if total else 0.0,
        sites=[dict(site=site, work_per_iter=sum(c.values()) * per,
                    by_kind={k: v * per for k, v in c.most_common()})
               for site, c in ranked[:top]])


def summarize_profile(prof: Any, iters: int, wall_s: float) -> Dict[str, Any]:
    """Per-iteration figures of a finished ``torch.profiler.profile`` over ``iters``
    training iterations that took ``wall_s`` seconds (wall clock, CPU side)."""
    events = list(prof.key_averages())
    syncs = {name: 0 for name in HOST_SYNC_CALLS}
    for e in events:
        if e.key in syncs:
            syncs[e.key] += e.count
    kernels = [e for e in events if _on_device(e)]
    comm_kernels = [e for e in kernels if 'nccl' in e.key.lower()]
    comm_cpu = [e for e in events if e.key.startswith(COMM_CPU_PREFIXES)]
    return dict(
        iterations=iters,
        wall_ms_per_iter=wall_s * 1000.0 / max(iters, 1),
        host_syncs_per_iter=sum(syncs.values()) / max(iters, 1),
        host_syncs_by_call={k: v for k, v in syncs.items() if v},
        device_kernel_ms_per_iter=_ms(sum(e.self_device_time_total for e in kernels),
                                      iters),
        comm_kernel_ms_per_iter=_ms(sum(e.self_device_time_total for e in comm_kernels),
                                    iters),
        comm_cpu_ms_per_iter=_ms(sum(e.cpu_time_total for e in comm_cpu), iters),
        top_cpu=_top(events, 'self_cpu_time_total', iters),
        top_device=_top(kernels, 'self_device_time_total', iters),
        sync_sites=call_sites(prof, iters),
    )
