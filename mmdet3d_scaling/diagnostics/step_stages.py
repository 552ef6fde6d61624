"""Where a training step leaves the GPU idle: wall, GPU-busy and idle time per stage.

A GPU profile says which kernels take the GPU's time; when the GPU is idle much of the
step (host-bound: launches, host reads, Python), it does not say where. This module
labels the stages of an mmengine training step with ``torch.profiler.record_function``
ranges for the profiled iterations only:

- ``data_preprocessor`` (batching, host-to-device copies, voxelization),
- ``<child>.<method>`` for each direct child of the model (``img_backbone``,
  ``pts_middle_encoder``, ``bbox_head`` ...) and each of ``CHILD_METHODS`` it has
  (``forward``, ``loss``, ``loss_and_predict``, ``predict``, ``get_targets``,
  ``loss_by_feat``, ``predict_by_feat``),
- ``backward``, ``optimizer.step`` and ``zero_grad`` of the optim wrapper,

and splits the profiled wall time into the innermost open stage at each instant. Time
in the step but in no stage is ``(step, unlabelled)`` (the model's own glue between its
children, loss parsing, autocast); time between steps is ``(between steps)`` (waiting for
the loader, hooks).
For each stage it reports host wall time, the time at least one kernel ran, and the
difference, the GPU's idle time, per iteration; with the kernel launches, synchronising
CUDA calls and host reads (``.item()`` (of CPU tensors too), ``nonzero`` ...) that started
in it, and
its host ops with the most self time. Kernels launched earlier that are still
running count as busy: a stage whose idle time is near zero does not hold the GPU back.
"""
import bisect
import contextlib
import functools
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Tuple

import torch
from torch import nn
from torch.autograd import DeviceType

PREFIX = 'stage:'
STEP = 'step'  # the range around each profiled iteration
NAMES = {STEP: '(step, unlabelled)'}
OUTSIDE = '(between steps)'
# a head's loss_by_feat / predict_by_feat split its loss_and_predict into the loss (with
# its targets) and the proposals: the two halves of PV-RCNN's idlest stage
CHILD_METHODS = ('forward', 'loss', 'loss_and_predict', 'predict', 'get_targets',
                 'loss_by_feat', 'predict_by_feat')
Interval = Tuple[float, float]


class DeviceActivity(NamedTuple):
    """One GPU activity (kernel, copy, memset) of a profile, in ``prof.events()``'s time
    base (microseconds since the trace started)."""
    name: str
    start: float
    stop: float
    stream: int


GPU_ACTIVITIES = ('kernel', 'gpu_memcpy', 'gpu_memset')  # kineto's categories


def device_activities(prof: Any) -> List[DeviceActivity]:
    """Every kernel, copy and memset the profiler recorded, on every stream.

    Read from kineto's own event list by category, as the Chrome trace is written. A
    filter by name drops real kernels: the names of ATen's elementwise and reduction
    kernels hold C++ lambdas (``{lambda(float)#1}``), and the busy share computed
    without them read 61-66 % where the trace shows 79-87 % (BEVFusion, calls H1-H2).
    """
    result = prof.profiler.kineto_results
    origin = result.trace_start_ns()
    events = result.events()
    is_activity = _gpu_activity_test(events)
    return [DeviceActivity(e.name(), (e.start_ns() - origin) / 1e3,
                           (e.end_ns() - origin) / 1e3, e.device_resource_id())
            for e in events if is_activity(e)]


def _gpu_activity_test(events: List[Any]) -> Callable[[Any], bool]:
    """Whether a kineto event is a kernel, copy or memset: by category where the events
    have ``activity_type()``, else :func:`gpu_activity_by_device` (torch 2.11)."""
    if not events or hasattr(events[0], 'activity_type'):
        return lambda e: e.activity_type() in GPU_ACTIVITIES
    return gpu_activity_by_device(events)


def gpu_activity_by_device(events: List[Any]) -> Callable[[Any], bool]:
    """The test for torch 2.11, whose kineto events have no ``activity_type()`` (it
    crashed the benchmark in call I1): a CUDA-side event that is no GPU user annotation,
    told by ``is_user_annotation()`` and, should that mark only the CPU side, by the
    name of a CPU-side annotation (a ``record_function`` range is on both sides)."""
    annotations = frozenset(e.name() for e in events if e.device_type() == DeviceType.CPU
                            and e.is_user_annotation())
    return lambda e: (e.device_type() == DeviceType.CUDA and not e.is_user_annotation()
                      and e.name() not in annotations)


