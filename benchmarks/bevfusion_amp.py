"""BEVFusion LiDAR-camera on one GPU: fp32 vs fp16 vs bf16 from the first optimizer step.

Trains ``benchmarks/configs/bevfusion_1gpu_smoke.py`` (= ``configs/bevfusion_1gpu.py`` at
the official sizes), pinned to batch 2 x accumulation 16 with checkpointing, from
scratch on synthetic nuScenes, once per precision, in one process, under a per-process
GPU memory cap, and writes one JSON per run to ``--out-dir``
(``bevfusion_1gpu_amp_<precision>.json``):

- ``samples_per_s``: training samples / wall second after ``--warmup`` micro-batches
  (CUDA-synchronised at both ends);
- ``peak_mem_gib``: the largest ``torch.cuda.max_memory_allocated`` seen before each of
  mmengine's per-log resets;
- ``skipped_steps``: optimizer steps skipped by loss scaling (GPUMonitorHook's
  ``amp/skipped_steps``; 0 without loss scaling), ``grad_scale`` per report;
- ``changed_after_first_step``: share of parameter tensors that differ from their
  initial values after the first optimizer step;
- ``loss_first`` / ``loss_final`` (mean of the first / last optimizer window's
  micro-batch losses), ``grad_norm`` per report (before clipping; NaN = overflow).

fp16 and bf16 use exactly what ``amp = dict(dtype='auto')`` resolves to for a GPU
without / with native bf16 (:func:`resolve_auto_amp`); fp32 drops the ``amp`` key.
A run stops after ``--iters`` micro-batches or, at the end of an optimizer window, once
``--budget-s`` seconds of training have passed, whichever comes first::

    python benchmarks/bevfusion_amp.py --precisions fp32,fp16,bf16 --iters 304 \\
        --budget-s 600 --cap-gib 24 --out-dir $OUT
"""
import argparse
import gc
import json
import math
import os.path as osp
import sys
import time
import traceback
import uuid
from typing import Dict, List, Optional

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import mmdet3d_scaling  # noqa: E402,F401  (registers the plugin, applies patches)
from mmengine.config import Config  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmdet3d_scaling.config.legacy_keys import (cuda_bf16_supported,  # noqa: E402
                                                resolve_auto_amp)
from mmdet3d_scaling.engine.optim_state import accumulation  # noqa: E402

CONFIG = 'benchmarks/configs/bevfusion_1gpu_smoke.py'
GIB = 2 ** 30


class AmpProbe(Hook):
    """Collects the run's figures; stops at ``budget_s`` at an optimizer-window end.

    Priority 50: after the optimizer step, before the LoggerHook (60) resets the CUDA
    peak-memory counter.
    """

    priority = 50

    def __init__(self, warmup: int, budget_s: float, batch: int, window: int = 1) -> None:
        self.window, self.warmup, self.budget_s, self.batch = window, warmup, budget_s, batch
        self.snapshot: Optional[List[torch.Tensor]] = None
        self.changed: Optional[float] = None
        self.losses: List[float] = []
        self.peak = 0
        self.t_start = self.t_warm = self.t_end = None
        self.iters = 0

    def before_train(self, runner) -> None:
        self.window = accumulation(runner.optim_wrapper)
        self.snapshot = [p.detach().clone() for p in runner.model.parameters()]
        torch.cuda.synchronize()
        self.t_start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.iters += 1
        self.peak = max(self.peak, torch.cuda.max_memory_allocated())
        loss = (outputs or {}).get('loss')
        self.losses.append(float(loss) if loss is not None else math.nan)
        if self.iters == self.window:
            params = list(runner.model.parameters())
            self.changed = sum(not torch.equal(p.detach(), s)
                               for p, s in zip(params, self.snapshot)) / len(params)
            self.snapshot = None
        if self.iters == self.warmup:
            torch.cuda.synchronize()
            self.t_warm = time.perf_counter()
        if (self.iters % self.window == 0
                and time.perf_counter() - self.t_start > self.budget_s):
            runner.train_loop.stop_training = True

    def after_train(self, runner) -> None:
        torch.cuda.synchronize()
        self.t_end = time.perf_counter()

    def figures(self) -> Dict[str, object]:
        timed = self.iters - self.warmup
        speed = (timed * self.batch / (self.t_end - self.t_warm)
                 if self.t_warm is not None and timed > 0 else None)
        return dict(micro_batches=self.iters, accumulation=self.window,
                    optimizer_steps=self.iters // self.window,
                    samples_per_s=speed, warmup_micro_batches=self.warmup,
                    train_wall_s=self.t_end - self.t_start,
                    peak_mem_gib=self.peak / GIB,
                    changed_after_first_step=self.changed,
                    loss_first=_mean(self.losses[:self.window]),
                    loss_final=_mean(self.losses[-self.window:]),
                    losses=self.losses)


