#!/usr/bin/env python
"""Benchmark the auto batch size: search time, how close to the limit, no OOM after.

Searches with ``AutoBatchSizeHook``, finds the largest batch that fits without margin
(confirmed by training on random batches), then trains ``--iters`` iterations; prints a
table and writes JSON (``--out``, default ``WORK_DIR/benchmark_auto_batch_size.json``).
The steps and figures: :mod:`mmdet3d_scaling.diagnostics.batch_size_benchmark` and
docs/auto_batch_size.md#benchmark.

Usage::

    python tools/benchmark_auto_batch_size.py CONFIG [--iters 300] [--margin 0.1]
    python tools/benchmark_auto_batch_size.py \\
        configs/demo/pointpillars_synthetic_kitti_cpu.py \\
        --probe modeled --capacity-mib 40 --mib-per-sample 8 --iters 3
"""
import argparse
import sys
from pathlib import Path
from typing import Any, Dict

from mmengine.config import DictAction

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from mmdet3d_scaling.diagnostics import batch_size_benchmark as benchmark  # noqa: E402
from mmdet3d_scaling.utils import progress  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('config', help='config file to search and train (plugin loaded)')
    p.add_argument('--work-dir', help='default: work_dirs/benchmark_auto_batch_size')
    p.add_argument('--iters', type=int, default=300, help='training iterations after '
                   'the search (default 300)')
    p.add_argument('--margin', type=float, default=0.1, help='share of memory kept free')
    p.add_argument('--steps-per-trial', type=int, default=2,
                   help='training steps per search trial (default 2)')
    p.add_argument('--verify-steps', type=int, default=20,
                   help='training steps on random batches that confirm the largest batch '
                        '(0: the 2-step trials alone decide; default 20)')
    p.add_argument('--max-batch-size', type=int, default=512,
                   help='largest per-GPU batch tried (search and the no-margin check)')
    p.add_argument('--adjust', choices=('lr', 'accumulation'), default='lr',
                   help="'lr' (default) trains with exactly the batch found; "
                   "'accumulation' keeps the config's total batch (caps the search)")
    p.add_argument('--probe', choices=('auto', 'cuda', 'modeled'), default='auto',
                   help="'auto': cuda when available, else modeled")
    p.add_argument('--capacity-mib', type=float, default=256.0, help='modeled device')
    p.add_argument('--mib-per-sample', type=float, default=16.0, help='modeled device')
    p.add_argument('--bytes-per-element', type=float, default=0.0, help='modeled device')
    p.add_argument('--out', help='JSON output path')
    p.add_argument('--memory-gib', type=float, default=None,
                   help='cap this process to that much GPU memory (emulates a smaller card)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config keys (key=value), '
                        'e.g. train_dataloader.num_workers=2')
    progress.add_argument(p)
    args = p.parse_args(argv)
    for name, least in (('iters', 1), ('steps_per_trial', 1), ('verify_steps', 0)):
        if getattr(args, name) < least:
            p.error(f'--{name.replace("_", "-")} must be >= {least}, '
                    f'got {getattr(args, name)}')
    return args


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    progress.configure(args)  # the search's trials and the training after it
    benchmark.cap_memory(args.memory_gib)
    result = benchmark.run(args)
    print(benchmark.table(result))
    out = args.out or benchmark.default_out(args.work_dir)
    benchmark.write_json(result, out)
    print(f'written: {out}')
    return result


if __name__ == '__main__':
    main()
