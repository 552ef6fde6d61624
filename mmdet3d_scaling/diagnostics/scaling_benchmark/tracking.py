"""Progress of a scaling benchmark: one bar over its planned runs, one over the training
iterations of the run in flight (with an ETA each).

The plan (:func:`planned_runs`) counts the runs the options ask for; the run bar moves
when a run finishes. Each run's processes write ``progress.json`` (iterations done /
total, :mod:`mmdet3d_scaling.diagnostics.hooks.progress_file_hook`) in its work dir,
which the launcher reads while it waits (:meth:`RunTracker.poll`). Bars follow :mod:`mmdet3d_scaling.utils.progress`
(stderr, terminals only, ``--no-progress``).
"""
import argparse
import contextlib
import json
import os
from typing import Any, Iterator, List, Optional

from ...utils import progress

PROGRESS_FILE = 'progress.json'


def planned_runs(args: argparse.Namespace) -> int:
    """The runs a benchmark with these options makes (each launch counts once, N
    independent single-GPU runs at once too)."""
    timed = sum(2 if args.comm_run and n * args.nnodes > 1 else 1 for n in args.nproc)
    runs = timed * args.repeats
    if args.profile_steps:
        runs += len(args.nproc)
    if args.independent:
        runs += sum(1 for n in args.nproc if n > 1)
    if args.ddp_one:
        runs += 1
    if args.compare_stock and args.node_rank == 0:  # node 0 alone runs them
        # --compare-stock-at both: the stock config at equal settings and as shipped
        runs += 2 if getattr(args, 'compare_stock_at', 'shipped') == 'both' else 1
    return runs


def read_progress(path: str) -> Optional[Any]:
    """``(done, total)`` from a run's progress file, or None before it exists."""
    try:
        with open(path) as f:
            data = json.load(f)
        return int(data['done']), int(data['total'])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not written yet (the model is still being built)


class RunTracker:
    """The bars of one benchmark.

    Args:
        planned: the runs the benchmark makes (:func:`planned_runs`).
    """

    def __init__(self, planned: int) -> None:
        self.runs = progress.bar(total=planned, desc='benchmark runs', unit='run')
        self.iters: Optional[Any] = None
        self._paths: List[str] = []
        self._started = False

    def start_run(self, desc: str, progress_paths: List[str]) -> None:
        """A run starts; its processes will write ``progress_paths``."""
        self.close_run()
        self._paths, self._started = progress_paths, False
        self.iters = progress.bar(desc=desc, unit='iter', leave=False)

    def poll(self) -> None:
        """Move the iteration bar to what the run's progress files say."""
        if self.iters is None or self.iters.disable:
            return
        found = [read_progress(p) for p in self._paths]
        found = [f for f in found if f is not None]
        if not found:
            return
        done = sum(d for d, _ in found)
        total = sum(t for _, t in found) * len(self._paths) // len(found)
        if not self._started:  # ETA from the first iteration on, not the model build
            self.iters.reset(total=total)
            self._started = True
        self.iters.total = total
        self.iters.update(done - self.iters.n)

    def finish_run(self) -> None:
        """The run ended (well or not): the run bar moves on."""
        self.poll()
        self.close_run()
        self.runs.update(1)

    def close_run(self) -> None:
        if self.iters is not None:
            self.iters.close()
            self.iters = None

    def close(self) -> None:
        self.close_run()
        self.runs.close()


class _Idle(RunTracker):
    """What the launcher talks to outside :func:`track` (e.g. a test calling launch)."""

    def __init__(self) -> None:  # no bars at all
        self.iters = None
        self._paths = []

    def start_run(self, desc: str, progress_paths: List[str]) -> None:
        pass

    def poll(self) -> None:
        pass

    def finish_run(self) -> None:
        pass

    def close(self) -> None:
        pass


_active: RunTracker = _Idle()


def active() -> RunTracker:
    """The tracker of the benchmark in progress (one that shows nothing outside one)."""
    return _active


@contextlib.contextmanager
def track(planned: int) -> Iterator[RunTracker]:
    """``with track(planned_runs(args)):`` the launcher's runs move its bars."""
    global _active
    previous, _active = _active, RunTracker(planned)
    try:
        yield _active
    finally:
        _active.close()
        _active = previous


def progress_path(work_dir: str) -> str:
    return os.path.join(work_dir, PROGRESS_FILE)