def _mean(values: List[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _history(runner: Runner, key: str) -> List[float]:
    buffer = runner.message_hub.log_scalars.get(key)
    return [float(v) for v in buffer.data[0]] if buffer is not None else []


def build_config(precision: str, iters: int, work_dir: str) -> Config:
    cfg = Config.fromfile(CONFIG)
    # the fixed recipe these figures are of: batch 2 x 16, checkpointing on (no search
    # for the fastest fit, benchmarks/bevfusion_1gpu_fit.py measures that)
    cfg.scaling.memory_budget = None
    cfg.scaling.per_gpu_batch_size = 2
    cfg.pop('amp', None)
    if precision != 'fp32':
        cfg.amp = resolve_auto_amp(bf16_supported=precision == 'bf16')
    cfg.work_dir = work_dir
    cfg.experiment_name = f'bevfusion_amp_{precision}_{uuid.uuid4().hex[:6]}'
    # iteration counts are optimizer steps under the scaling recipe (x accumulation 16)
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=max(1, iters // 16),
                         val_interval=10 ** 9)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    # The recipe's first 500 optimizer steps are a linear warm-up from lr / 3; the
    # epoch-based cosine and momentum schedules do not act in these few steps.
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.33333333,
                                by_epoch=False, begin=0, end=500)]
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=16)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=10 ** 9,
                                        by_epoch=False, save_last=False)
    cfg.custom_hooks = [dict(type='GPUMonitorHook', interval=16)]
    cfg.randomness = dict(seed=0)
    return cfg


def run(precision: str, args) -> Dict[str, object]:
    cfg = build_config(precision, args.iters, osp.join(args.work_dir, precision))
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else Runner.from_cfg(cfg)
    probe = AmpProbe(warmup=args.warmup, budget_s=args.budget_s,
                     batch=cfg.train_dataloader.batch_size)
    runner.register_hook(probe)
    torch.cuda.reset_peak_memory_stats()
    runner.train()
    wrapper = runner.optim_wrapper
    scaler = getattr(wrapper, 'loss_scaler', None)
    skipped = _history(runner, 'train/amp/skipped_steps')
    return dict(
        precision=precision, config=CONFIG, gpu=torch.cuda.get_device_name(),
        torch=torch.__version__, memory_cap_gib=args.cap_gib,
        optim_wrapper=type(wrapper).__name__,
        autocast_dtype=str(getattr(wrapper, 'cast_dtype', None)),
        amp=cfg.get('amp'),  # what the run asked for (prepare_config works on a copy)
        loss_scaling_on=bool(scaler is not None and scaler.is_enabled()),
        skipped_steps=int(skipped[-1]) if skipped else 0,
        grad_scale=_history(runner, 'train/amp/grad_scale'),
        grad_norm=_history(runner, 'train/grad_norm'),
        parameter_tensors=len(list(runner.model.parameters())),
        **probe.figures())


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--precisions', default='fp32,fp16,bf16')
    parser.add_argument('--iters', type=int, default=304,
                        help='micro-batches per run (a multiple of the accumulation, 16)')
    parser.add_argument('--warmup', type=int, default=32,
                        help='micro-batches left out of samples/s')
    parser.add_argument('--budget-s', type=float, default=600,
                        help='stop a run at the first optimizer-window end after this')
    parser.add_argument('--cap-gib', type=float, default=24)
    parser.add_argument('--out-dir', default='bench_out')
    parser.add_argument('--work-dir', default='work_dirs/bevfusion_amp')
    args = parser.parse_args(argv)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(min(args.cap_gib * GIB / total, 1.0))
    print(f'memory cap: {args.cap_gib} GiB of {total / GIB:.1f} GiB', flush=True)
    native, reason = cuda_bf16_supported()
    auto = dict(bf16_native=native, reason=reason, resolves_to=resolve_auto_amp(native))
    print(f"amp dtype='auto' here: {auto}", flush=True)
    for precision in args.precisions.split(','):
        try:
            result = dict(run(precision, args), auto_amp=auto)
        except Exception as err:  # keep the other precisions' runs
            traceback.print_exc()
            result = dict(precision=precision, error=f'{type(err).__name__}: {err}')
        path = osp.join(args.out_dir, f'bevfusion_1gpu_amp_{precision}.json')
        with open(path, 'w') as f:
            json.dump(result, f, indent=1, default=str)
        brief = {k: result.get(k) for k in (
            'micro_batches', 'samples_per_s', 'peak_mem_gib', 'skipped_steps',
            'changed_after_first_step', 'loss_first', 'loss_final', 'error')}
        print(f'== {precision}: {json.dumps(brief, default=str)}', flush=True)
        gc.collect()
        torch.cuda.empty_cache()


if __name__ == '__main__':
    main()
