"""One recipe for any GPU count: total batch -> per-GPU batch x GPUs x accumulation.

A config states what it wants once::

    scaling = dict(
        total_batch_size=32,        # samples per optimizer step, all GPUs together
        base_batch_size=32,         # total batch the LR in the config was tuned for
        lr_scaling='linear',        # 'linear' | 'sqrt' | 'none'
        per_gpu_batch_size=None,    # None: as large as allowed (see below)
        max_per_gpu_batch_size=None,  # None: the config's train_dataloader.batch_size
        bn_momentum='per_step',     # 'per_step' | 'per_forward' (BatchNorm statistics)
        memory_budget=None,         # '24GiB': fastest batch / checkpointing that fits
    )

and :func:`apply_scaling_recipe` (a :func:`prepare_config` step) derives the per-GPU
batch and the gradient accumulation from the world size, scales the LR by the real
effective batch (mmengine's ``auto_scale_lr`` ignores accumulation), and converts
iteration counts so they keep meaning *optimizer steps*. Conventions (documented in
``docs/scaling_guide.md``):

- iteration counts in the config (``train_cfg.max_iters``, ``val_interval``,
  ``val_begin``, ``dynamic_intervals``, an iteration-based checkpoint ``interval`` and
  ``save_begin`` (so that checkpoints land on window ends) and,
  when parameter schedulers step once per loop iteration as in stock mmengine, their
  ``begin``/``end``/``T_max``/...) count optimizer steps; the loop counts micro-batches,
  so they are multiplied by the accumulation;
- absolute LR values of LR schedulers (``eta_min``, ``eta_max``, ``min_value``) are
  scaled with the LR; relative ones (``eta_min_ratio``, factors, ``gamma``) are not;
  momentum and weight-decay schedulers are left alone;
- BatchNorm momentum is read per optimizer step (``bn_momentum='per_step'``): the
  ScalingRunner converts it per forward pass on the built model
  (:mod:`mmdet3d_scaling.engine.batchnorm_momentum`); ``'per_forward'`` keeps it.
"""
from typing import Optional

from mmengine.config import Config
from mmengine.logging import print_log

from .plan_hooks import add_plan_hooks
from .plan_writer import (RECORD_KEY, apply_plan, get_path, lr_targets, original_value,
                          recorded_plan, scale_value, set_path)
from .scaling_plan import ScalingPlan, make_plan, plan_hint

SCALING_KEYS = ('total_batch_size', 'base_batch_size', 'lr_scaling',
                'per_gpu_batch_size', 'max_per_gpu_batch_size', 'bn_momentum',
                'memory_budget')
BN_MOMENTUM_MODES = ('per_step', 'per_forward')


def _user_accumulation(cfg: Config) -> int:
    counts = original_value(cfg, ('optim_wrapper', 'accumulative_counts'), 1)
    legacy = (cfg.get('optimizer_config') or {}).get('cumulative_iters', 1)
    return max(counts or 1, legacy or 1)


def _check_scaling_keys(scaling: dict) -> None:
    unknown = sorted(set(scaling) - set(SCALING_KEYS))
    if unknown:
        raise ValueError(f'unknown key(s) in scaling: {", ".join(unknown)}; known keys: '
                         f'{", ".join(SCALING_KEYS)}')
    if 'total_batch_size' not in scaling:
        raise ValueError('scaling needs total_batch_size (samples per optimizer step, '
                         'all GPUs together).')
    mode = scaling.get('bn_momentum', BN_MOMENTUM_MODES[0])
    if mode not in BN_MOMENTUM_MODES:
        raise ValueError(
            f'scaling.bn_momentum={mode!r} is not one of {", ".join(BN_MOMENTUM_MODES)}: '
            "'per_step' reads the BatchNorm momentum per optimizer step (converted for "
            "the accumulation), 'per_forward' keeps it per forward pass.")


def base_batch_size(cfg: Config) -> Optional[int]:
    """The total batch the config's LR was tuned for: ``scaling.base_batch_size``, else
    ``auto_scale_lr.base_batch_size``; None: the total batch (LR unchanged)."""
    auto = cfg.get('auto_scale_lr') or {}
    return (cfg.get('scaling') or {}).get('base_batch_size', auto.get('base_batch_size'))


