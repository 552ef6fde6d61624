"""Measure GPUMonitorHook's overhead as a share of iteration time.

Trains the same small MLP (synthetic data, real mmengine Runner and hooks) with and
without the hook, alternating, ``--repeats`` times, and prints a table:

* ``iter ms`` - mean wall time per iteration after ``--warmup`` iterations, measured
  between consecutive ``before_train_iter`` calls (so every hook is inside);
* ``hook us/iter`` - time spent inside the hook's own callbacks (and its end-of-iteration
  stamp), per iteration, measured directly; ``hook share`` = that over ``iter ms``.
  This is the figure to compare with the 1% target: the A/B difference of two wall
  times is shown too but is noisier than the overhead itself.

Usage:
    python tools/benchmark_gpu_monitor.py [--iters 300] [--repeats 3] [--json-out F]

``--json-out`` names a new file: an existing one is refused before anything runs
(exit status 2) unless ``--overwrite`` is given, so a saved result is never replaced
silently.

It trains on the GPU when torch sees one (CUDA_VISIBLE_DEVICES= forces the CPU).
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from functools import wraps
from pathlib import Path
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

import mmdet3d_scaling  # noqa: E402,F401
from mmdet3d_scaling.hooks.gpu_monitor_hook import GPUMonitorHook  # noqa: E402

HOOK_METHODS = ('before_train_epoch', 'before_train_iter', 'after_train_iter',
                'before_val_epoch', 'after_val_epoch')


class MLP(BaseModel):
    def __init__(self, width: int, depth: int):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        self.body = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))

    def forward(self, inputs, targets=None, mode='tensor'):
        out = self.body(inputs).squeeze(-1)
        if mode == 'loss':
            return dict(loss=((out - targets) ** 2).mean())
        return out


class RandomData(Dataset):
    def __init__(self, length: int, width: int):
        self.x = torch.randn(length, width)
        self.y = torch.randn(length)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int) -> dict:
        return dict(inputs=self.x[idx], targets=self.y[idx])


class IterClock(Hook):
    """Timestamps every before_train_iter (HIGHEST priority: before any other hook)."""

    priority = 'HIGHEST'

    def __init__(self):
        self.stamps: List[float] = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.stamps.append(time.perf_counter())

    def mean_iter_s(self, warmup: int) -> float:
        gaps = [b - a for a, b in zip(self.stamps[warmup:], self.stamps[warmup + 1:])]
        return statistics.mean(gaps)


def _timed(fn, totals: Dict[str, float]):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals['s'] += time.perf_counter() - start
    return wrapper


def _time_hook(hook: GPUMonitorHook, totals: Dict[str, float]) -> None:
    """Wrap the hook's callbacks (and its stamp callback) with a stopwatch."""
    for name in HOOK_METHODS:
        setattr(hook, name, _timed(getattr(hook, name), totals))
    hook._stamp_iter_end = _timed(hook._stamp_iter_end, totals)


def run_once(args, monitor: bool, work_dir: str) -> Dict[str, float]:
    clock = IterClock()
    hooks: List[Hook] = [clock]
    totals = {'s': 0.0}
    if monitor:
        hook = GPUMonitorHook(interval=args.interval)
        _time_hook(hook, totals)
        hooks.append(hook)
    iters = args.warmup + args.iters
    runner = Runner(
        model=MLP(args.width, args.depth),
        work_dir=work_dir,
        train_dataloader=dict(
            dataset=RandomData(args.batch_size * iters, args.width),
            batch_size=args.batch_size, num_workers=args.workers,
            persistent_workers=args.workers > 0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=1e-3)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(logger=dict(type='LoggerHook', interval=args.interval),
                           checkpoint=dict(type='CheckpointHook', interval=10**9,
                                           save_last=False)),
        custom_hooks=hooks,
        default_scope='mmdet3d',
        log_level='ERROR',
        env_cfg=dict(dist_cfg=dict(backend='nccl' if args.device == 'cuda' else 'gloo')),
    )
    runner.train()
    iter_s = clock.mean_iter_s(args.warmup)
    # Hook time over the measured iterations only (warmup share is proportional).
    hook_s = totals['s'] / iters
    return dict(iter_ms=iter_s * 1e3, hook_us=hook_s * 1e6,
                hook_share=hook_s / iter_s if monitor else 0.0)


