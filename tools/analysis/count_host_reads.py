#!/usr/bin/env python
"""Count the host reads of one training step of a config, by Python call site.

Builds the config's Runner (plugin applied), trains ``--warmup`` steps, then counts what
``--steps`` more would read back from the GPU (``.item()``, ``if tensor:``, ``nonzero``,
boolean-mask indexing, ``.cpu()``: :class:`mmdet3d_scaling.engine.host_reads.HostReadCensus`).
Runs on a CPU: each such read is a point where a host-bound model's CPU waits for its
GPU, and in DDP with SyncBN where ranks wait for each other. Reads inside CUDA
extensions are not seen (see the module).

Usage::

    python tools/analysis/count_host_reads.py configs/pv_rcnn/pv_rcnn_synthetic_kitti_cpu.py
    python tools/analysis/count_host_reads.py CONFIG --steps 2 --top 30 --out reads.json
"""
import argparse
import os.path as osp
import sys
import time
from typing import Any, Dict

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import mmengine  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

import mmdet3d_scaling  # noqa: E402,F401
from mmdet3d_scaling.engine.host_reads import HostReadCensus  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('config')
    p.add_argument('--steps', type=int, default=1, help='counted training steps')
    p.add_argument('--warmup', type=int, default=1, help='training steps before counting')
    p.add_argument('--top', type=int, default=25, help='call sites listed')
    p.add_argument('--work-dir', default='work_dirs/count_host_reads')
    p.add_argument('--out', help='JSON output (default: WORK_DIR/host_reads.json)')
    p.add_argument('--cfg-options', nargs='+', action=DictAction)
    args = p.parse_args(argv)
    for name, least in (('steps', 1), ('warmup', 0), ('top', 1)):
        if getattr(args, name) < least:
            p.error(f'--{name} must be >= {least}, got {getattr(args, name)}')
    return args


def count(args) -> Dict[str, Any]:
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir
    cfg.launcher = 'none'
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader',
                'test_cfg', 'test_evaluator'):
        cfg[key] = None
    runner = Runner.from_cfg(cfg)
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    batches = iter(runner.build_dataloader(runner._train_dataloader))
    model = runner.model
    model.train()
    for _ in range(args.warmup):
        model.train_step(next(batches), optim_wrapper)
    census = HostReadCensus()
    samples, start = 0, time.perf_counter()
    for _ in range(args.steps):
        data = next(batches)
        samples += len(data['data_samples'])
        with census:
            model.train_step(data, optim_wrapper)
    return dict(config=args.config, steps=args.steps, samples=samples,
                seconds=time.perf_counter() - start,
                reads_per_step=census.total / args.steps,
                reads_per_sample=census.total / max(samples, 1),
                sites=census.sites(args.top, per=args.steps))


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    result = count(args)
    print(f"{result['reads_per_step']:.1f} host reads a training step "
          f"({result['reads_per_sample']:.1f} a sample), {args.steps} step(s) counted")
    print('per step | read | call site')
    for s in result['sites']:
        print(f"{s['count']:8.1f} | {s['op']} | {s['site']}")
    out = args.out or osp.join(args.work_dir, 'host_reads.json')
    mmengine.dump(result, out, indent=2)  # creates the folder
    print(f'written: {out}')
    return result


if __name__ == '__main__':
    main()
