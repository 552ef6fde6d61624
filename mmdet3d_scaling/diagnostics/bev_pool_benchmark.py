"""Benchmark BEVFusion's BEV pooling paths: time (forward + backward), peak memory and
the largest relative difference from an fp64 reference.

Two kinds of rows:

* ``pool/...``: ``bev_pool(feats, coords, B, D, H, W)`` on a materialised ``(P, C)``
  feature tensor (what upstream's CUDA kernel does; 4.69 ms on an H200 at B=1).
* ``lift+pool/...``: from the depth distribution ``(B*N, D, fH, fW)`` and context
  ``(B*N, fH, fW, C)``: the frustum product plus pooling (materialised), or the lean
  path that never builds the frustum tensor. Peak memory shows what the lean path saves.

Frustum points come from a nuScenes-like rig (6 cameras, 256 x 704 images, 32 x 88
features, depth bins 1-60 m by 0.5 m, a 360 x 360 grid of 0.3 m): about 1.9 M points
per sample fall in the grid. On the CPU the sizes are reduced (``--size reduced``).

Usage::

    python tools/benchmark_bev_pool.py                      # CUDA if present, else CPU
    python tools/benchmark_bev_pool.py --device cpu --size reduced --batch 1
    python tools/benchmark_bev_pool.py --dtype bf16
    python tools/benchmark_bev_pool.py --no-triton          # PyTorch only
"""
import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

SIZES = {
    # cameras, depth bins (1 m + k * step), feature H, W, grid cells (x = y), channels
    'official': dict(cams=6, dbound=(1.0, 60.0, 0.5), feat=(32, 88), grid=360, C=80),
    'reduced': dict(cams=6, dbound=(1.0, 60.0, 2.0), feat=(16, 44), grid=180, C=80),
}
DTYPES = {'fp32': torch.float32, 'bf16': torch.bfloat16, 'fp16': torch.float16}


def load_ops(no_triton: bool = False):
    """The plugin's BEVFusion ops package and its ``bev_pool`` module."""
    from mmdet3d_scaling.models.bevfusion import ops
    from mmdet3d_scaling.models.bevfusion.ops import bev_pool as bp
    if no_triton:
        bp.bev_pool_triton.HAS_TRITON = False
    return ops, bp


def rig_geometry(batch: int, size: dict, device: str) -> torch.Tensor:
    """``(B, N, D, fH, fW, 3)`` LiDAR-frame frustum points of a 6-camera ring."""
    fH, fW = size['feat']
    depths = torch.arange(*size['dbound'], device=device)
    scale = 704 / 1600 * 1.1  # nuScenes 1600 x 900 images resized to ~704 wide
    f, cx, cy = 1266.0 * scale, 352.0, 128.0
    u = torch.linspace(0, 703, fW, device=device)
    v = torch.linspace(0, 255, fH, device=device)
    xn = ((u - cx) / f).view(1, fW).expand(fH, fW)
    yn = ((v - cy) / f).view(fH, 1).expand(fH, fW)
    cams = []
    for n in range(size['cams']):
        yaw = 2 * math.pi * n / size['cams'] + 0.1
        fwd = torch.tensor([math.cos(yaw), math.sin(yaw), 0.0], device=device)
        right = torch.tensor([math.sin(yaw), -math.cos(yaw), 0.0], device=device)
        down = torch.tensor([0.0, 0.0, -1.0], device=device)
        ray = xn[..., None] * right + yn[..., None] * down + fwd  # fH, fW, 3
        pts = depths.view(-1, 1, 1, 1) * ray + torch.tensor([0.0, 0.0, 1.8], device=device)
        cams.append(pts)
    geom = torch.stack(cams)  # N, D, fH, fW, 3
    jitter = torch.linspace(0, 0.7, batch, device=device).view(batch, 1, 1, 1, 1, 1)
    return geom.unsqueeze(0) + jitter  # different samples, slightly shifted


def make_inputs(batch: int, size: dict, device: str, dtype: torch.dtype, ops) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    cells = size['grid']
    step = 108.0 / cells
    geom = rig_geometry(batch, size, device)
    lower = torch.tensor([-54.0, -54.0, -10.0], device=device)
    steps = torch.tensor([step, step, 20.0], device=device)
    index = ops.geometry_cell_index(geom, lower, steps, (cells, cells, 1))
    B, N, D, fH, fW = index.shape
    M, C = B * N, size['C']
    logits = torch.randn(M, D, fH, fW, device=device, generator=g)
    depth = logits.softmax(1).to(dtype)
    context = torch.rand(M, fH, fW, C, device=device, generator=g).to(dtype)
    vox = ((geom - lower) / steps).long()
    bidx = torch.arange(B, device=device).view(B, 1, 1, 1, 1, 1).expand(*geom.shape[:-1], 1)
    coords = torch.cat((vox, bidx), -1).view(-1, 4)
    num_cells = B * cells * cells
    inside = index.view(-1) < num_cells
    return dict(depth=depth, context=context, index=index.view(M, D, fH, fW),
                coords=coords, num_cells=num_cells, inside=inside,
                grid=(B, 1, cells, cells), points_in_grid=int(inside.sum()))