def plan_from_config(cfg: Config, world_size: int) -> ScalingPlan:
    """The plan ``cfg.scaling`` asks for on ``world_size`` GPUs."""
    scaling = dict(cfg.scaling)
    _check_scaling_keys(scaling)
    base = base_batch_size(cfg)
    cap = scaling.get('max_per_gpu_batch_size')
    if cap is None and scaling.get('per_gpu_batch_size') is None:
        cap = original_value(cfg, ('train_dataloader', 'batch_size'))
    return make_plan(scaling['total_batch_size'], world_size,
                     per_gpu_batch=scaling.get('per_gpu_batch_size'),
                     max_per_gpu_batch=cap, base_batch_size=base,
                     lr_scaling=scaling.get('lr_scaling', 'linear'))


def _fold_auto_scale_lr(cfg: Config, world_size: int) -> None:
    """``auto_scale_lr.enable`` without ``scaling``: scale the LR by the real effective
    batch (per-GPU batch x GPUs x accumulation) instead of mmengine's rule, which
    leaves the accumulation out."""
    auto = cfg.get('auto_scale_lr') or {}
    if not auto.get('enable', False):
        return
    if 'base_batch_size' not in auto:
        raise ValueError('auto_scale_lr.enable=True needs auto_scale_lr.base_batch_size '
                         '(the total batch size the LR was tuned for).')
    per_gpu = cfg.train_dataloader.batch_size
    acc = _user_accumulation(cfg)
    plan = make_plan(per_gpu * world_size * acc, world_size, per_gpu_batch=per_gpu,
                     base_batch_size=auto['base_batch_size'], lr_scaling='linear')
    for path in lr_targets(cfg):
        scaled = scale_value(get_path(cfg, path), plan.lr_scale, as_int=False)
        set_path(cfg, path, scaled)
    cfg.auto_scale_lr.enable = False
    print_log(f'auto_scale_lr: effective batch {plan.total_batch} = {world_size} GPUs x '
              f'{per_gpu} x {acc} accumulation, LR tuned for {plan.base_batch}: LR '
              f'x {plan.lr_scale:.6g} (mmengine\'s own rule, which ignores accumulation, '
              'is switched off).', logger='current')


def planned(cfg: Config, world_size: int) -> Optional[ScalingPlan]:
    """The plan the config's ``scaling`` asks for on ``world_size`` GPUs (None without
    ``scaling``)."""
    if not cfg.get('scaling'):
        return None
    return plan_from_config(cfg, world_size)


def accumulation_in_force(cfg: Config, plan: Optional[ScalingPlan]) -> Optional[int]:
    """The accumulation the earlier config steps must agree with: the recorded plan's in
    a config prepared before (a run-time replan records its own), else ``plan``'s."""
    record = cfg.get(RECORD_KEY)
    if isinstance(record, dict) and isinstance(record.get('plan'), dict):
        return record['plan'].get('accumulation')
    return plan.accumulation if plan is not None else None


def apply_scaling_recipe(cfg: Config, world_size: int,
                         plan: Optional[ScalingPlan] = None) -> Config:
    """``prepare_config`` step: turn ``cfg.scaling`` into batch/accumulation/LR settings.

    Without ``scaling``: only ``auto_scale_lr`` is corrected for accumulation.
    ``plan``: :func:`planned` for this config when the caller has it already.
    """
    if not cfg.get('scaling'):
        _fold_auto_scale_lr(cfg, world_size)
        return cfg
    if (cfg.get('auto_scale_lr') or {}).get('enable', False):
        raise ValueError(
            'auto_scale_lr.enable=True and scaling are both set: scaling already scales '
            'the LR by the real effective batch (scaling.lr_scaling / base_batch_size). '
            'Remove auto_scale_lr.enable (or --auto-scale-lr) or remove scaling.')
    previous = recorded_plan(cfg)
    user_acc = _user_accumulation(cfg)
    if previous is None and user_acc != 1:
        raise ValueError(
            f'scaling derives the gradient accumulation from the world size, but the '
            f'config also sets it to {user_acc} (optim_wrapper.accumulative_counts or '
            'optimizer_config.cumulative_iters). Remove that setting and state the '
            'effective batch with scaling.total_batch_size.')
    plan = plan or plan_from_config(cfg, world_size)
    apply_plan(cfg, plan)
    cap = cfg.scaling.get('max_per_gpu_batch_size') or original_value(
        cfg, ('train_dataloader', 'batch_size'))
    hint = plan_hint(plan, None if cfg.scaling.get('per_gpu_batch_size') else cap)
    if hint:
        print_log(f'scaling: {hint}', logger='current')
    add_plan_hooks(cfg)
    return cfg
