"""BEVFusion LiDAR-camera on one GPU under a memory cap: the fastest fit
(``configs/bevfusion_1gpu.py``: ``scaling.memory_budget``) vs the former fixed recipe (batch 2 x accumulation 16, gradient checkpointing on).

Both train ``benchmarks/configs/bevfusion_1gpu_smoke.py`` (official sizes, synthetic
nuScenes, AMP ``dtype='auto'``) from scratch, one after the other in one process, with
the GPU capped at ``--cap-gib`` (``torch.cuda.set_per_process_memory_fraction``), for
the same number of optimizer steps (effective batch 32). Per run:

- ``samples_per_s``: training samples / wall second after ``--warmup-samples``
  (CUDA-synchronised at both ends; the fastest fit's search, before the first step, is
  not in it and is reported as ``search_s``);
- ``peak_allocated_gib`` / ``peak_reserved_gib``: ``torch.cuda.max_memory_allocated`` /
  ``max_memory_reserved`` after warm-up (the peaks are reset once the warm-up samples
  have passed; mmengine's per-log resets are read around);
- ``arrangement``: per-GPU batch, accumulation, checkpointing, precision, and for the
  fitted run the search's trials.

Writes one JSON to ``--out`` with both runs, the speed-up and the targets (>= 1.3x the
former recipe, <= 22 GiB reserved). One command on the GPU machine (makes the synthetic
data in data/nuscenes first when it is missing; ~5 min on an H200)::

    python benchmarks/bevfusion_1gpu_fit.py --out $OUT/bevfusion_1gpu_fit.json
"""
import argparse
import gc
import json
import os
import os.path as osp
import subprocess
import sys
import time
import traceback
import uuid
from typing import Dict, List, Optional

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmdet3d_scaling  # noqa: E402,F401  (registers the plugin)
from mmengine.config import Config  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402

from mmdet3d_scaling.engine.optim_state import accumulation  # noqa: E402
from mmdet3d_scaling.batch_size.fastest_fit_hook import FastestFitHook  # noqa: E402

CONFIG = 'benchmarks/configs/bevfusion_1gpu_smoke.py'
DATA = 'data/nuscenes'
GIB = 2 ** 30
TARGET_SPEEDUP, TARGET_RESERVED_GIB = 1.3, 22.0


class SpeedProbe(Hook):
    """Samples/s and memory peaks after ``warmup_samples``.

    Priority 50: after the optimizer step, before the LoggerHook (60), whose log
    processor resets the CUDA peak-memory counters at every log.
    """

    priority = 50

    def __init__(self, warmup_samples: int) -> None:
        self.warmup_samples = warmup_samples
        self.samples = 0
        self.timed_samples = 0
        self.allocated = self.reserved = 0
        self.t_warm: Optional[float] = None
        self.t_end: Optional[float] = None
        self.t_first: Optional[float] = None
        self.t_start = time.perf_counter()

    def before_train(self, runner) -> None:  # after before_run: the search is done
        torch.cuda.synchronize()
        self.t_first = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        batch = len(data_batch['data_samples'])
        self.samples += batch
        if self.t_warm is not None:
            self.timed_samples += batch
            self.allocated = max(self.allocated, torch.cuda.max_memory_allocated())
            self.reserved = max(self.reserved, torch.cuda.max_memory_reserved())
        elif self.samples >= self.warmup_samples:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.t_warm = time.perf_counter()

    def after_train(self, runner) -> None:
        torch.cuda.synchronize()
        self.t_end = time.perf_counter()

    def figures(self) -> Dict[str, object]:
        timed = self.t_end - self.t_warm if self.t_warm is not None else None
        return dict(samples=self.samples, timed_samples=self.timed_samples,
                    samples_per_s=self.timed_samples / timed if timed else None,
                    peak_allocated_gib=self.allocated / GIB,
                    peak_reserved_gib=self.reserved / GIB,
                    start_s=self.t_first - self.t_start,
                    train_wall_s=self.t_end - self.t_first)


def build_config(name: str, steps: int, work_root: str, budget: Optional[str]) -> Config:
    cfg = Config.fromfile(CONFIG)
    if budget is None:  # the former recipe: batch 2 x 16, checkpointing as configured
        cfg.scaling.memory_budget = None
        cfg.scaling.per_gpu_batch_size = 2
    else:
        cfg.scaling.memory_budget = budget
    cfg.work_dir = osp.join(work_root, f'{name}_{uuid.uuid4().hex[:6]}')  # no cache
    # optimizer steps: the recipe multiplies them by the accumulation it plans
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=steps, val_interval=10**9)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.33333333,
                                by_epoch=False, begin=0, end=500)]
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=16)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=10**9,
                                        by_epoch=False, save_last=False)
    cfg.custom_hooks = []
    cfg.randomness = dict(seed=0)
    return cfg