def frustum_feats(inp: dict) -> torch.Tensor:
    d, c = inp['depth'], inp['context']
    return (d.unsqueeze(-1) * c.unsqueeze(1)).reshape(-1, c.shape[-1])


def build_paths(inp: dict, ops, bp, device: str) -> Dict[str, Callable]:
    """name -> fn(requires_grad inputs) returning (output, [grad inputs])."""
    B, D, H, W = inp['grid']
    n = inp['num_cells']

    def pool(deterministic: bool):
        def run(feats):
            return ops.bev_pool(feats, inp['coords_kept'], B, D, H, W,
                                deterministic=deterministic)
        return 'feats', run

    def lift(mode: str):
        def run(depth, context):
            if mode == 'materialised':
                return ops.pool_frustum(
                    (depth.unsqueeze(-1) * context.unsqueeze(1)).reshape(-1, context.shape[-1]),
                    inp['index'].reshape(-1), n)
            return ops.pool_depth_context(depth, context, inp['index'], n,
                                          use_triton=(mode == 'lean-triton'))
        return 'depth_context', run

    paths = {
        'pool/scatter-add (default)': pool(False),
        'pool/sorted (deterministic)': pool(True),
        'lift+pool/materialised': lift('materialised'),
        'lift+pool/lean-torch': lift('lean-torch'),
    }
    if bp.bev_pool_triton.available(inp['depth']):
        paths['lift+pool/lean-triton'] = lift('lean-triton')
    return paths


def reference(inp: dict, kind: str, args: List[torch.Tensor]):
    """fp64 output and input gradients of the same computation (autograd through a
    double-precision index_add_), for the upstream-style random output gradient."""
    args64 = [a.detach().double().requires_grad_() for a in args]
    n = inp['num_cells']
    if kind == 'feats':
        feats = args64[0]
        idx = inp['index'].reshape(-1)[inp['inside']]
    else:
        depth, context = args64
        feats = (depth.unsqueeze(-1) * context.unsqueeze(1)).reshape(-1, context.shape[-1])
        idx = inp['index'].reshape(-1).clamp(max=n)
    out = torch.zeros(n + 1, feats.shape[1], dtype=torch.float64, device=feats.device)
    out = out.index_add(0, idx, feats)[:n]
    if kind == 'feats':  # bev_pool layout (B, C, D, H, W)
        B, D, H, W = inp['grid']
        out = out.view(B, D, H, W, -1).permute(0, 4, 1, 2, 3)
    return out, args64


