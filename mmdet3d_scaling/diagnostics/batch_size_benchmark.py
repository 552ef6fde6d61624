"""Benchmark the auto batch size: search time, how close to the limit, no OOM after.

The library of ``tools/benchmark_auto_batch_size.py`` (which parses the flags and calls
:func:`run`). For one config, on one device:

1. builds the real Runner with ``AutoBatchSizeHook`` (cache off) and lets it search:
   ``search s`` and the per-GPU batch ``found`` (safety margin ``--margin``);
2. right after, finds the largest batch that fits on the same largest-sample batches
   with no margin (growing from ``found`` until a trial fails, then bisecting): an
   upper bound, since a trial repeats one batch; then checks it by training:
   ``--verify-steps`` (20) steps on random batches through the train pipeline (their
   varying shapes fragment the allocator's cache as training does), bisecting between
   ``found`` and the bound until a batch trains without OOM: ``largest``.
   ``found / largest`` is the figure for the >= 90 % target (printed at once, so a run
   cut short still reports it);
3. trains ``--iters`` iterations (default 300) with the plan it chose, catching an
   out-of-memory error: ``OOM in training`` and the peak memory of those iterations.

:func:`table` formats the result, :func:`write_json` writes it (``--out``, default
``WORK_DIR/benchmark_auto_batch_size.json``). Targets: found >= 0.9 x largest,
search < 60 s, no OOM.

On a GPU the CUDA allocator is measured. ``--probe modeled`` is a dry run on a CPU: a
modelled device (``--capacity-mib``, ``--mib-per-sample``, ``--bytes-per-element``)
raises a real ``torch.cuda.OutOfMemoryError`` above its capacity, also during step 2.

Importing this module registers :class:`TrainingWatch` in mmdet3d's ``HOOKS``, which is
why the package's ``__init__`` does not import it.
"""
import argparse
import json
import os
import os.path as osp
import time
from typing import Any, Dict, Optional, Tuple

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from mmdet3d.registry import HOOKS

from ..utils import progress
from ..hooks.auto_batch_size_hook import AutoBatchSizeHook
from .memory_probe import CudaMemoryProbe, ModeledMemoryProbe
from .samples import LargestSampleBatches, RandomSampleBatches
from .search import BatchSizeFinder, is_out_of_memory

MiB = 2**20
DEFAULT_WORK_DIR = osp.join('work_dirs', 'benchmark_auto_batch_size')


def _modeled(args, model, optim_wrapper=None) -> ModeledMemoryProbe:
    optimizers = [] if optim_wrapper is None else [optim_wrapper.optimizer]
    return ModeledMemoryProbe(model, capacity_bytes=int(args.capacity_mib * MiB),
                              bytes_per_sample=args.mib_per_sample * MiB,
                              bytes_per_element=args.bytes_per_element,
                              optimizers=optimizers)


class TrainingWatch(Hook):
    """After the search: the no-margin check (printed at once, so a run cut short still
    reports the search and the ratio), then peak memory and time of the training
    iterations (with a progress bar, :mod:`mmdet3d_scaling.utils.progress`)."""

    priority = 'LOWEST'

    def __init__(self, args: dict):
        self.args = argparse.Namespace(**args)
        self.probe = None
        self.iters = 0
        self.start = self.seconds = None
        self.peak_bytes: Optional[int] = None
        self.check: Optional[Dict[str, Any]] = None
        self.bar = progress.bar(show=False)

    def before_train(self, runner) -> None:  # after the search (before_run)
        search = next(h for h in runner.hooks if isinstance(h, AutoBatchSizeHook))
        if search.result is not None:
            found = search.result.batch_size
            self.check = largest_fitting(self.args, runner, found)
            bound = self.check['largest']
            if self.args.verify_steps and bound > found:
                self.check.update(largest_by_training(self.args, runner, found, bound))
            progress.echo(
                f'[auto batch size] search {search.result.seconds:.1f} s -> per-GPU '
                f'batch {found}; largest that fits without margin '
                f'{self.check["largest"]}{" (cap)" if self.check["capped"] else ""} '
                f'(2-step trials: {bound}; {self.check["seconds"]:.1f} s); '
                f'found / largest {found / self.check["largest"]:.2f}; now training '
                f'{self.args.iters} iterations')
        _, self.probe = _model_and_probe(self.args, runner)
        self.probe.release()
        self.probe.reset()
        self.bar = progress.bar(total=runner.max_iters, desc='training', unit='iter')
        self.start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.iters += 1
        self.bar.update(1)

    def finish(self) -> None:
        self.bar.close()
        if self.probe is not None and self.start is not None:
            self.seconds = time.perf_counter() - self.start
            self.peak_bytes = self.probe.peak_bytes()
            if isinstance(self.probe, ModeledMemoryProbe):
                self.probe.detach()


