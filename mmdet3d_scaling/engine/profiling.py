"""Summaries of a ``torch.profiler`` run that explain scaling losses.

What makes a multi-GPU run slower per GPU than a single one is usually one of: the CPU
waiting for the GPU (host synchronisations: ``.item()``, boolean-mask indexing,
``nonzero``; each drains the launch queue of a host-bound model), time in collectives
(NCCL kernels on the GPU, gloo calls on the CPU), or plain GPU work. The summary counts
and times exactly these, per training iteration, plus the top operators.
"""
from typing import Any, Dict, List

# CUDA runtime calls that block the calling CPU thread until the GPU is done.
HOST_SYNC_CALLS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize',
                   'cudaEventSynchronize', 'cudaMemcpy')
# Record-function prefixes of collectives on the CPU side (c10d, NCCL, gloo).
COMM_CPU_PREFIXES = ('nccl:', 'gloo:', 'c10d::')
TOP_K = 10


def _ms(us: float, iters: int) -> float:
    return us / 1000.0 / max(iters, 1)


def _top(events: List[Any], attr: str, iters: int) -> List[Dict[str, Any]]:
    ranked = sorted(events, key=lambda e: getattr(e, attr), reverse=True)
    return [dict(name=e.key, calls_per_iter=e.count / max(iters, 1),
                 ms_per_iter=_ms(getattr(e, attr), iters))
            for e in ranked[:TOP_K] if getattr(e, attr) > 0]


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
    )
