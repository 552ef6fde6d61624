"""Which Python lines launch the most GPU work: operators that run a kernel, by caller.

A host-bound model's main thread spends its time issuing work to the GPU: every
operator that computes (not a view) is at least one kernel launch on a CUDA tensor, and
every copy a driver call. On a shared machine this traffic is what a second process
slows down most (a synthetic neighbour doing only launches, small copies and read-backs
cost PV-RCNN 10 % on 2 x H200, docs/benchmarks.md). :class:`LaunchCensus` counts, on any
device (a CPU too), the operators that reach PyTorch's dispatcher with a kernel to run,
by the innermost Python caller outside torch: the list of lines whose operator count to
cut (fuse, batch over samples, vectorise a per-object loop), and a count to compare
before and after a change.

What it sees: aten operators, including the backward pass (attributed to the line that
called ``backward``). Not: work inside C++ / CUDA extensions (mmcv, spconv), which is
one launch or a few per call there. On a CPU it cannot tell work that would run on the
GPU from CPU-side work; frames known to be CPU-side on a GPU as well are left out
(``DEFAULT_EXCLUDE``, shared with :mod:`.host_reads`).
"""
import sys
from collections import Counter
from typing import Any, Dict, List, Sequence

from torch.utils._python_dispatch import TorchDispatchMode

from . import host_reads
from .host_reads import DEFAULT_EXCLUDE
from .profiling import NOT_A_SITE

# Operators that only make a new view or read metadata: no kernel on any device.
NO_KERNEL_OPS = frozenset({
    'view', '_unsafe_view', 'view_as', 'reshape', 'alias', 'as_strided', 'expand',
    'expand_as', 'permute', 't', 'transpose', 'unsqueeze', 'squeeze', 'slice', 'select',
    'narrow', 'split', 'split_with_sizes', 'unbind', 'chunk', 'detach', 'diagonal',
    'unfold', 'lift_fresh', 'empty', 'empty_strided', 'empty_like', 'resize_',
    'set_', 'size', 'stride', 'storage_offset', 'is_same_size', 'sym_size',
    'sym_stride', 'sym_numel', 'sym_storage_offset', 'dim', 'numel', 'is_nonzero',
    '_reshape_alias', 'view_as_real', 'view_as_complex', 'movedim', 'flatten',
    'unflatten'})
# Copies and dtype casts: on a GPU a copy kernel, or a memcpy between host and device
# (a CPU run cannot tell which: its tensors are all on the CPU).
COPY_OPS = frozenset({'_to_copy', 'copy_', '_copy_from', '_copy_from_and_resize',
                      'lift_fresh_copy'})
# the census machinery itself (HostReadCensus may run around this one), not callers
_SKIP_FILES = (__file__, host_reads.__file__, '/torch/', '<built-in', '/contextlib.py')


def _caller_site(exclude: Sequence[str]) -> str:
    """``file(line): function`` of the innermost frame outside torch and this module;
    '' when a frame on the stack is excluded."""
    frame = sys._getframe(2)
    site = ''
    while frame is not None:
        filename = frame.f_code.co_filename
        if any(x in filename for x in exclude):
            return ''
        if not site and not any(x in filename for x in _SKIP_FILES + NOT_A_SITE):
            site = f'{filename}({frame.f_lineno}): {frame.f_code.co_name}'
        frame = frame.f_back
    return site or '<no Python caller>'


class LaunchCensus(TorchDispatchMode):
    """``with LaunchCensus() as census:`` counts kernel-running operators by call site.

    Args:
        exclude: substrings of file paths; an operator with such a frame on its Python
            stack is not counted. Defaults to ``host_reads.DEFAULT_EXCLUDE`` (the
            optimizer's step counters, gradient clipping, the plugin's CPU twins of
            CUDA-only point ops, which are one kernel each on a GPU).
    """

    def __init__(self, exclude: Sequence[str] = DEFAULT_EXCLUDE):
        super().__init__()
        self.exclude = tuple(exclude)
        self.counts: Counter = Counter()  # (site, operator) -> calls

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_KERNEL_OPS:
            site = _caller_site(self.exclude)
            if site:
                self.counts[(site, name)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def copies(self) -> int:
        return sum(n for (_, op), n in self.counts.items() if op in COPY_OPS)

    def sites(self, top: int = 20, per: int = 1) -> List[Dict[str, Any]]:
        """The ``top`` call sites by operators launched (all operators of a site
        together), per ``per`` calls (e.g. per step), with the site's three most
        frequent operators."""
        by_site: Dict[str, Counter] = {}
        for (site, op), n in self.counts.items():
            by_site.setdefault(site, Counter())[op] += n
        ranked = sorted(by_site.items(), key=lambda kv: sum(kv[1].values()), reverse=True)
        per = max(per, 1)
        return [dict(site=site, count=sum(ops.values()) / per,
                     copies=sum(n for op, n in ops.items() if op in COPY_OPS) / per,
                     top_ops={op: n / per for op, n in ops.most_common(3)})
                for site, ops in ranked[:top]]