HOOKS.register_module(module=TrainingWatch, force=True)


def build_runner(args) -> Runner:
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    cfg.work_dir = args.work_dir or DEFAULT_WORK_DIR
    cfg.launcher = cfg.get('launcher', 'none')
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=args.iters,
                         val_interval=10**9)
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader',
                'test_cfg', 'test_evaluator'):
        cfg[key] = None
    cfg.param_scheduler = None  # the benchmark measures memory, not convergence
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    hooks = dict(cfg.get('default_hooks') or {})
    hooks['checkpoint'] = dict(type='CheckpointHook', interval=10**9, by_epoch=False,
                               save_last=False)
    hooks.pop('visualization', None)
    cfg.default_hooks = hooks
    cfg.pop('auto_batch_size', None)
    if (cfg.get('scaling') or {}).get('per_gpu_batch_size') == 'auto':
        cfg.scaling.per_gpu_batch_size = None
    probe = None
    if args.probe == 'modeled':
        probe = dict(type='ModeledMemoryProbe', capacity_bytes=int(args.capacity_mib * MiB),
                     bytes_per_sample=args.mib_per_sample * MiB,
                     bytes_per_element=args.bytes_per_element)
    search = dict(type='AutoBatchSizeHook', margin=args.margin,
                  steps_per_trial=args.steps_per_trial,
                  max_batch_size=args.max_batch_size, adjust=args.adjust,
                  use_cache=False, probe=probe)
    watch = dict(type='TrainingWatch', args=vars(args))
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks') or []
                        if not (isinstance(h, dict) and h.get('type') ==
                                'AutoBatchSizeHook')] + [search, watch]
    return Runner.from_cfg(cfg)


def _model_and_probe(args, runner) -> Tuple[Any, Any]:
    """The unwrapped model and a fresh memory probe of the kind ``--probe`` asks for."""
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    probe = _modeled(args, model, runner.optim_wrapper) if args.probe == 'modeled' \
        else CudaMemoryProbe()
    return model, probe


def largest_fitting(args, runner, found: int) -> Dict[str, Any]:
    """The largest batch that really fits (no margin), growing from ``found``."""
    model, probe = _model_and_probe(args, runner)
    loader = runner.train_dataloader
    finder = BatchSizeFinder(
        model, runner.optim_wrapper, LargestSampleBatches(loader.dataset,
                                                          loader.collate_fn),
        probe, margin=0.0, steps_per_trial=args.steps_per_trial,
        init_batch_size=min(found, args.max_batch_size),
        max_batch_size=args.max_batch_size, progress_desc='no-margin bound')
    try:
        result = finder.search()
    finally:
        if isinstance(probe, ModeledMemoryProbe):
            probe.detach()
    return dict(largest=result.batch_size, largest_2step=result.batch_size,
                seconds=result.seconds, capped=result.hit_upper_bound,
                trials=[t.__dict__ for t in result.trials])


def largest_by_training(args, runner, found: int, bound: int) -> Dict[str, Any]:
    """The largest batch in ``[found, bound]`` that trains ``--verify-steps`` steps on
    random batches without running out of memory (``found`` is taken to fit: the
    training after the search tests it)."""
    model, probe = _model_and_probe(args, runner)
    loader = runner.train_dataloader
    batches = RandomSampleBatches(loader.dataset, loader.collate_fn,
                                  num_workers=loader.num_workers)
    finder = BatchSizeFinder(model, runner.optim_wrapper, batches, probe, margin=0.0,
                             steps_per_trial=args.verify_steps, max_batch_size=bound,
                             new_batch_each_step=True,
                             progress_desc='confirming by training')
    start = time.perf_counter()
    try:
        largest = finder.largest_up_to(bound, known_good=found)
    finally:
        batches.close()
        if isinstance(probe, ModeledMemoryProbe):
            probe.detach()
    return dict(largest=largest, verify_seconds=time.perf_counter() - start,
                verify_trials=[t.__dict__ for t in finder.trials])


