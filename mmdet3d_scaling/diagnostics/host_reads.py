"""Which Python lines read GPU values back to the CPU.

A host read (``.item()``, ``if tensor:``, ``nonzero``, boolean-mask indexing, ``.cpu()``)
on a CUDA tensor makes the CPU wait until the GPU has caught up. Two counters, both by
Python call site: :class:`HostReadCensus` counts the calls that *would* be such reads,
through a ``TorchFunctionMode``, so it also runs on a CPU-only machine (the list of
places to fix in a host-bound model, and a count to compare before and after a change);
:class:`SyncSiteRecorder` counts the synchronisations a CUDA run really makes.

What it sees: torch calls made from Python. Not: reads inside C++ / CUDA extensions
(mmcv, spconv kernels), which only a GPU profile shows (``host_syncs_per_iter`` of
``tools/benchmark_scaling.py --profile-steps``). On a CPU it cannot tell a tensor that
would live on the GPU from one that lives on the CPU anyway, so frames known to handle
CPU-side tensors on a GPU too (the optimizer's step counters, gradient clipping) and the
plugin's CPU twins of CUDA-only ops are left out (``DEFAULT_EXCLUDE``).
"""
import traceback
import warnings
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
from torch.overrides import TorchFunctionMode

from .profiling import NOT_A_SITE, TOP_K

# Tensor methods / torch functions that read a value (or a data-dependent size) back.
READ_OPS = frozenset({
    'item', 'tolist', 'cpu', 'numpy', 'nonzero', 'argwhere', 'masked_select', 'unique',
    'unique_consecutive', '__bool__', '__int__', '__float__', '__index__'})
DEFAULT_EXCLUDE = ('/torch/optim/', '/torch/nn/utils/clip_grad',
                   'mmdet3d_scaling/patches/cpu/point_ops_cpu.py')


def caller_site(frames: List[traceback.FrameSummary]) -> str:
    """``file(line): function`` of the innermost frame outside torch, this module and
    the warnings machinery."""
    for f in reversed(frames):
        if f.filename == __file__ or f.filename.endswith('/warnings.py') \
                or any(x in f.filename for x in NOT_A_SITE):
            continue
        return f'{f.filename}({f.lineno}): {f.name}'
    return '<no Python caller>'


def _read_name(func: Any, args: tuple, kwargs: dict) -> str:
    """The host read ``func(*args)`` would be on a CUDA tensor, or '' if none."""
    name = getattr(func, '__name__', '')
    if name in READ_OPS:
        return name
    if name == 'where' and len(args) == 1 and not kwargs:
        return 'where(cond)'
    if name == '__getitem__' and len(args) > 1:
        index = args[1] if isinstance(args[1], tuple) else (args[1], )
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index):
            return '[bool mask]'
    return ''


class HostReadCensus(TorchFunctionMode):
    """``with HostReadCensus() as census:`` counts would-be host reads by call site.

    Args:
        exclude: substrings of file paths; a read with such a frame on its stack is not
            counted. Defaults to ``DEFAULT_EXCLUDE``.
    """

    def __init__(self, exclude: Sequence[str] = DEFAULT_EXCLUDE):
        super().__init__()
        self.exclude = tuple(exclude)
        self.counts: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = _read_name(func, args, kwargs)
        if name:
            self._record(name)
        return func(*args, **kwargs)

    def _record(self, name: str) -> None:
        frames = traceback.extract_stack()
        if any(x in f.filename for f in frames for x in self.exclude):
            return
        self.counts[(caller_site(frames), name)] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def sites(self, top: int = 20, per: int = 1) -> List[Dict[str, Any]]:
        """The ``top`` call sites, reads per ``per`` calls (e.g. per iteration)."""
        return [dict(site=site, op=op, count=n / max(per, 1))
                for (site, op), n in self.counts.most_common(top)]


class SyncSiteRecorder:
    """Counts the CUDA operations that make the CPU wait for the GPU, by Python call site.

    Inside ``with SyncSiteRecorder() as rec:`` torch's sync debug mode is 'warn', so every
    ``.item()``, ``.cpu()``, ``nonzero``, boolean-mask index, blocking copy from pageable
    host memory or stream synchronisation on a CUDA tensor raises torch's "called a
    synchronizing CUDA operation" warning; the recorder takes the innermost caller
    outside torch from the Python stack and counts it instead of printing. Other
    warnings pass through. Syncs that CUDA extensions make by themselves (mmcv ops
    calling ``cudaMemcpy``) are not seen; the profiler's ``host_syncs_per_iter`` counts
    those. A no-op without CUDA.

    Args:
        stage: called at each wait, the name of the part of the step it happened in
            (e.g. ``OpenStages.current`` of ``step_stages.labelled_stages``); the
            counts are then by stage and call site. Default None: by call site.

    Why not the profiler's stacks: in the PV-RCNN profile on an H200 (torch 2.11) its
    events had no Python parents, so ``profiling.call_sites`` found nothing there.
    """

    MESSAGE = 'called a synchronizing CUDA operation'

    def __init__(self, stage: Optional[Callable[[], str]] = None) -> None:
        self.counts: Counter = Counter()  # (stage or '', site) -> waits
        self.stage = stage
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
        self.record(caller_site(traceback.extract_stack()))

    def record(self, site: str) -> None:
        """Count one wait at ``site`` (in the current stage, if there is a ``stage``)."""
        self.counts[(self.stage() if self.stage else '', site)] += 1

    def sites(self, iters: int, top: int = TOP_K) -> List[Dict[str, Any]]:
        """The ``top`` call sites, in the form of ``profiling.call_sites`` (with their
        ``stage`` when the recorder has one)."""
        rows = []
        for (stage, site), n in self.counts.most_common(top):
            row = dict(site=site, op='synchronizing CUDA operation',
                       calls_per_iter=n / max(iters, 1))
            if self.stage:
                row = dict(stage=stage, **row)
            rows.append(row)
        return rows
