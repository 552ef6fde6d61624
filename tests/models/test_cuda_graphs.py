"""CUDA graphs of a module chain (models/cuda_graphs.py) and BEVFusion's
``cuda_graphs`` option: configuration on any machine; on CUDA, a graphed Swin-T
image encoder gives the eager outputs, gradients (accumulated over micro-batches) and
BatchNorm statistics."""
import copy
import logging

import pytest
import torch

from mmengine.logging import MMLogger
from mmdet3d.registry import MODELS

from mmdet3d_scaling.batch_size.checkpoint_switch import CheckpointSwitch
from mmdet3d_scaling.models import cuda_graphs
from mmdet3d_scaling.models.cuda_graphs import (CudaGraphCache, MissingGrads, ModuleChain,
                                                release_graphs)

from .bevfusion.common import build, tiny_model_cfg


def _camera_cfg(**kwargs):
    cfg = tiny_model_cfg()
    cfg.update(
        img_backbone=dict(type='mmdet.SwinTransformer', embed_dims=24, depths=[1, 1, 2, 1],
                          num_heads=[1, 2, 3, 3], window_size=7, out_indices=[1, 2, 3],
                          drop_path_rate=0.0, with_cp=False, convert_weights=False),
        img_neck=dict(type='GeneralizedLSSFPN', in_channels=[48, 96, 192],
                      out_channels=32, start_level=0, num_outs=3,
                      norm_cfg=dict(type='BN2d', requires_grad=True),
                      act_cfg=dict(type='ReLU', inplace=True),
                      upsample_cfg=dict(mode='bilinear', align_corners=False)),
        view_transform=dict(type='LSSTransform', in_channels=32, out_channels=16,
                            image_size=[64, 176], feature_size=[8, 22],
                            xbound=[-12.8, 12.8, 0.8], ybound=[-12.8, 12.8, 0.8],
                            zbound=[-10.0, 10.0, 20.0], dbound=[1.0, 30.0, 2.0],
                            downsample=1))
    cfg.update(kwargs)
    return cfg


def test_unknown_chain_is_an_error():
    with pytest.raises(ValueError, match="'img_head'.*not in"):
        build(_camera_cfg(cuda_graphs=['img_head']))


def _build_logged(cfg):
    lines = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    try:
        return build(cfg), lines
    finally:
        logger.removeHandler(handler)


def test_a_model_without_camera_runs_eagerly_and_says_why():
    model, lines = _build_logged(dict(tiny_model_cfg(), cuda_graphs=['img_encoder']))
    assert model.cuda_graphs == ()
    assert any('no camera branch' in line and 'runs eagerly' in line for line in lines)


@pytest.mark.parametrize('change', [
    dict(checkpoint_modules=['img_backbone']),
    dict(with_cp=True),  # the Swin blocks' own flag
])
def test_a_checkpointed_chain_runs_eagerly_while_checkpointing_is_on(change):
    cfg = _camera_cfg(cuda_graphs=['img_encoder'])
    if 'with_cp' in change:
        cfg['img_backbone']['with_cp'] = True
    else:
        cfg.update(change)
    model, lines = _build_logged(cfg)
    assert model.cuda_graphs == ('img_encoder', )
    assert any('runs eagerly while' in line for line in lines), lines
    assert not model.runs_as_graph('img_encoder')
    # the fastest fit's variant without checkpointing: the chain is a graph again
    switch = CheckpointSwitch(model)
    switch.set(False)
    assert model.runs_as_graph('img_encoder')
    switch.set(True)
    assert not model.runs_as_graph('img_encoder')


def test_release_graphs_empties_every_cache_of_a_model():
    model = build(_camera_cfg(cuda_graphs=['img_encoder']))
    model._graph_cache.graphs[('img_encoder', ())] = torch.nn.Identity()
    assert release_graphs(model) == 1
    assert model._graph_cache.graphs == {} and release_graphs(model) == 0


def test_cpu_calls_run_eagerly():
    cache = CudaGraphCache()
    assert not cache.applies(torch.zeros(2), training=True)


def test_deep_copy_starts_empty():
    cache = CudaGraphCache(max_graphs=3)
    cache.graphs[('x', ())] = torch.nn.Identity()
    clone = copy.deepcopy(cache)
    assert clone.graphs == {} and clone.max_graphs == 3


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


def _encoder(seed=0):
    cfg = _camera_cfg()
    torch.manual_seed(seed)
    modules = [MODELS.build(cfg[k]).cuda() for k in ('img_backbone', 'img_neck')]
    for m in modules:  # mmdet's SwinTransformer.train() returns None, so not chained
        m.train()
    return modules