def run(args) -> Dict[str, Any]:
    if args.probe == 'auto':
        args.probe = 'cuda' if torch.cuda.is_available() else 'modeled'
    runner = build_runner(args)
    search = next(h for h in runner.hooks if isinstance(h, AutoBatchSizeHook))
    watch = next(h for h in runner.hooks if isinstance(h, TrainingWatch))
    oom_at = None
    try:
        runner.train()
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        if not is_out_of_memory(exc) or search.result is None:
            raise
        oom_at = runner.iter
    watch.finish()
    result, plan = search.result, search.plan
    check = watch.check  # taken right after the search (TrainingWatch.before_train)
    return dict(
        config=args.config, device=result.device_name, probe=args.probe,
        capacity_gib=result.capacity_bytes / 2**30, margin=result.margin,
        found=result.batch_size, search_seconds=result.seconds,
        search_trials=[t.__dict__ for t in result.trials],
        per_gpu_batch=plan.per_gpu_batch, accumulation=plan.accumulation,
        largest=check['largest'], largest_2step=check['largest_2step'],
        largest_capped=check['capped'], verify_steps=args.verify_steps,
        verify_trials=check.get('verify_trials', []),
        ratio=result.batch_size / check['largest'], check_seconds=check['seconds'],
        verify_seconds=check.get('verify_seconds'),
        iters_requested=args.iters, iters_done=watch.iters,
        oom_in_training=oom_at is not None, oom_at_iter=oom_at, train_seconds=watch.seconds,
        train_peak_gib=None if watch.peak_bytes is None else watch.peak_bytes / 2**30,
        targets=dict(ratio_ge_0_9=result.batch_size >= 0.9 * check['largest'],
                     search_lt_60s=result.seconds < 60, no_oom=oom_at is None))


def table(r: Dict[str, Any]) -> str:
    rows = [
        ('device', f'{r["device"]} ({r["probe"]}), {r["capacity_gib"]:.2f} GiB'),
        ('margin', f'{r["margin"]:.0%}'),
        ('found (per-GPU batch)', f'{r["found"]} after {len(r["search_trials"])} trials'),
        ('search time', f'{r["search_seconds"]:.1f} s'),
        ('largest that fits (no margin)',
         f'{r["largest"]}' + (' (cap reached)' if r['largest_capped'] else '')
         + (f' (2-step trials: {r["largest_2step"]}; confirmed by {r["verify_steps"]} '
            'training steps on random batches)' if r['verify_trials'] else '')),
        ('found / largest', f'{r["ratio"]:.2f}'),
        ('trained with', f'{r["per_gpu_batch"]} x {r["accumulation"]} accumulation'),
        ('iterations', f'{r["iters_done"]} of {r["iters_requested"]}'),
        ('OOM in training', 'yes, at iteration %s' % r['oom_at_iter']
         if r['oom_in_training'] else 'no'),
        ('training peak', 'n/a' if r['train_peak_gib'] is None
         else f'{r["train_peak_gib"]:.2f} GiB'),
        ('targets', ', '.join(f'{k}={"PASS" if v else "FAIL"}'
                              for k, v in r['targets'].items())),
    ]
    w = max(len(k) for k, _ in rows)
    return '\n'.join(f'{k.ljust(w)} | {v}' for k, v in rows)


def cap_memory(memory_gib: Optional[float]) -> None:
    """Cap this process to ``memory_gib`` of GPU 0 (emulates a smaller card); a no-op
    without the flag or without CUDA."""
    if memory_gib and torch.cuda.is_available():
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, memory_gib * 2**30 / total))


def default_out(work_dir: Optional[str]) -> str:
    """Where the JSON goes without ``--out``: in the work dir."""
    return osp.join(work_dir or DEFAULT_WORK_DIR, 'benchmark_auto_batch_size.json')


def write_json(result: Dict[str, Any], out: str) -> None:
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(result, f, indent=2)
