"""Training forward + backward of a chain of modules as CUDA graphs, one per input shape.

Why: a module of many small kernels (BEVFusion's Swin-T image backbone: ~800 launches
for 24 images) keeps the H200 waiting on Python and the launch queue; a graph replays
its forward and its backward with one launch each. This runs torch's
``make_graphed_callables`` on a chain of modules the first time a training call sees an
input signature (shape, dtype, autocast state), and replays it afterwards.

What it keeps as it was:

- **parameters and state dict**: the chain holds references to the owner's modules;
  nothing is registered on the owner, so checkpoints are unchanged;
- **BatchNorm statistics**: capture runs the chain three times eagerly (autotune,
  lazy initialisation) and records it once; the buffers are restored afterwards, so
  the statistics see each real batch once, as without graphs;
- **the caller's input**: a graph's static input is a copy of its own, which every
  replay overwrites; the tensor that triggered the capture is not that input;
- **gradient accumulation**: a graph writes its parameter gradients into static
  memory; autograd would keep that memory as ``param.grad`` when ``grad`` is None and
  the next replay would overwrite it, so the chain's missing gradients are allocated
  (zero, one flat buffer) before each replay and autograd adds into them.

Not bit for bit: random numbers drawn inside a graph (drop-path) come from the graph's
own offsets of the generator, so a run with graphs draws other masks than one without
(the parity tool's seed spread is the measure). Evaluation, ``no_grad`` calls, CPU
tensors and a process group of several ranks run the modules eagerly.

Captures run in CUDA's ``thread_local`` capture mode. torch's ``make_graphed_callables``
captures in ``global`` mode, where a CUDA call of any other thread invalidates the
capture. The training DataLoader's pin-memory thread makes such calls (``cudaHostAlloc``
while it pins the next batches, most of all in the first iterations, when captures
happen). On the H200 one first-step capture (of the five runs of 2026-12-04) failed
with the error such a race gives (docs/data/same_call_2026-12-04/bevfusion_b4_spconv_profile.log:
"operation failed due to a previous error during capture", cuBLASLt's call being the
first to meet the invalidated capture); the race is the reported cause of that error
(e.g. LibreYOLO/libreyolo#681). ``thread_local`` restricts only the capturing thread,
as torch's documentation of ``capture_error_mode`` describes; the capture is the same.
torch 2.11 - 2.13's ``make_graphed_callables`` has no argument for it, so
:func:`capture` gives it a ``torch.cuda.graph`` that defaults to ``thread_local`` for
the length of the call (:func:`thread_local_capture`).

A capture that still fails stops the run with an error that names the chain, the input
and the way out (``model.cuda_graphs=[]``). It is not retried nor run eagerly: a failed
capture leaves the CUDA generator in capture mode, and the next random draw on the GPU
fails (measured on the H200).

A batch-size search captures graphs for shapes its trials try; :func:`release_graphs`
drops them (and their memory pools) when it is done, so training captures only its own.
"""
import collections
import contextlib
import inspect
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log
from torch import Tensor, nn