def merge(intervals: List[Interval]) -> List[Interval]:
    """Union of ``intervals`` as sorted, disjoint intervals."""
    out: List[Interval] = []
    for start, stop in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


class BusyTime:
    """GPU-busy time inside any window, from the merged kernel intervals."""

    def __init__(self, kernels: List[Interval]) -> None:
        self.spans = merge(kernels)
        self.starts = [s for s, _ in self.spans]
        self.cumulative = [0.0]
        for s, e in self.spans:
            self.cumulative.append(self.cumulative[-1] + e - s)

    def _before(self, t: float) -> float:
        """Busy time in (-inf, t]."""
        i = bisect.bisect_right(self.starts, t)
        if i == 0:
            return 0.0
        s, e = self.spans[i - 1]
        return self.cumulative[i - 1] + min(e, t) - s

    def within(self, start: float, stop: float) -> float:
        return max(0.0, self._before(stop) - self._before(start))


def innermost_segments(ranges: List[Tuple[float, float, str]],
                       start: float, stop: float) -> List[Tuple[float, float, str]]:
    """``[start, stop]`` cut into pieces, each named by its innermost open range.

    ``ranges`` (start, stop, name) nest or are disjoint (they come from one thread's
    call stack); a piece in no range is named ``OUTSIDE``.
    """
    points = sorted({start, stop, *[t for r in ranges for t in r[:2] if start < t < stop]})
    ordered = sorted(ranges, key=lambda r: (r[0], -r[1]))
    pieces = []
    for a, b in zip(points, points[1:]):
        mid = (a + b) / 2
        name = OUTSIDE
        for r_start, r_stop, r_name in ordered:  # the latest-started container wins
            if r_start > mid:
                break
            if r_stop >= mid:
                name = r_name
        pieces.append((a, b, name))
    return pieces


Piece = Tuple[float, float, str]


def step_pieces(ranges: List[Tuple[float, float, str]]) -> Tuple[int, List[Piece]]:
    """The number of labelled steps among ``ranges`` (start, stop, stage name without
    the prefix) and their window, from the first step's start to the last one's end,
    cut into pieces named by the innermost stage (``NAMES`` applied); (0, []) without
    steps."""
    steps = [r for r in ranges if r[2] == STEP]
    if not steps:
        return 0, []
    start, stop = min(r[0] for r in steps), max(r[1] for r in steps)
    return len(steps), [(a, b, NAMES.get(name, name))
                        for a, b, name in innermost_segments(ranges, start, stop)]


def wall_and_busy(pieces: List[Piece], busy: BusyTime) -> Dict[str, List[float]]:
    """``[wall, GPU-busy]`` time of each stage over ``pieces``."""
    times: Dict[str, List[float]] = {}
    for a, b, name in pieces:
        row = times.setdefault(name, [0.0, 0.0])
        row[0] += b - a
        row[1] += busy.within(a, b)
    return times


def stage_table(prof: Any, top_ops: int = 5) -> List[Dict]:
    """Per stage: wall, GPU-busy and idle milliseconds per step, by idle time.

    The window runs from the first labelled step's start to the last one's end.
    """
    events = prof.events()
    kernels = [(a.start, a.stop) for a in device_activities(prof)]
    ranges = [(e.time_range.start, e.time_range.end, e.name[len(PREFIX):])
              for e in events
              if e.name.startswith(PREFIX) and not str(e.device_type).endswith('CUDA')]
    iters, pieces = step_pieces(ranges)
    if not iters:
        return []
    rows = {name: dict(wall=wall, busy=busy, launches=0, syncs=0, host_reads=0, ops={})
            for name, (wall, busy) in wall_and_busy(pieces, BusyTime(kernels)).items()}
    _count_host_calls(events, pieces, rows)
    table = []
    for name, row in rows.items():
        heaviest = sorted(row['ops'].items(), key=lambda kv: -kv[1])[:top_ops]
        table.append(dict(
            stage=name, wall_ms_per_iter=row['wall'] / 1e3 / iters,
            busy_ms_per_iter=row['busy'] / 1e3 / iters,
            idle_ms_per_iter=(row['wall'] - row['busy']) / 1e3 / iters,
            launches_per_iter=row['launches'] / iters, syncs_per_iter=row['syncs'] / iters,
            host_reads_per_iter=row['host_reads'] / iters,
            top_host_ops=[dict(name=op[:80], self_ms_per_iter=us / 1e3 / iters)
                          for op, us in heaviest]))
    return sorted(table, key=lambda r: -r['idle_ms_per_iter'])