def check_json_out(parser: argparse.ArgumentParser, path: Optional[Path],
                   overwrite: bool) -> None:
    """Refuse (before the minutes of measuring) a ``--json-out`` that exists."""
    if path is not None and path.exists() and not overwrite:
        parser.error(f'--json-out {str(path)!r} exists ({path.stat().st_size} bytes): pick '
                     'a new file, or pass --overwrite to replace it')


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--iters', type=int, default=300, help='measured iterations')
    parser.add_argument('--warmup', type=int, default=20,
                        help='iterations before the measured ones (default 20)')
    parser.add_argument('--repeats', type=int, default=3,
                        help='with / without hook pairs, alternating (default 3)')
    parser.add_argument('--interval', type=int, default=10,
                        help='LoggerHook and monitor interval (iterations)')
    parser.add_argument('--width', type=int, default=1024,
                        help='features of the MLP and its inputs (default 1024)')
    parser.add_argument('--depth', type=int, default=4,
                        help='linear layers of the MLP (default 4)')
    parser.add_argument('--batch-size', type=int, default=64,
                        help='samples an iteration (default 64)')
    parser.add_argument('--workers', type=int, default=0, help='dataloader workers')
    parser.add_argument('--json-out', type=Path, default=None,
                        help='also write the rows and summary as JSON here (a new file)')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing --json-out file')
    args = parser.parse_args(argv)
    check_json_out(parser, args.json_out, args.overwrite)
    # mmengine's Runner trains on CUDA whenever torch sees a device.
    args.device = 'cuda' if torch.cuda.is_available() else 'cpu'

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            # Alternate the order so drift (clocks, caches) does not favour one side.
            order = (False, True) if repeat % 2 == 0 else (True, False)
            result = {m: run_once(args, m, f'{tmp}/{repeat}_{m}') for m in order}
            rows.append(dict(repeat=repeat, base_ms=result[False]['iter_ms'],
                             with_ms=result[True]['iter_ms'],
                             hook_us=result[True]['hook_us'],
                             hook_share=result[True]['hook_share']))

    header = (f'GPUMonitorHook overhead: device={args.device} MLP {args.depth}x{args.width}, '
              f'batch {args.batch_size}, interval {args.interval}, {args.iters} iters '
              f'x {args.repeats} repeats')
    print(header)
    print(f'{"repeat":>6} {"iter ms (no hook)":>18} {"iter ms (hook)":>15} '
          f'{"A/B diff":>9} {"hook us/iter":>13} {"hook share":>11}')
    for row in rows:
        diff = row['with_ms'] / row['base_ms'] - 1
        print(f'{row["repeat"]:>6} {row["base_ms"]:>18.3f} {row["with_ms"]:>15.3f} '
              f'{diff:>+9.2%} {row["hook_us"]:>13.1f} {row["hook_share"]:>11.3%}')
    summary = dict(
        base_ms=statistics.median(r['base_ms'] for r in rows),
        with_ms=statistics.median(r['with_ms'] for r in rows),
        hook_us=statistics.median(r['hook_us'] for r in rows),
        hook_share=statistics.median(r['hook_share'] for r in rows))
    print(f'{"median":>6} {summary["base_ms"]:>18.3f} {summary["with_ms"]:>15.3f} '
          f'{summary["with_ms"] / summary["base_ms"] - 1:>+9.2%} '
          f'{summary["hook_us"]:>13.1f} {summary["hook_share"]:>11.3%}')
    if args.json_out:
        args.json_out.write_text(json.dumps(dict(args={k: str(v) for k, v in
                                                       vars(args).items()},
                                                 rows=rows, summary=summary), indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
