"""Python's garbage collections during a window of training: how many, how long.

Why: a collection stops every Python thread of the process (it holds the interpreter
lock) while it walks the tracked objects, and a training process tracks hundreds of
thousands of them (about 494,000 once BEVFusion's 1xb4 model is built; a full
collection of those took about 250 ms on a 2-core CPU). In call J1's trace the two
longest gaps of the GPU, 12.73 and 12.60 ms, had no operator running on any thread
(docs/benchmarks.md, "Where the step waits now"): a collection is one thing that looks
like that; the interpreter lock held by another thread is another. This recorder
tells them apart: it times every collection and, while a profiler records, marks each
as a range ``gc:gen<N>`` in the trace, beside the stage ranges. (For BEVFusion 1xb4 the
answer was no: in call L2 collections took 0.31 ms a micro-batch, none in a gap.)

Uses ``gc.callbacks`` (CPython): a callback runs in the thread whose allocation
started the collection, before and after it; each pause names that thread. torch's
profiler records the operators of the main and the autograd thread only (call J1's
trace), so a collection started on another thread (the loader's pin-memory thread, the
heatmap thread) is timed here but its range does not reach the trace.
"""
import gc
import threading
import time
from typing import Any, Dict, List, Optional

import torch

RANGE_PREFIX = 'gc:gen'


class GcPauses:
    """Records Python's garbage collections while open (a context manager).

    Args:
        mark_in_profile (bool): mark each collection as a profiler range
            ``gc:gen<N>`` (read by :mod:`.trace_busy`). Default False.
    """

    def __init__(self, mark_in_profile: bool = False) -> None:
        self.mark_in_profile = mark_in_profile
        self.pauses: List[Dict[str, Any]] = []  # generation, ms, collected, thread
        self._t = 0.0
        self._range: Optional[torch.profiler.record_function] = None

    def __enter__(self) -> 'GcPauses':
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)
        self._close_range()

    def _callback(self, phase: str, info: Dict[str, int]) -> None:
        if phase == 'start':
            if self.mark_in_profile:
                self._range = torch.profiler.record_function(
                    f"{RANGE_PREFIX}{info['generation']}")
                self._range.__enter__()
            self._t = time.perf_counter()
            return
        ms = (time.perf_counter() - self._t) * 1e3
        self._close_range()
        self.pauses.append(dict(generation=info['generation'], ms=ms,
                                collected=info.get('collected', 0),
                                thread=threading.current_thread().name))

    def _close_range(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None

    def figures(self, micro_batches: int) -> Dict[str, Any]:
        """Collections per generation, their total and longest time, and the time a
        micro-batch over ``micro_batches``."""
        total = sum(p['ms'] for p in self.pauses)
        return dict(
            collections={g: sum(p['generation'] == g for p in self.pauses)
                         for g in range(3)},
            total_ms=total, longest_ms=max((p['ms'] for p in self.pauses), default=0.0),
            ms_per_micro_batch=total / max(micro_batches, 1),
            longest=sorted(self.pauses, key=lambda p: -p['ms'])[:5])


def describe(fig: Dict[str, Any]) -> str:
    """One line of :meth:`GcPauses.figures`."""
    counts = ', '.join(f'gen{g} {n}' for g, n in fig['collections'].items())
    return (f"Python GC: {counts} collections, {fig['total_ms']:.1f} ms in all "
            f"({fig['ms_per_micro_batch']:.2f} ms a micro-batch), longest "
            f"{fig['longest_ms']:.2f} ms")


__all__ = ['GcPauses', 'RANGE_PREFIX', 'describe']
