"""``model.concurrent_branches``: BEVFusion's LiDAR branch on a CUDA stream of its own,
beside the camera branch; the same losses and gradients as one stream. On the CPU the
key changes nothing (one stream): the whole model's losses and gradients are equal bit
for bit. A LiDAR-only model with it is a clear error.

On CUDA the whole model does not repeat itself, even on one stream in full float32
with mmcv's sparse conv, BEV pooling without atomics and cuDNN's deterministic
algorithms: two one-stream runs gave heatmap losses 129.334 and 129.396 on an H100
(call H2). The head makes discrete choices (the top-k proposals of the heatmap, the
Hungarian matching) that turn last-bit differences of atomic additions into different
proposals. So on CUDA the tests compare what the key changes, the branches: the fused
BEV map that ``extract_bev`` returns and the gradients of a fixed random projection of
it. A stream race (a buffer read before the other stream has written it) changes those
by far more than rounding. The tolerance is ``CUDA_TOL``, or three times the spread of
two one-stream runs where that is larger, after a warm-up run (autotuning, first-call
caches); the one-stream test checks that the spread stays below ``MAX_SPREAD``, which is
what makes the comparison mean something.

The branches themselves held a discrete choice until the LiDAR depth map kept the last
point of a pixel (``DepthLSSTransform.lidar_depth_map``): with 3,000 points on two 32 x
96 images many share a pixel, and CUDA kept an arbitrary one. Two one-stream runs then
differed by 0.9 % of the BEV map's norm (call K1) and by 49 % of a small gradient's
(call L1, the Swin patch embedding's bias); with the last point kept they pass on both
sides (call M1). These tests need CUDA only: they run without spconv too (the branches
use mmcv's sparse conv).
"""
import copy
import importlib.util

import pytest
import torch

from .common import build, camera_batch, camera_cfg

CUDA_TOL = 1e-3  # of the BEV map's and of each gradient's norm (module docstring)
MAX_SPREAD = 1e-2  # of two one-stream runs (module docstring)
needs_spconv = pytest.mark.skipif(importlib.util.find_spec('spconv') is None,
                                  reason='the CPU sparse conv needs spconv')


def _losses_and_grads(cfg: dict, state: dict, batch: dict, device: str):
    model = build(cfg).to(device).train()
    model.load_state_dict(state)
    data = model.data_preprocessor(copy.deepcopy(batch), True)
    torch.manual_seed(123)  # the same dropout masks in the head
    losses = model(**data, mode='loss')
    total = sum(v for k, v in losses.items() if 'loss' in k)
    total.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return {k: float(v.detach()) for k, v in losses.items() if 'loss' in k}, grads


def _bev_and_grads(cfg: dict, state: dict, batch: dict, device: str):
    """The fused BEV map and the gradients of ``sum(map * R)`` for a fixed random R."""
    model = build(cfg).to(device).train()
    model.load_state_dict(state)
    data = model.data_preprocessor(copy.deepcopy(batch), True)
    metas = [s.metainfo for s in data['data_samples']]
    torch.manual_seed(123)  # the same random draws in the branches
    bev = model.extract_bev(data['inputs'], metas)
    projection = torch.randn(bev.shape, generator=torch.Generator().manual_seed(7))
    (bev.float() * projection.to(device)).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return bev.detach().float(), grads


def _deterministic_cfg(device: str) -> dict:
    if device == 'cpu':
        return camera_cfg()
    cfg = camera_cfg(deterministic=True)
    cfg['pts_middle_encoder']['sparse_backend'] = 'mmcv'
    return cfg


def _runs(device: str, concurrent_branches: bool, run, plain_runs: int = 1):
    """``run`` of the plain model ``plain_runs`` times, then of the one with
    ``concurrent_branches`` (with False: of the plain model once more)."""
    torch.manual_seed(0)
    plain_cfg = _deterministic_cfg(device)
    state = build(plain_cfg).state_dict()
    other_cfg = dict(_deterministic_cfg(device), concurrent_branches=concurrent_branches)
    batch = camera_batch(seed=3)
    plain = [run(plain_cfg, state, batch, device) for _ in range(plain_runs)]
    return (*plain, run(other_cfg, state, batch, device))