@pytest.mark.cuda
@cuda
@pytest.mark.parametrize('amp', [None, torch.bfloat16])
def test_graphed_encoder_equals_eager_over_accumulated_micro_batches(amp, monkeypatch):
    # one convolution algorithm and full fp32 on both sides
    monkeypatch.setattr(torch.backends.cudnn, 'allow_tf32', False)
    monkeypatch.setattr(torch.backends.cudnn, 'deterministic', True)
    eager = _encoder()
    graphed = copy.deepcopy(eager)
    cache = CudaGraphCache()
    torch.manual_seed(1)
    batches = [torch.randn(6, 3, 64, 176, device='cuda') for _ in range(3)]
    originals = [x.clone() for x in batches]

    def step(modules, use_graph):
        outs = []
        for x in batches:  # three micro-batches accumulate into .grad
            with torch.autocast('cuda', dtype=amp or torch.float32, enabled=amp is not None):
                y = cache.run('enc', modules, x) if use_graph else ModuleChain(modules)(x)
                loss = sum((o.float() ** 2).mean() for o in y)
            loss.backward()
            outs.append([o.detach().clone() for o in y])
        return outs

    def two_optimizer_steps(modules, use_graph):
        step(modules, use_graph)  # then the optimizer's zero_grad(set_to_none=True):
        for p in torch.nn.ModuleList(modules).parameters():  # the kept buffer comes back
            p.grad = None
        return step(modules, use_graph)

    ref, ours = two_optimizer_steps(eager, False), two_optimizer_steps(graphed, True)
    for x, original in zip(batches, originals):  # replays leave the callers' inputs be
        assert torch.equal(x, original)
    tol = dict(rtol=1e-4, atol=1e-5) if amp is None else dict(rtol=2e-2, atol=2e-3)
    for a, b in zip(ref, ours):
        for x, y in zip(a, b):
            torch.testing.assert_close(y, x, **tol)
    for (name, p), q in zip(torch.nn.ModuleList(eager).named_parameters(),
                            torch.nn.ModuleList(graphed).parameters()):
        if p.grad is None:
            assert q.grad is None or not q.grad.any(), name
            continue
        torch.testing.assert_close(q.grad, p.grad, **tol, msg=name)
    for (name, a), b in zip(torch.nn.ModuleList(eager).named_buffers(),
                            torch.nn.ModuleList(graphed).buffers()):
        torch.testing.assert_close(b, a, **tol, msg=name)  # each batch counted once
    assert len(cache.graphs) == 1


@pytest.mark.cuda
@cuda
def test_new_shapes_beyond_the_limit_run_eagerly():
    modules = _encoder()
    cache = CudaGraphCache(max_graphs=1)
    for n in (2, 3):
        x = torch.randn(n, 3, 64, 176, device='cuda')
        out = cache.run('enc', modules, x)
        sum(o.sum() for o in out).backward()
    assert len(cache.graphs) == 1


_FAILING_CAPTURE = """
import torch
from mmdet3d_scaling.models.cuda_graphs import CudaGraphCache

class HostRead(torch.nn.Module):  # a module a stream capture cannot record
    def forward(self, x):
        return x * float(x.sum())

x = torch.randn(4, 8, device='cuda')
try:
    CudaGraphCache().run('chain', [torch.nn.Linear(8, 8).cuda(), HostRead()], x)
except RuntimeError as err:
    print(err)
"""


@pytest.mark.cuda
@cuda
def test_a_capture_that_fails_is_an_error_that_names_the_way_out():
    # in a process of its own: a failed capture leaves the CUDA generator in capture
    # mode, which would break the random draws of the tests after it
    import subprocess
    import sys
    from pathlib import Path
    out = subprocess.run([sys.executable, '-c', _FAILING_CAPTURE], capture_output=True,
                         text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert 'capturing chain' in out.stdout and 'input (4, 8) failed' in out.stdout
    assert 'model.cuda_graphs=[]' in out.stdout


def test_captures_see_a_thread_local_torch_cuda_graph_for_the_call_only():
    import inspect
    original = torch.cuda.graph
    with cuda_graphs.thread_local_capture():
        inside = torch.cuda.graph
    assert torch.cuda.graph is original
    if 'capture_error_mode' in inspect.signature(
            torch.cuda.make_graphed_callables).parameters:
        assert inside is original  # torch takes the mode as an argument
    else:
        assert inside is not original and issubclass(inside, original)


@pytest.mark.cuda
@cuda
def test_a_capture_succeeds_while_another_thread_pins_memory():
    """The training DataLoader's pin-memory thread allocates pinned memory while the
    first step captures; in torch's default (global) capture mode that call invalidates
    the capture."""
    import threading
    stop = threading.Event()

    def pin():
        size = 1
        while not stop.is_set():  # new sizes: cudaHostAlloc, not the host cache
            torch.empty(size * 4096 + 1, pin_memory=True)
            size += 1

    thread = threading.Thread(target=pin, daemon=True)
    thread.start()
    try:
        for n in (2, 3):  # two captures, one graph each
            modules = _encoder()
            cache = CudaGraphCache()
            out = cache.run('enc', modules, torch.randn(n, 3, 64, 176, device='cuda'))
            sum(o.float().sum() for o in out).backward()
            assert len(cache.graphs) == 1
    finally:
        stop.set()
        thread.join()
    assert torch.cuda.graph is torch.cuda.graphs.graph


def test_missing_grads_are_zero_views_of_one_buffer_kept_across_steps():
    """Parameters without a gradient get zeros, views of one buffer; after the
    optimizer sets them to None the same buffer comes back zeroed; another set of
    missing parameters gets a new buffer; a parameter of another dtype its own zeros."""
    params = [torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(5)),
              torch.nn.Parameter(torch.randn(2, dtype=torch.float64)),
              torch.nn.Parameter(torch.randn(2), requires_grad=False)]
    give = MissingGrads()
    give(params)
    assert params[3].grad is None
    grads = [p.grad for p in params[:3]]
    assert all(g is not None and not g.any() for g in grads)
    assert grads[0].untyped_storage().data_ptr() == grads[1].untyped_storage().data_ptr()
    assert grads[2].dtype == torch.float64
    for p in params[:3]:
        p.grad += 1.0  # what a backward accumulates
        p.grad = None  # zero_grad(set_to_none=True)
    give(params)
    assert params[0].grad.untyped_storage().data_ptr() == \
        grads[0].untyped_storage().data_ptr()  # kept
    assert all(not p.grad.any() for p in params[:3])  # and zeroed
    kept = params[0].grad.untyped_storage().data_ptr()
    params[1].grad = None  # only one missing: another set
    give(params)
    assert not params[1].grad.any() and params[0].grad.untyped_storage().data_ptr() == kept
    assert params[1].grad.untyped_storage().data_ptr() != kept
