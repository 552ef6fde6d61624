"""Cost of NonFiniteGuardHook's per-step checks for the model of a config.

The loss and gradient-norm checks read floats that mmengine already read (no GPU work);
the one check with GPU work is the weight check (one fused norm over the parameters and
one host read per optimizer step), done only when no norm clipping logs a gradient norm.
This times that check on the model of CONFIG, on the GPU when there is one:

    python benchmarks/non_finite_guard_cost.py configs/pv_rcnn/pv_rcnn_1xb2-80e_kitti-3d-3class.py \
        --out guard_cost.json

Prints the milliseconds per check (median of --repeats) and the parameter count; writes
them as JSON to --out. Compare with the iteration time of the same model (e.g.
docs/benchmarks.md) for the share.
"""
import argparse
import json
import statistics
import time

import torch


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='a model config (the model is built, no data)')
    parser.add_argument('--repeats', type=int, default=50, help='timed checks')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        help='device for the model (default: cuda when there is one)')
    parser.add_argument('--out', default=None, help='write the figures as JSON here')
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    import mmdet3d_scaling  # noqa: F401  (registers the models; applies the fixes)
    from mmengine.config import Config
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules

    from mmdet3d_scaling.hooks.non_finite_guard_hook import NonFiniteGuardHook

    register_all_modules()
    model = MODELS.build(Config.fromfile(args.config).model).to(args.device)
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)

    def sync() -> None:
        if args.device.startswith('cuda'):
            torch.cuda.synchronize()

    for _ in range(3):  # warm-up (kernel selection)
        NonFiniteGuardHook._weights_finite(model)
    times = []
    for _ in range(args.repeats):
        sync()
        start = time.perf_counter()
        assert NonFiniteGuardHook._weights_finite(model)
        times.append((time.perf_counter() - start) * 1000)
    result = dict(config=args.config, device=args.device, parameters=params,
                  repeats=args.repeats, weight_check_ms_median=statistics.median(times),
                  weight_check_ms_max=max(times))
    print(f'{args.config} on {args.device}: {params / 1e6:.2f} M parameters, weight '
          f'check {result["weight_check_ms_median"]:.3f} ms (median of {args.repeats}, '
          f'max {result["weight_check_ms_max"]:.3f} ms)')
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)


if __name__ == '__main__':
    main()
