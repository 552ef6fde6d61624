"""BatchNorm in training, cuDNN's kernels against PyTorch's own, on the shapes a config's
model feeds its BatchNorm layers.

Why: in PV-RCNN's train step on an H200, cuDNN's ``bn_bw_1C11`` backward kernel was the
largest kernel (34 ms of 193 ms a micro-batch, docs/data/same_call_2026-12-04/
pv_rcnn_b8_spconv_profile.log): the point MLPs normalise ``(1, C, M, nsample)`` tensors,
one sample of millions of positions. This script trains one real micro-batch of the
config (its dataloader, its model) with a forward hook on every BatchNorm layer to take
the input shapes, then times forward + backward of ``F.batch_norm`` in training for each
distinct shape with cuDNN on and off (``torch.backends.cudnn.flags``), median of
``--repeats`` after a warm-up, and the largest differences of output and gradients.

    python benchmarks/batch_norm_kernels.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \\
        --batch 8 --out bn.json
"""
import argparse
import json
import os.path as osp
import statistics
import sys
from collections import OrderedDict
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))


def run_one_micro_batch(config: str, batch: int, options: List[str],
                        register: Callable[[torch.nn.Module], list]) -> None:
    """Train one real micro-batch of ``config`` (its dataloader, its model, forward and
    backward) with the hooks that ``register(model)`` adds (and returns: removed after)."""
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    import mmdet3d_scaling  # noqa: F401
    cfg = Config.fromfile(config)
    if options:
        cfg.merge_from_dict(dict(o.split('=', 1) for o in options))
    cfg.train_dataloader.batch_size = batch
    if cfg.get('scaling'):
        cfg.scaling = dict(cfg.scaling, total_batch_size=batch, per_gpu_batch_size=batch)
        cfg.scaling.pop('max_per_gpu_batch_size', None)
    cfg.work_dir = 'work_dirs/batch_norm_kernels'
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    model = runner.model.train()
    loader = Runner.build_dataloader(cfg.train_dataloader)
    hooks = register(model)
    data = model.data_preprocessor(next(iter(loader)), True)
    losses = model(**data, mode='loss')
    total = sum(v.sum() for k, v in losses.items() if 'loss' in k and torch.is_tensor(v))
    total = total + sum(sum(x.sum() for x in v) for k, v in losses.items()
                        if 'loss' in k and isinstance(v, (list, tuple)))
    total.backward()
    for h in hooks:
        h.remove()


def layer_shapes(config: str, batch: int, options: List[str]) -> Dict[tuple, List[str]]:
    """Input shape (and dtype) of every BatchNorm call in one training micro-batch ->
    the layers that saw it."""
    seen: Dict[tuple, List[str]] = OrderedDict()

    def register(model: torch.nn.Module) -> list:
        hooks = []
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                def hook(mod, args, name=name):
                    x = args[0]
                    seen.setdefault((tuple(x.shape), str(x.dtype)), []).append(name)
                hooks.append(module.register_forward_pre_hook(hook))
        return hooks
    run_one_micro_batch(config, batch, options, register)
    return seen


def time_bn(shape: Tuple[int, ...], dtype: torch.dtype, cudnn: bool, repeats: int,
            warmup: int = 3) -> Tuple[float, Tuple[torch.Tensor, ...]]:
    """Median ms of training-mode batch_norm forward + backward, and its results."""
    gen = torch.Generator(device='cuda').manual_seed(0)
    x = torch.randn(shape, device='cuda', dtype=dtype, generator=gen).requires_grad_()
    c = shape[1]
    weight = torch.rand(c, device='cuda', generator=gen).requires_grad_()
    bias = torch.randn(c, device='cuda', generator=gen).requires_grad_()
    grad = torch.randn(shape, device='cuda', dtype=dtype, generator=gen)
    times = []
    with torch.backends.cudnn.flags(enabled=cudnn):
        for i in range(warmup + repeats):
            mean, var = torch.zeros(c, device='cuda'), torch.ones(c, device='cuda')
            for t in (x, weight, bias):
                t.grad = None
            start, end = torch.cuda.Event(True), torch.cuda.Event(True)
            start.record()
            y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=0.01,
                             eps=1e-3)
            y.backward(grad)
            end.record()
            torch.cuda.synchronize()
            if i >= warmup:
                times.append(start.elapsed_time(end))
    return statistics.median(times), (y.detach(), x.grad, weight.grad, bias.grad)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--repeats', type=int, default=10)
    p.add_argument('--cfg-options', nargs='*', default=[])
    p.add_argument('--out')
    args = p.parse_args()
    seen = layer_shapes(args.config, args.batch, args.cfg_options)
    rows = []
    print('calls  shape                      cudnn ms  native ms  max diff (y, dx, dw, db)  layers')
    for (shape, dtype), layers in seen.items():
        dt = getattr(torch, dtype.replace('torch.', ''))
        ms_cudnn, ref = time_bn(shape, dt, True, args.repeats)
        ms_native, ours = time_bn(shape, dt, False, args.repeats)
        diffs = [float((a.float() - b.float()).abs().max()) for a, b in zip(ref, ours)]
        rows.append(dict(shape=list(shape), dtype=dtype, calls=len(layers),
                         layers=sorted(set(layers)), cudnn_ms=ms_cudnn, native_ms=ms_native,
                         max_abs_diff=diffs))
        print(f'{len(layers):5d}  {str(shape):26s} {ms_cudnn:8.3f}  {ms_native:9.3f}  '
              f'{", ".join(f"{d:.1e}" for d in diffs):26s} {sorted(set(layers))[0]}')
    total = {k: sum(r['calls'] * r[k] for r in rows) for k in ('cudnn_ms', 'native_ms')}
    print(f'all calls: cudnn {total["cudnn_ms"]:.2f} ms, native {total["native_ms"]:.2f} ms '
          'forward + backward a micro-batch')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(config=args.config, batch=args.batch, gpu=torch.cuda.get_device_name(),
                           torch=torch.__version__, rows=rows, total=total), f, indent=1)


if __name__ == '__main__':
    main()