def _precision(runner) -> str:
    wrapper = runner.optim_wrapper
    if type(wrapper).__name__ != 'AmpOptimWrapper':
        return 'fp32'
    return str(getattr(wrapper, 'cast_dtype', None) or torch.float16)


def _checkpointing(model) -> List[str]:
    return sorted({n.split('.')[0] for n, m in model.named_modules()
                   if getattr(m, 'with_cp', False) is True})


def run(name: str, args, budget: Optional[str]) -> Dict[str, object]:
    cfg = build_config(name, args.steps, args.work_dir, budget)
    runner = RUNNERS.build(cfg)
    probe = SpeedProbe(args.warmup_samples)
    runner.register_hook(probe)
    torch.cuda.reset_peak_memory_stats()
    runner.train()
    fit = next((h for h in runner.hooks if isinstance(h, FastestFitHook)), None)
    model = getattr(runner.model, 'module', runner.model)
    result = dict(
        run=name, config=CONFIG, memory_budget=budget, gpu=torch.cuda.get_device_name(),
        torch=torch.__version__, memory_cap_gib=args.cap_gib,
        per_gpu_batch=runner.train_dataloader.batch_size,
        accumulation=accumulation(runner.optim_wrapper), precision=_precision(runner),
        checkpointing_in=_checkpointing(model), **probe.figures())
    if fit is not None and fit.result is not None:
        result.update(search_s=fit.result.seconds, search=fit.result.to_dict())
    return result


def ensure_data() -> None:
    if osp.isfile(osp.join(DATA, 'nuscenes_infos_train.pkl')):
        return
    subprocess.run([sys.executable, 'tools/create_synthetic_data.py', 'nuscenes', '--out',
                    DATA, '--train-frames', '24', '--val-frames', '2', '--full-res',
                    '--workers', str(min(8, os.cpu_count() or 1)), '--no-progress'],
                   check=True)


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--out', default='bench_out/bevfusion_1gpu_fit.json')
    parser.add_argument('--cap-gib', type=float, default=24)
    parser.add_argument('--budget', default='24GiB', help='scaling.memory_budget')
    parser.add_argument('--steps', type=int, default=6,
                        help='optimizer steps (32 samples each) per run')
    parser.add_argument('--warmup-samples', type=int, default=32)
    parser.add_argument('--runs', default='current,fit')
    parser.add_argument('--work-dir', default='work_dirs/bevfusion_1gpu_fit')
    args = parser.parse_args(argv)
    ensure_data()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(args.cap_gib * GIB / total, 1.0))
    print(f'memory cap: {args.cap_gib} GiB of {total / GIB:.1f} GiB', flush=True)
    runs: Dict[str, dict] = {}
    for name in args.runs.split(','):
        try:
            runs[name] = run(name, args, None if name == 'current' else args.budget)
        except Exception as err:  # keep the other run's figures
            traceback.print_exc()
            runs[name] = dict(run=name, error=f'{type(err).__name__}: {err}')
        brief = {k: runs[name].get(k) for k in (
            'per_gpu_batch', 'accumulation', 'checkpointing_in', 'precision',
            'samples_per_s', 'peak_allocated_gib', 'peak_reserved_gib', 'search_s',
            'error')}
        print(f'== {name}: {json.dumps(brief, default=str)}', flush=True)
        gc.collect()
        torch.cuda.empty_cache()
    speeds = [runs.get(n, {}).get('samples_per_s') for n in ('current', 'fit')]
    speedup = speeds[1] / speeds[0] if all(speeds) else None
    reserved = runs.get('fit', {}).get('peak_reserved_gib')
    summary = dict(speedup=speedup, target_speedup=TARGET_SPEEDUP,
                   target_reserved_gib=TARGET_RESERVED_GIB,
                   meets_speed=speedup is not None and speedup >= TARGET_SPEEDUP,
                   meets_memory=reserved is not None and reserved <= TARGET_RESERVED_GIB)
    print(f'== summary: {json.dumps(summary)}', flush=True)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
        json.dump(dict(runs=runs, **summary), f, indent=1, default=str)


if __name__ == '__main__':
    main()
