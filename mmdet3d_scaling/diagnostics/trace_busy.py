"""GPU busy share and idle time by stage, read from a saved Chrome trace.

``tools/analysis/benchmark_train_step.py --trace FILE`` saves the profiled micro-batches'
trace; this module reads it back with the stage table's own arithmetic
(:mod:`.step_stages`): the GPU's activities (kernels, copies, memsets of every stream),
their union inside the labelled steps, the idle time of each stage, and the longest
gaps with the stage the host was in and how much of each a Python garbage collection
took (where :mod:`.gc_pauses` marked them). A figure quoted from a trace can so be checked
against the file, without a GPU.
"""
import gzip
import json
from typing import Any, Dict, List, Tuple

from .gc_pauses import RANGE_PREFIX as GC_PREFIX
from .step_stages import (GPU_ACTIVITIES, PREFIX, BusyTime, merge, step_pieces,
                          wall_and_busy)


def load_trace(path: str) -> List[Dict[str, Any]]:
    """The events of a Chrome trace (``.json`` or gzip-compressed ``.json.gz``)."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt') as f:
        data = json.load(f)
    return data['traceEvents'] if isinstance(data, dict) else data


NAME_CHARS = 120  # of a kernel's name, as the benchmark's top kernels keep it


def _is_range(event: Dict[str, Any], prefixes) -> bool:
    """Whether ``event`` is a profiler range whose name starts with ``prefixes``."""
    return (event.get('cat') == 'user_annotation' and event.get('ph') == 'X'
            and str(event.get('name', '')).startswith(prefixes))


def trimmed(events: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The events :func:`trace_busy` reads (the GPU's activities and the stage ranges),
    with the fields it reads (names cut at ``NAME_CHARS``): a trace a tenth of the size
    that gives the same figures."""
    keep = ('ph', 'cat', 'ts', 'dur', 'tid')
    return [dict({k: e[k] for k in keep if k in e}, name=str(e.get('name', ''))[:NAME_CHARS])
            for e in events
            if (e.get('ph') == 'X' and e.get('cat') in GPU_ACTIVITIES)
            or _is_range(e, (PREFIX, GC_PREFIX))]


def save_trace(events: List[Dict[str, Any]], path: str) -> None:
    """``events`` as a Chrome trace at ``path`` (gzip-compressed where it ends in .gz)."""
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'wt') as f:
        json.dump(dict(traceEvents=events), f)


def trace_busy(events: List[Dict[str, Any]], gaps: int = 10) -> Dict[str, Any]:
    """Busy share over the labelled steps, idle ms per step by stage, longest gaps.

    Raises:
        ValueError: the trace holds no ``stage:step`` range (not a trace of the train-
            step benchmark).
    """
    ranges = [(e['ts'], e['ts'] + e['dur'], e['name'][len(PREFIX):]) for e in events
              if _is_range(e, PREFIX)]
    n, pieces = step_pieces(ranges)
    if not n:
        raise ValueError('the trace has no "stage:step" range: save it with '
                         'tools/analysis/benchmark_train_step.py --trace FILE')
    start, stop = pieces[0][0], pieces[-1][1]
    activities = [(e['ts'], e['ts'] + e['dur']) for e in events
                  if e.get('cat') in GPU_ACTIVITIES and e.get('ph') == 'X']
    busy = BusyTime(activities)
    # Python's garbage collections, where the trace marks them (.gc_pauses)
    collections = merge([(e['ts'], e['ts'] + e['dur']) for e in events
                         if _is_range(e, GC_PREFIX)])
    idle = {name: wall - busy_us
            for name, (wall, busy_us) in wall_and_busy(pieces, busy).items()}
    spans = [(a, b) for a, b in merge(activities) if b > start and a < stop]
    holes = [(s1, s0) for (_, s1), (s0, _) in zip(spans, spans[1:])]
    holes.sort(key=lambda h: h[0] - h[1])
    busy_us, wall = busy.within(start, stop), stop - start
    return dict(
        steps=n, wall_ms_per_step=wall / 1e3 / n, busy_ms_per_step=busy_us / 1e3 / n,
        gpu_busy_share=busy_us / wall,
        idle_ms_per_step={k: v / 1e3 / n for k, v in
                          sorted(idle.items(), key=lambda kv: -kv[1])},
        longest_gaps=[dict(ms=(b - a) / 1e3, at_ms=(a - start) / 1e3,
                           stage=_stage_at(pieces, (a + b) / 2),
                           gc_ms=_overlap(collections, a, b) / 1e3)
                      for a, b in holes[:gaps]])


def _overlap(intervals: List[Tuple[float, float]], a: float, b: float) -> float:
    """How much of ``[a, b]`` the (disjoint) ``intervals`` cover."""
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals)


def _stage_at(pieces, t: float) -> str:
    for a, b, name in pieces:
        if a <= t <= b:
            return name
    return '?'
