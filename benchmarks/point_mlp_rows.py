"""PV-RCNN's set-abstraction modules, mmdet3d's forward against the ``point_mlp_rows``
speed patch (the point MLPs on rows instead of a one-sample image), on the inputs one
real training micro-batch feeds them.

The script trains one micro-batch of the config (its dataloader and model, as
``batch_norm_kernels.py``) with a forward pre-hook on every ``StackedSAModuleMSG`` that
keeps its inputs, then times forward + backward of each call both ways on a copy of the
module (median of ``--repeats`` after a warm-up, CUDA events, TF32 as the config's
``float32_matmul_precision`` sets it: ``--tf32``) and prints the largest differences of
output and input gradient, and the kernels launched a call (``torch.profiler``).

    python benchmarks/point_mlp_rows.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \\
        --batch 8 --out point_mlp_rows.json
"""
import argparse
import copy
import json
import os.path as osp
import statistics
import sys
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))
from batch_norm_kernels import run_one_micro_batch  # noqa: E402


def module_calls(config: str, batch: int, options: List[str]) -> List[Tuple[str, torch.nn.Module, tuple]]:
    """(name, module, inputs) of every StackedSAModuleMSG call in one micro-batch."""
    from mmdet3d.models.layers.pointnet_modules.stack_point_sa_module import \
        StackedSAModuleMSG
    calls = []

    def register(model: torch.nn.Module) -> list:
        hooks = []
        for name, module in model.named_modules():
            if isinstance(module, StackedSAModuleMSG):
                def hook(mod, args, kwargs, name=name):
                    names = ('xyz', 'xyz_batch_cnt', 'new_xyz', 'new_xyz_batch_cnt',
                             'features')
                    values = dict(zip(names, args), **kwargs)
                    calls.append((name, mod, tuple(
                        values.get(n).detach() if torch.is_tensor(values.get(n)) else None
                        for n in names)))
                hooks.append(module.register_forward_pre_hook(hook, with_kwargs=True))
        return hooks
    run_one_micro_batch(config, batch, options, register)
    return calls


def step(fn: Callable, module: torch.nn.Module, inputs: tuple, grad: torch.Tensor = None):
    xyz, cnt, new_xyz, new_cnt, features = inputs
    features = features.clone().requires_grad_() if features is not None else None
    _, out = fn(module, xyz, cnt, new_xyz, new_cnt, features)
    if grad is None:
        grad = torch.randn_like(out)
    module.zero_grad(set_to_none=True)
    out.backward(grad)
    return out.detach(), (features.grad if features is not None else None), grad


def time_call(fn: Callable, module: torch.nn.Module, inputs: tuple, grad: torch.Tensor,
              repeats: int, warmup: int = 3) -> Tuple[float, int]:
    """Median ms of forward + backward, and the CUDA kernels one call launches."""
    from torch.profiler import ProfilerActivity, profile
    times = []
    for i in range(warmup + repeats):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        step(fn, module, inputs, grad)
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step(fn, module, inputs, grad)
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    return statistics.median(times), kernels


def compare(name: str, module: torch.nn.Module, inputs: tuple, repeats: int) -> Dict:
    """One module call both ways: times, kernels, largest differences (printed)."""
    from mmdet3d_scaling.patches.speed import point_mlp_rows as patch
    ours_module, theirs_module = copy.deepcopy(module), copy.deepcopy(module)
    theirs = step(patch.forward.original, theirs_module, inputs)
    ours = step(patch.forward, ours_module, inputs, theirs[2])
    diffs = [float((a - b).abs().max()) if a is not None else 0.0
             for a, b in zip(ours[:2], theirs[:2])]
    up_ms, up_k = time_call(patch.forward.original, theirs_module, inputs, theirs[2],
                            repeats)
    rows_ms, rows_k = time_call(patch.forward, ours_module, inputs, theirs[2], repeats)
    print(f'{name:46s} {inputs[2].shape[0]:8d}  {up_ms:8.3f} ({up_k:5d})       '
          f'{rows_ms:8.3f} ({rows_k:5d})    {diffs[0]:.1e}, {diffs[1]:.1e}')
    return dict(module=name, centres=int(inputs[2].shape[0]), upstream_ms=up_ms,
                upstream_kernels=up_k, rows_ms=rows_ms, rows_kernels=rows_k,
                max_abs_diff=diffs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config')
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--repeats', type=int, default=10)
    p.add_argument('--tf32', action='store_true', help='float32_matmul_precision high')
    p.add_argument('--cfg-options', nargs='*', default=[])
    p.add_argument('--out')
    args = p.parse_args()
    if args.tf32:
        torch.set_float32_matmul_precision('high')
    from mmdet3d_scaling.patches import patching
    calls = module_calls(args.config, args.batch, args.cfg_options)
    print('module                                         centres  upstream ms (kernels)  '
          'rows ms (kernels)  max |d out|, |d grad|')
    rows: List[Dict] = []
    with patching.scoped(['speed']):  # the other speed patches, as a training run has them
        for name, module, inputs in calls:
            rows.append(compare(name, module, inputs, args.repeats))
    total = {k: sum(r[k] for r in rows) for k in ('upstream_ms', 'rows_ms',
                                                   'upstream_kernels', 'rows_kernels')}
    print(f'all calls: upstream {total["upstream_ms"]:.2f} ms ({total["upstream_kernels"]} '
          f'kernels), rows {total["rows_ms"]:.2f} ms ({total["rows_kernels"]} kernels) '
          'forward + backward a micro-batch')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(config=args.config, batch=args.batch, tf32=args.tf32,
                           gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                           rows=rows, total=total), f, indent=1)


if __name__ == '__main__':
    main()