def rel_diff(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def make_args(kind: str, inp: dict) -> List[torch.Tensor]:
    if kind == 'feats':  # points in the grid only, as upstream passes them
        kept = inp['inside'].nonzero().squeeze(1)
        if 'coords_kept' not in inp:
            inp['coords_kept'] = inp['coords'].index_select(0, kept)
        return [frustum_feats(inp).index_select(0, kept).detach().requires_grad_()]
    return [inp['depth'].detach().clone().requires_grad_(),
            inp['context'].detach().clone().requires_grad_()]


def time_path(fn, kind, inp, device, iters, warmup) -> float:
    args = make_args(kind, inp)
    grad = None
    for i in range(warmup + iters):
        if i == warmup:
            if device == 'cuda':
                torch.cuda.synchronize()
                start, stop = torch.cuda.Event(True), torch.cuda.Event(True)
                start.record()
            else:
                t0 = time.perf_counter()
        out = fn(*args)
        if grad is None:
            grad = torch.ones_like(out)
        out.backward(grad)
    if device == 'cuda':
        stop.record()
        torch.cuda.synchronize()
        return start.elapsed_time(stop) / iters
    return (time.perf_counter() - t0) * 1000 / iters


def check_sync_free(fn, kind, inp) -> str:
    """'yes' if forward + backward run under sync debug mode 'error' (CUDA only)."""
    args = make_args(kind, inp)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = fn(*args)
        out.backward(torch.ones_like(out))
        verdict = 'yes'
    except RuntimeError as exc:
        verdict = 'no: ' + str(exc).splitlines()[0][:40]
    finally:
        torch.cuda.set_sync_debug_mode('default')
    return verdict


def measure(name: str, args, inp, ops, bp) -> dict:
    device = args.device
    kind, fn = build_paths(inp, ops, bp, device)[name]
    make_args(kind, inp)  # caches coords_kept
    # Peak memory of one forward + backward above what the inputs already hold.
    call_args = make_args(kind, inp)
    if device == 'cuda':
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn(*call_args)
        out.backward(torch.ones_like(out))
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = fn(*call_args)
        out.backward(torch.ones_like(out))
        peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    # Accuracy: output and gradients against fp64 for a random output gradient.
    grad = torch.rand(out.shape, generator=torch.Generator(device).manual_seed(1),
                      device=device).to(out.dtype)
    for a in call_args:
        a.grad = None
    out = fn(*call_args)
    out.backward(grad)
    ref_out, ref_args = reference(inp, kind, call_args)
    ref_out.backward(grad.double())
    diff = max([rel_diff(out, ref_out)] +
               [rel_diff(a.grad, r.grad) for a, r in zip(call_args, ref_args)])
    del out, call_args
    ms = time_path(fn, kind, inp, device, args.iters, args.warmup)
    sync = check_sync_free(fn, kind, inp) if device == 'cuda' else '-'
    return dict(path=name, B=args.batch, ms=ms, peak_mib=peak, rel_diff=diff, sync_free=sync,
                points=inp['points_in_grid'])


def worker(args) -> None:
    """Measure one path in this process (a fresh process per path on the CPU, so the
    peak RSS belongs to that path alone) and print its row as JSON."""
    torch.manual_seed(0)
    ops, bp = load_ops(args.no_triton)
    inp = make_inputs(args.batch, SIZES[args.size], args.device, DTYPES[args.dtype], ops)
    print(json.dumps(measure(args.worker, args, inp, ops, bp)))


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', choices=['cuda', 'cpu'],
                        default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='device to measure on (default: cuda when available)')
    parser.add_argument('--size', choices=sorted(SIZES),
                        help="rig and grid sizes (default: 'official' on CUDA, "
                             "'reduced' on the CPU)")
    parser.add_argument('--batch', type=int, nargs='+', default=None,
                        help='batch sizes (default: 1 4 on CUDA, 1 on the CPU)')
    parser.add_argument('--dtype', choices=sorted(DTYPES), default='fp32',
                        help='feature dtype (default fp32; sums are fp32)')
    parser.add_argument('--iters', type=int, default=None,
                        help='timed forward + backward passes per path '
                             '(default: 20 on CUDA, 3 on the CPU)')
    parser.add_argument('--warmup', type=int, default=3,
                        help='untimed passes before timing (default 3)')
    parser.add_argument('--no-triton', action='store_true',
                        help='PyTorch only (as without Triton installed)')
    parser.add_argument('--worker', help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cuda = args.device == 'cuda'
    args.size = args.size or ('official' if cuda else 'reduced')
    args.iters = args.iters or (20 if cuda else 3)
    if args.worker:
        args.batch = args.batch[0]
        return worker(args)
    batches = args.batch or ([1, 4] if cuda else [1])
    ops, bp = load_ops(args.no_triton)
    print(f'device={args.device} size={args.size} {SIZES[args.size]} dtype={args.dtype} '
          f'torch={torch.__version__} triton={bp.bev_pool_triton.HAS_TRITON}')
    if cuda:
        print(f'gpu={torch.cuda.get_device_name()}')
    header = (f'{"path":30s} {"B":>2s} {"points":>9s} {"fwd+bwd ms":>11s} '
              f'{"peak MiB":>9s} {"max rel diff":>12s}  sync-free')
    print('(max rel diff: output and input gradients vs fp64; peak: above the inputs)')
    print(header)
    print('-' * len(header))
    for batch in batches:
        inp = make_inputs(batch, SIZES[args.size], args.device, DTYPES[args.dtype], ops)
        names = list(build_paths(inp, ops, bp, args.device))
        for name in names:
            if cuda:
                args.batch = batch
                row = measure(name, args, inp, ops, bp)
            else:
                cmd = [sys.executable, '-m', __name__, '--device', 'cpu',
                       '--size', args.size, '--batch', str(batch), '--dtype', args.dtype,
                       '--iters', str(args.iters), '--warmup', str(args.warmup),
                       '--worker', name] + (['--no-triton'] if args.no_triton else [])
                row = json.loads(subprocess.check_output(cmd).decode().splitlines()[-1])
            print(f'{row["path"]:30s} {row["B"]:2d} {row["points"]:9d} {row["ms"]:11.2f} '
                  f'{row["peak_mib"]:9.1f} {row["rel_diff"]:12.2e}  {row["sync_free"]}')
        del inp
        if cuda:
            torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