class ModuleChain(nn.Module):
    """``modules[-1](...modules[0](x))`` with a tuple of tensors out.

    Args:
        modules (Sequence[nn.Module]): the modules, called in order.
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(modules)

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        for module in self.parts:
            x = module(x)
        return tuple(x) if isinstance(x, (list, tuple)) else (x, )


def signature(x: Tensor) -> tuple:
    """What a captured graph is valid for."""
    return (tuple(x.shape), x.stride(), x.dtype, x.device,
            torch.is_autocast_enabled('cuda'), torch.get_autocast_dtype('cuda'))


class MissingGrads:
    """Gives trainable parameters without a gradient a zero one, as views of one buffer.

    A graphed backward must accumulate into gradients of their own (without one,
    autograd would keep the graph's output buffer, which the next replay overwrites).
    The optimizer sets them to None after each step, so the buffer comes back every
    step: it is kept, zeroed with one kernel and its views handed out again, instead of
    a new buffer and a slice and a view per parameter (about 720 operators for the
    image encoder, 7 ms of host time under the profiler in call I1). Parameters of
    another dtype than the first get a zero tensor each.
    """

    def __init__(self) -> None:
        self._key: Optional[tuple] = None  # the parameters the views are for
        self._flat: Optional[Tensor] = None
        self._views: List[Tensor] = []

    def __call__(self, params: Sequence[nn.Parameter]) -> None:
        missing = [p for p in params if p.requires_grad and p.grad is None]
        if not missing:
            return
        key = tuple((id(p), p.shape, p.dtype, p.device) for p in missing)
        if key == self._key:
            self._flat.zero_()
        else:
            self._key, self._flat, self._views = key, *_grad_views(missing)
        for p, view in zip(missing, self._views):
            p.grad = view if view is not None else torch.zeros_like(p)


def _grad_views(params: List[nn.Parameter]) -> Tuple[Tensor, List[Optional[Tensor]]]:
    """A zero buffer for ``params`` of the first one's dtype and a view of it for each
    (None for a parameter of another dtype)."""
    dtype = params[0].dtype
    same = [p for p in params if p.dtype == dtype]
    flat = torch.zeros(sum(p.numel() for p in same), dtype=dtype, device=params[0].device)
    parts = iter(flat.split([p.numel() for p in same]))
    return flat, [next(parts).view(p.shape) if p.dtype == dtype else None for p in params]


CAPTURE_MODE = 'thread_local'


def _takes_capture_mode() -> bool:
    """Whether this torch's ``make_graphed_callables`` has ``capture_error_mode``."""
    return 'capture_error_mode' in inspect.signature(
        torch.cuda.make_graphed_callables).parameters


@contextlib.contextmanager
def thread_local_capture() -> Iterator[None]:
    """``torch.cuda.graph`` capturing in ``thread_local`` mode unless told otherwise,
    for the block (what ``make_graphed_callables`` looks up at its call); restored
    after. A no-op where ``make_graphed_callables`` takes ``capture_error_mode``."""
    if _takes_capture_mode():
        yield
        return
    original = torch.cuda.graph

    class graph(original):  # noqa: N801 (torch's name)
        def __init__(self, *args, **kwargs):
            if len(args) < 4:  # (cuda_graph, pool, stream, capture_error_mode, ...)
                kwargs.setdefault('capture_error_mode', CAPTURE_MODE)
            super().__init__(*args, **kwargs)

    torch.cuda.graph = graph
    try:
        yield
    finally:
        torch.cuda.graph = original


def _make_graphed(chain: ModuleChain, x: Tensor):
    kwargs = dict(num_warmup_iters=3, allow_unused_input=True)
    if _takes_capture_mode():
        kwargs['capture_error_mode'] = CAPTURE_MODE
    # The graph's static input is the sample itself, and every replay copies its input
    # into it: captured from the caller's tensor, that tensor would be overwritten by
    # the next replay's input (the first micro-batch's images, say). So the sample is a
    # copy of the graph's own. An input with autograd history (BEVFusion's fused BEV
    # map) is captured from a detached copy: the capture's backward would otherwise
    # hand its gradient to that history's nodes, recorded on the current stream, and
    # make that stream wait on the capturing one (cudaErrorStreamCaptureImplicit, seen
    # on the H100). Replays take the real input and pass its gradient on as any
    # autograd function does.
    sample = x.detach().clone().requires_grad_(x.requires_grad)
    with thread_local_capture():
        return torch.cuda.make_graphed_callables(chain, (sample, ), **kwargs)


def capture(chain: ModuleChain, x: Tensor):
    """``make_graphed_callables`` of ``chain`` for ``x`` in ``thread_local`` capture
    mode, buffers restored after."""
    saved = [b.detach().clone() for b in chain.buffers()]
    enabled = torch.is_autocast_enabled('cuda')
    dtype = torch.get_autocast_dtype('cuda')
    try:
        # torch records autocast's casts into the graph and needs its weight cache off
        with torch.autocast('cuda', dtype=dtype, enabled=enabled, cache_enabled=False):
            return _make_graphed(chain, x)
    finally:  # also after a failed capture: its warm-up ran the chain eagerly
        with torch.no_grad():
            for buffer, value in zip(chain.buffers(), saved):
                buffer.copy_(value)


def several_ranks() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class CudaGraphCache:
    """Captured chains of one model, by name and input signature.

    Not an ``nn.Module`` on purpose: the graphs are no state of the model. A deep copy
    (an EMA model, say) starts empty and captures its own modules.

    Args:
        max_graphs (int): signatures kept per name; a further one runs eagerly (and
            says so once). Defaults to 2 (the training shape and a smaller last batch).
    """

    def __init__(self, max_graphs: int = 2) -> None:
        self.max_graphs = max_graphs
        self.graphs: Dict[tuple, nn.Module] = {}
        self._said: set = set()
        self._missing_grads: Dict[str, MissingGrads] = collections.defaultdict(MissingGrads)

    def __deepcopy__(self, memo) -> 'CudaGraphCache':
        return CudaGraphCache(self.max_graphs)

    def applies(self, x: Tensor, training: bool) -> bool:
        """Whether a call on ``x`` would use a graph."""
        return (training and torch.is_grad_enabled() and x.is_cuda
                and not several_ranks())

    def run(self, name: str, modules: Sequence[nn.Module], x: Tensor) -> Tuple[Tensor, ...]:
        """The chain's outputs for ``x``, from its graph (captured on first sight)."""
        key = (name, signature(x))
        chain = self.graphs.get(key)
        if chain is None:
            if sum(k[0] == name for k in self.graphs) >= self.max_graphs:
                self._say(name, f'CUDA graphs: {name} input {tuple(x.shape)} is a new '
                          f'shape beyond max_graphs={self.max_graphs}; it runs eagerly.')
                return ModuleChain(modules)(x)
            chain = self._capture(key, modules, x)
        self._missing_grads[name](chain.parameters())
        return chain(x)

    def clear(self) -> None:
        """Drop every captured graph (their memory pools go with them) and the kept
        gradient buffers."""
        self.graphs.clear()
        self._missing_grads.clear()

    def _capture(self, key: tuple, modules: Sequence[nn.Module], x: Tensor) -> nn.Module:
        before = torch.cuda.memory_reserved(x.device)
        try:
            chain = capture(ModuleChain(modules), x)
        except RuntimeError as err:  # torch.AcceleratorError is one
            raise RuntimeError(
                f'CUDA graphs: capturing {key[0]} (forward + backward) for input '
                f'{tuple(x.shape)} failed: {type(err).__name__}: '
                f'{str(err).splitlines()[0]}. Train it eagerly with --cfg-options '
                'model.cuda_graphs=[] (the capture cannot be undone in this process, '
                'so it is not retried).') from err
        grown = (torch.cuda.memory_reserved(x.device) - before) / 2**30
        print_log(f'CUDA graphs: captured {key[0]} (forward + backward) for input '
                  f'{tuple(x.shape)} {str(x.dtype).replace("torch.", "")}; reserved '
                  f'memory +{grown:.2f} GiB.', logger='current')
        self.graphs[key] = chain
        return chain

    def _say(self, name: str, message: str) -> None:
        if name not in self._said:
            self._said.add(name)
            print_log(message, logger='current')


def release_graphs(model: nn.Module) -> int:
    """Clear the :class:`CudaGraphCache` of ``model`` and its modules; how many graphs
    were dropped (their memory is returned to the allocator's cache)."""
    dropped = 0
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, CudaGraphCache):
                dropped += len(value.graphs)
                value.clear()
    return dropped


__all__ = ['CudaGraphCache', 'MissingGrads', 'ModuleChain', 'release_graphs']