def _grad_floor(grads: dict) -> float:
    # 1e-3 of the whole gradient's norm: a bias before a BatchNorm has a gradient of
    # about 0, whose relative error is large and means nothing
    return 1e-3 * float(torch.cat([g.flatten().float() for g in grads.values()]).norm())


def _assert_same_grads(plain: dict, other: dict, tol: float) -> None:
    assert plain.keys() == other.keys()
    assert any(n.startswith('pts_middle_encoder') for n in plain)
    assert any(n.startswith('img_backbone') for n in plain)
    floor = _grad_floor(plain)
    for name, grad in plain.items():
        error = float((other[name] - grad).norm())
        assert error <= tol * (float(grad.norm()) + floor), (name, error)


def _spread(run: tuple, other: tuple) -> float:
    """The largest relative difference of two branch runs: of the BEV map, and of each
    gradient (against its norm plus the floor)."""
    (bev, grads), (other_bev, other_grads) = run, other
    floor = _grad_floor(grads)
    return max([float((other_bev - bev).norm()) / float(bev.norm())]
               + [float((other_grads[n] - g).norm()) / (float(g.norm()) + floor)
                  for n, g in grads.items()])


def _compare_model(concurrent_branches: bool = True) -> None:
    """The whole model's losses and gradients, equal bit for bit (on the CPU)."""
    plain, other = _runs('cpu', concurrent_branches, _losses_and_grads)
    assert plain[0] == other[0]
    _assert_same_grads(plain[1], other[1], 0.0)


def _branch_runs(concurrent_branches: bool) -> tuple:
    """A warm-up run (autotuning, first-call caches), two one-stream runs and one with
    ``concurrent_branches`` of the branches on CUDA."""
    _, first, second, other = _runs('cuda', concurrent_branches, _bev_and_grads,
                                    plain_runs=3)
    return first, second, other


@pytest.mark.slow
@needs_spconv
def test_same_losses_and_gradients_on_the_cpu():
    _compare_model()


def test_lidar_only_with_it_is_an_error():
    from .common import tiny_model_cfg
    with pytest.raises(ValueError, match='concurrent_branches=True needs the camera'):
        build(dict(tiny_model_cfg(), concurrent_branches=True))


def _full_fp32(monkeypatch) -> None:
    """One convolution algorithm and full fp32 on both sides."""
    monkeypatch.setattr(torch.backends.cudnn, 'allow_tf32', False)
    monkeypatch.setattr(torch.backends.cudnn, 'deterministic', True)
    monkeypatch.setattr(torch.backends.cudnn, 'benchmark', False)
    monkeypatch.setattr(torch.backends.cuda.matmul, 'allow_tf32', False)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_the_compared_model_repeats_itself_on_cuda(monkeypatch):
    """Two one-stream runs of the branches agree within ``MAX_SPREAD``: the premise of
    the stream comparison below."""
    _full_fp32(monkeypatch)
    first, second, _ = _branch_runs(concurrent_branches=False)
    assert _spread(first, second) <= MAX_SPREAD


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_same_losses_and_gradients_on_cuda(monkeypatch):
    _full_fp32(monkeypatch)
    first, second, other = _branch_runs(concurrent_branches=True)
    tol = max(CUDA_TOL, 3 * _spread(first, second))
    assert float((other[0] - first[0]).norm()) <= tol * float(first[0].norm())
    _assert_same_grads(first[1], other[1], tol)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_the_lidar_branch_runs_on_another_stream():
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    model = build(dict(_deterministic_cfg('cuda'), concurrent_branches=True)).cuda().train()
    data = model.data_preprocessor(camera_batch(seed=4), True)
    model(**data, mode='loss')  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(**data, mode='loss')
        torch.cuda.synchronize()
    streams = {e.device_resource_id for e in prof.events()
               if e.device_type == torch.autograd.DeviceType.CUDA}
    assert len(streams) >= 2, streams
