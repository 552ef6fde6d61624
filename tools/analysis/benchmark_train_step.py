#!/usr/bin/env python
"""Samples/s, peak memory after warm-up and a kernel profile of a config's training step.

One GPU, one process: trains ``--warmup`` + ``--iters`` + ``--profile`` micro-batches of
``--batch`` at ``--precision`` and prints / saves the figures of
:mod:`mmdet3d_scaling.diagnostics.train_step_benchmark` (median time per micro-batch,
peak allocated and reserved after the warm-up, GPU busy share and top kernels).
Several precisions run one after the other in the same process::

    python tools/analysis/benchmark_train_step.py \\
        configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py \\
        --batch 4 --precision bf16,fp32 --workers 4 --out bevfusion_b4.json

``--stock`` runs a config without importing the plugin (stock mmdet3d as shipped);
``--threads N`` sets torch's intra-op threads (0: torch's default).
"""
import argparse
import gc
import json
import os.path as osp
import sys
import traceback
from typing import List, Optional

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('config', help='config file (the plugin\'s or a stock mmdet3d one)')
    p.add_argument('--batch', type=int, default=4, help='samples per micro-batch')
    p.add_argument('--precision', default='bf16',
                   help='comma-separated: fp32, bf16, fp16 (AMP with autocast)')
    p.add_argument('--warmup', type=int, default=10, help='micro-batches not measured')
    p.add_argument('--iters', type=int, default=20, help='measured micro-batches')
    p.add_argument('--profile', type=int, default=5,
                   help='micro-batches profiled after the measured ones (0: none)')
    p.add_argument('--sync-sites', type=int, default=2,
                   help='micro-batches after the profiled ones in which every host wait '
                        'for the GPU is counted by stage and Python call site (0: none)')
    p.add_argument('--workers', type=int, default=None, help='loader workers')
    p.add_argument('--threads', type=int, default=0,
                   help="torch intra-op threads (0: torch's default)")
    p.add_argument('--cap-gib', type=float, default=0,
                   help='limit this process to this much GPU memory (0: no cap)')
    p.add_argument('--stock', action='store_true',
                   help='do not import mmdet3d_scaling (stock mmdet3d)')
    p.add_argument('--trace', default=None,
                   help='write the profiled micro-batches\' Chrome trace here '
                        '(.json, or .json.gz compressed)')
    p.add_argument('--sync-each-iter', action='store_true',
                   help='synchronise with the GPU around every micro-batch (isolated '
                        'steps; default: only at the ends of the measured window)')
    p.add_argument('--gc-freeze', action='store_true',
                   help='train with GarbageCollectionHook(freeze=True): the start-up '
                        'heap frozen before the first iteration')
    p.add_argument('--gc-interval', type=int, default=None,
                   help='train with GarbageCollectionHook(collect_interval=N): automatic '
                        'collection off, a full one every N micro-batches')
    p.add_argument('--cfg-options', nargs='+', action=DictAction,
                   help='override config settings (key=value)')
    p.add_argument('--work-dir', default='work_dirs/benchmark_train_step',
                   help='work dir of the runs (one folder per precision)')
    p.add_argument('--out', default=None, help='JSON file for the results')
    return p.parse_args(argv)


def run_one(args: argparse.Namespace, precision: str) -> dict:
    import torch
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from mmdet3d_scaling.diagnostics.train_step_benchmark import (TrainStepProbe, add_gc_hook,
                                                                  configure)
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    probe = TrainStepProbe(args.warmup, args.iters, args.profile, args.batch,
                           sync_each_iter=args.sync_each_iter, sync_sites=args.sync_sites,
                           trace=args.trace)
    configure(cfg, args.batch, precision, probe.last_iteration, args.workers)
    gc_hook = add_gc_hook(cfg, args.gc_freeze, args.gc_interval)
    cfg.work_dir = osp.join(args.work_dir, precision)
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    runner.register_hook(probe)
    runner.train()
    return dict(config=args.config, precision=precision, stock=args.stock,
                threads=torch.get_num_threads(), gpu=torch.cuda.get_device_name(),
                torch=torch.__version__, cap_gib=args.cap_gib,
                cfg_options=args.cfg_options, gc_hook=gc_hook, **probe.figures())


def print_sync_sites(rows: List[dict]) -> None:
    """The host waits by stage and call site, most frequent first."""
    if not rows:
        return
    print('[step] host waits for the GPU (per micro-batch): stage, waits, call site')
    for row in rows:
        print(f"[step] {row['stage']:28s} {row['calls_per_iter']:5.1f}  {row['site']}")


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    import torch

    from mmdet3d_scaling.diagnostics.gc_pauses import describe
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.stock:
        from mmdet3d.utils import register_all_modules
        register_all_modules(init_default_scope=False)
    else:
        import mmdet3d_scaling  # noqa: F401
    if args.cap_gib:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(args.cap_gib * 2 ** 30 / total, 1.0))
    results = []
    for precision in args.precision.split(','):
        try:
            result = run_one(args, precision)
        except Exception as err:  # keep the other precisions' results
            traceback.print_exc()
            result = dict(config=args.config, precision=precision,
                          error=f'{type(err).__name__}: {err}')
        results.append(result)
        brief = {k: result.get(k) for k in ('precision', 'samples_per_s',
                                            'peak_allocated_gib', 'peak_reserved_gib',
                                            'nvml_util_pct', 'error')}
        prof = result.get('profile') or {}
        print(f'[step] {json.dumps(brief)}', flush=True)
        if prof:
            print(f"[step] GPU busy {prof['gpu_busy_share']:.1%}, kernels "
                  f"{prof['kernel_ms_per_iter']:.1f} ms of {prof['wall_ms_per_iter']:.1f} "
                  'ms per micro-batch; top kernels:')
            for row in prof['top_kernels']:
                print(f"[step] {row['share']:6.1%} {row['ms_per_iter']:8.2f} ms  {row['name']}")
            print('[step] where the GPU idles (ms per micro-batch): stage, wall, busy, idle, '
                  'launches, syncs, host reads; top host ops')
            for row in prof.get('stages', []):
                ops = ', '.join(f"{o['name']} {o['self_ms_per_iter']:.1f}"
                                for o in row['top_host_ops'][:3])
                print(f"[step] {row['stage']:28s} {row['wall_ms_per_iter']:7.1f} "
                      f"{row['busy_ms_per_iter']:7.1f} {row['idle_ms_per_iter']:7.1f} "
                      f"{row['launches_per_iter']:6.0f} {row['syncs_per_iter']:5.0f} "
                      f"{row['host_reads_per_iter']:5.0f}  {ops}")
        if result.get('gc'):
            print(f"[step] measured micro-batches: {describe(result['gc'])}")
        if prof.get('gc'):
            print(f"[step] profiled micro-batches: {describe(prof['gc'])}")
        print_sync_sites(result.get('sync_sites') or [])
        gc.collect()
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == '__main__':
    main()