LAUNCHES = ('cudaLaunchKernel', 'cuLaunchKernel', 'cudaLaunchKernelExC', 'cuLaunchKernelEx')
SYNCS = ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize',
         'cudaMemcpy')
HOST_READS = ('aten::_local_scalar_dense', 'aten::nonzero', 'aten::unique_consecutive',
              'aten::_unique2', 'aten::masked_select', 'aten::repeat_interleave')


def _count_host_calls(events: List[Any], pieces: List[Tuple[float, float, str]],
                      rows: Dict[str, Dict[str, Any]]) -> None:
    """Kernel launches, synchronising calls, device-to-host reads and the host ops
    with the most self time, each counted in the stage where it started."""
    starts = [a for a, _, _ in pieces]
    for e in events:
        if str(getattr(e, 'device_type', '')).endswith('CUDA') or e.name.startswith(PREFIX):
            continue
        t = e.time_range.start
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t > pieces[i][1]:
            continue
        row = rows[pieces[i][2]]
        if e.name in LAUNCHES:
            row['launches'] += 1
        elif e.name in SYNCS:
            row['syncs'] += 1
        if e.name in HOST_READS:
            row['host_reads'] += 1
        if e.name.startswith('aten::') or e.name in SYNCS:
            row['ops'][e.name] = row['ops'].get(e.name, 0.0) + e.self_cpu_time_total


class OpenStages:
    """The stages open now, innermost last: which stage a host wait happened in.

    ``labelled_stages`` yields one; a sync recorder asks :meth:`current` at each wait.
    """

    def __init__(self) -> None:
        self.open: List[str] = []

    def current(self) -> str:
        """The innermost open stage's name; ``OUTSIDE`` when none is open."""
        return NAMES.get(self.open[-1], self.open[-1]) if self.open else OUTSIDE


def _labelled(fn, label: str, stages: OpenStages):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        stages.open.append(label)
        try:
            with torch.profiler.record_function(PREFIX + label):
                return fn(*args, **kwargs)
        finally:
            stages.open.pop()
    return run


def _wrap(obj: Any, method: str, label: str, undo: List, stages: OpenStages) -> None:
    """Shadow ``obj.method`` with a labelled one on the instance (undone later)."""
    fn = getattr(obj, method, None)
    if fn is None or not callable(fn):
        return
    had_own = method in vars(obj)
    setattr(obj, method, _labelled(fn, label, stages))
    undo.append((obj, method, fn if had_own else None))


class StepRange:
    """The ``step`` range of one iteration, opened and closed from two hook calls."""

    def __init__(self) -> None:
        self._range = None

    def open(self) -> None:
        self._range = torch.profiler.record_function(PREFIX + STEP)
        self._range.__enter__()

    def close(self) -> None:
        if self._range is not None:
            self._range.__exit__(None, None, None)
            self._range = None


@contextlib.contextmanager
def labelled_stages(model: nn.Module, optim_wrapper: Any) -> Iterator[OpenStages]:
    """Label the stages of the step (see the module docstring) while inside; yields
    the :class:`OpenStages` the labels keep."""
    undo: List = []
    stages = OpenStages()
    try:
        for name, child in model.named_children():
            if name == 'data_preprocessor':
                _wrap(child, 'forward', name, undo, stages)
                continue
            for method in CHILD_METHODS:
                _wrap(child, method, f'{name}.{method}', undo, stages)
        for method, label in (('backward', 'backward'), ('step', 'optimizer.step'),
                              ('zero_grad', 'zero_grad')):
            _wrap(optim_wrapper, method, label, undo, stages)
        yield stages
    finally:
        for obj, method, own in reversed(undo):
            if own is None:
                delattr(obj, method)
            else:
                setattr(obj, method, own)
