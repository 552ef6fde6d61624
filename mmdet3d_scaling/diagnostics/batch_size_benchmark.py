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

Step 2 and the timing of step 3 run in the hook
:class:`~mmdet3d_scaling.diagnostics.hooks.training_watch.TrainingWatch` (the no-margin
check itself: :mod:`mmdet3d_scaling.diagnostics.batch_size_limits`). Importing this
module registers ``TrainingWatch`` in mmdet3d's ``HOOKS``, which is why the package's
``__init__`` does not import it.
"""
import json
import os
import os.path as osp
from typing import Any, Dict, Optional

import torch
from mmengine.config import Config
from mmengine.runner import Runner

from .hooks.training_watch import TrainingWatch
from ..batch_size.auto_batch_size_hook import AutoBatchSizeHook
from ..utils.registry_scope import type_name
from ..batch_size.trial import is_out_of_memory

MiB = 2**20
DEFAULT_WORK_DIR = osp.join('work_dirs', 'benchmark_auto_batch_size')


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
                        if not (isinstance(h, dict) and type_name(h.get('type')) ==
                                'AutoBatchSizeHook')] + [search, watch]
    return Runner.from_cfg(cfg)


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
