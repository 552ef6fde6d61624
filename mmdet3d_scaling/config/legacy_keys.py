"""Config steps for mmcv 1.x keys that mmengine ignores, and the plugin's ``amp`` key.

Called from :func:`mmdet3d_scaling.config.preparation.prepare_config`:

- ``optimizer_config = dict(type='GradientCumulativeOptimizerHook', cumulative_iters=4,
  grad_clip=...)`` -> the :class:`GradientCumulativeOptimizerHook` in ``custom_hooks``
  plus ``optim_wrapper.accumulative_counts`` (and ``optim_wrapper.clip_grad``);
  ``OptimizerHook`` / ``dict(grad_clip=...)`` -> ``optim_wrapper.clip_grad``;
  ``Fp16OptimizerHook`` / ``GradientCumulativeFp16OptimizerHook`` -> the same plus AMP.
- ``fp16 = dict(loss_scale=512.)`` (mmcv 1.x) and ``amp = dict(dtype='bfloat16',
  loss_scale='dynamic')`` (plugin) -> mmengine's ``AmpOptimWrapper``.
- ``amp = dict(dtype='auto')`` (plugin) -> bfloat16 without loss scaling on a GPU with
  native bf16 (CUDA compute capability >= 8.0: Ampere and newer), else float16 with a
  small initial loss scale (:data:`AUTO_FP16_LOSS_SCALE`); the choice and its reason are
  logged once.

Every value is taken from exactly one place: two places that disagree (the legacy key,
``optim_wrapper``, the hook in ``custom_hooks``, the ``scaling`` recipe) are a
:class:`ConfigConflictError` naming both. The legacy keys are removed once translated, so
nothing is left for mmengine to ignore. Both steps are idempotent.
"""
import copy
import logging
from numbers import Real
from typing import Any, Dict, List, Optional, Tuple

from mmengine.config import Config, ConfigDict
from mmengine.logging import print_log

from ..utils.registry_scope import type_name
from .validators import ConfigConflictError, merge, positive_int

HOOK_TYPE = 'GradientCumulativeOptimizerHook'
SCHEDULER_HOOK_TYPE = 'OptimizerStepParamSchedulerHook'
# mmcv 1.x optimizer hooks: type -> (accumulates, fp16)
LEGACY_OPTIMIZER_HOOKS = {
    'OptimizerHook': (False, False),
    'Fp16OptimizerHook': (False, True),
    'GradientCumulativeOptimizerHook': (True, False),
    'GradientCumulativeFp16OptimizerHook': (True, True),
}
_LEGACY_KEYS = {'type', 'grad_clip', 'cumulative_iters', 'loss_scale',
                'detect_anomalous_params', 'distributed'}
MMCV_DEFAULT_LOSS_SCALE = 512.0  # mmcv 1.x Fp16OptimizerHook's default
AMP_DTYPES = ('float16', 'bfloat16')
AMP_AUTO = 'auto'
#: ``amp = dict(dtype='auto')`` on a GPU without native bf16: float16 with this dynamic
#: loss scaling. torch's default initial scale 2**16 suits losses of order 1; detection
#: losses start ~2**13 (BEVFusion's heatmap loss: 2.5e3-7.7e3 from scratch), so 2**16
#: overflowed fp16 gradients on every early step. 2**16 / 2**13 = 2**3; the scale then
#: doubles after every 100 overflow-free optimizer steps (torch: 2000) and halves at an
#: overflow (the step is skipped).
AUTO_FP16_LOSS_SCALE = dict(init_scale=2.**3, growth_interval=100)
#: bfloat16 has float32's exponent range: nothing to rescale, and a disabled GradScaler
#: adds no inf check (no host sync) to each optimizer step.
BF16_LOSS_SCALE = dict(enabled=False)


def _optim_wrapper(cfg: Config, why: str) -> ConfigDict:
    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, dict):
        raise ValueError(
            f'{why} needs an `optim_wrapper = dict(optimizer=dict(type=..., lr=...))` '
            f'in the config (mmengine has no `optimizer` key); got optim_wrapper='
            f'{wrapper!r}.')
    return wrapper


# --------------------------------------------------------------- accumulation
def _hook_entries(cfg: Config) -> List[dict]:
    return [h for h in cfg.get('custom_hooks') or []
            if isinstance(h, dict) and type_name(h.get('type')) == HOOK_TYPE]


def _pop_legacy_optimizer_config(cfg: Config) -> Tuple[Optional[int], Optional[dict],
                                                       Any]:
    """Remove ``optimizer_config``; return (cumulative_iters, grad_clip, loss_scale).

    ``loss_scale`` is None when the legacy hook is not an fp16 one.
    """
    legacy = cfg.pop('optimizer_config', None)
    if legacy is None:
        return None, None, None
    if not isinstance(legacy, dict):
        raise ValueError(f'optimizer_config must be a dict, got {legacy!r}.')
    kind = type_name(legacy.get('type', 'OptimizerHook'))
    if kind not in LEGACY_OPTIMIZER_HOOKS:
        raise ValueError(
            f'optimizer_config type {kind!r} has no mmengine equivalent in this plugin. '
            f'Supported: {", ".join(LEGACY_OPTIMIZER_HOOKS)}. Move its settings to '
            '`optim_wrapper` (see docs/accumulation_and_amp.md).')
    unknown = set(legacy) - _LEGACY_KEYS
    if unknown:
        raise ValueError(f'optimizer_config has keys {sorted(unknown)} that {kind} does '
                         f'not take; known keys: {sorted(_LEGACY_KEYS)}.')
    if legacy.get('detect_anomalous_params'):
        raise ValueError(
            'optimizer_config.detect_anomalous_params is not translated: use '
            "model_wrapper_cfg = dict(type='MMDistributedDataParallel', "
            'detect_anomalous_params=True) in distributed runs.')
    accumulates, fp16 = LEGACY_OPTIMIZER_HOOKS[kind]
    if 'cumulative_iters' in legacy and not accumulates:
        raise ValueError(f'optimizer_config: {kind} does not take cumulative_iters; '
                         f"use type='GradientCumulativeOptimizerHook'.")
    count = positive_int('optimizer_config.cumulative_iters',
                         legacy.get('cumulative_iters', 1)) if accumulates else None
    loss_scale = legacy.get('loss_scale', MMCV_DEFAULT_LOSS_SCALE) if fp16 else None
    if 'loss_scale' in legacy and not fp16:
        raise ValueError(f'optimizer_config: {kind} does not take loss_scale; use '
                         '`fp16 = dict(loss_scale=...)` or `amp = dict(...)`.')
    return count, legacy.get('grad_clip'), loss_scale


def _set_clip_grad(cfg: Config, clip: dict, place: str) -> None:
    wrapper = _optim_wrapper(cfg, place)
    current = wrapper.get('clip_grad')
    if current is not None:
        merge('gradient clipping', [('optim_wrapper.clip_grad', dict(current)),
                                    (place, dict(clip))])
    wrapper['clip_grad'] = dict(clip)


def translate_optimizer_config(cfg: Config,
                               scaling_accumulation: Optional[int] = None) -> Config:
    """mmcv 1.x ``optimizer_config`` and the accumulation hook -> mmengine settings.

    The accumulation count may come from ``optimizer_config.cumulative_iters``, the
    hook in ``custom_hooks``, ``optim_wrapper.accumulative_counts`` or the ``scaling``
    recipe's accumulation (``scaling_accumulation``, worked out once by
    :func:`mmdet3d_scaling.config.prepare_config`); all that are present must agree. When the legacy key or
    the hook is present, the result is one hook in ``custom_hooks`` and
    ``optim_wrapper.accumulative_counts`` set to the same value.
    """
    count, grad_clip, loss_scale = _pop_legacy_optimizer_config(cfg)
    hooks = _hook_entries(cfg)
    sources: List[Tuple[str, Any]] = []
    if count is not None:
        sources.append(('optimizer_config.cumulative_iters', count))
    for hook in hooks:
        sources.append((f'custom_hooks {HOOK_TYPE}.cumulative_iters',
                        positive_int(f'{HOOK_TYPE}.cumulative_iters',
                                     hook.get('cumulative_iters', 1))))
    wrapper = cfg.get('optim_wrapper')
    if isinstance(wrapper, dict) and 'accumulative_counts' in wrapper:
        sources.append(('optim_wrapper.accumulative_counts', positive_int(
            'optim_wrapper.accumulative_counts', wrapper['accumulative_counts'])))
    derived = scaling_accumulation if sources else None
    if derived is not None:
        sources.append(('scaling (derived accumulation)', derived))
    merge('gradient accumulation counts', sources)

    if grad_clip is not None:
        _set_clip_grad(cfg, grad_clip, 'optimizer_config.grad_clip')
    for hook in hooks:
        if hook.get('grad_clip') is not None:
            _set_clip_grad(cfg, hook.pop('grad_clip'), f'{HOOK_TYPE}.grad_clip')
    if loss_scale is not None:
        _merge_legacy_fp16(cfg, loss_scale)

    if count is None and not hooks:
        if (sources and sources[0][1] > 1 and derived is None
                and sources[0][0].startswith('optim_wrapper')):
            print_log(
                f'optim_wrapper.accumulative_counts={sources[0][1]} without '
                f"{HOOK_TYPE}: mmengine's semantics apply (parameter schedulers step "
                f"per micro-step). Add custom_hooks=[dict(type='{HOOK_TYPE}', "
                f'cumulative_iters={sources[0][1]})] for schedulers in optimizer '
                'steps.', logger='current')
        return cfg
    value = sources[0][1]
    _optim_wrapper(cfg, HOOK_TYPE)['accumulative_counts'] = value
    kept = [h for h in cfg.get('custom_hooks') or [] if h not in hooks]
    # keep the user's entry (its scope, priority); else a scoped type, which the
    # registry finds whatever the config's default_scope
    hook = dict(hooks[0]) if hooks else dict(type=f'mmdet3d.{HOOK_TYPE}')
    hook['cumulative_iters'] = value
    cfg.custom_hooks = kept + [hook]
    _use_optimizer_step_schedulers(cfg)
    return cfg


def _use_optimizer_step_schedulers(cfg: Config) -> None:
    """``default_hooks.param_scheduler``: the stock hook -> its optimizer-step twin."""
    if cfg.get('default_hooks') is None:
        cfg.default_hooks = ConfigDict()
    default_hooks = cfg.default_hooks
    current = default_hooks.get('param_scheduler', dict(type='ParamSchedulerHook'))
    if isinstance(current, dict) and type_name(
            current.get('type')) == 'ParamSchedulerHook':
        default_hooks['param_scheduler'] = dict(current,
                                                type=f'mmdet3d.{SCHEDULER_HOOK_TYPE}')


# ------------------------------------------------------------------------ AMP
def _check_loss_scale(value: Any, where: str) -> Any:
    if value == 'dynamic' or isinstance(value, dict):
        return value
    if isinstance(value, Real) and not isinstance(value, bool) and value > 0:
        return float(value)  # AmpOptimWrapper accepts float, not int
    raise ValueError(f"{where} must be 'dynamic', a positive number or a dict of "
                     f'GradScaler arguments, got {value!r}.')


def _merge_legacy_fp16(cfg: Config, loss_scale: Any) -> None:
    """An fp16 optimizer_config hook's loss_scale becomes (or must equal) ``fp16``."""
    fp16 = cfg.get('fp16')
    if fp16 is None:
        cfg.fp16 = dict(loss_scale=loss_scale)
        return
    legacy = _check_loss_scale(loss_scale, 'optimizer_config.loss_scale')
    current = _check_loss_scale(fp16.get('loss_scale', MMCV_DEFAULT_LOSS_SCALE),
                                'fp16.loss_scale')
    merge('fp16 loss_scale', [('optimizer_config.loss_scale', legacy),
                              ('fp16.loss_scale', current)])


def cuda_bf16_supported() -> Tuple[bool, str]:
    """(whether this process's CUDA device has native bf16, a reason to log).

    ``torch.cuda.is_bf16_supported()`` alone says True on pre-Ampere GPUs (it counts
    emulation); native means compute capability >= 8.0 (ROCm: every supported GPU).
    """
    import torch
    if not torch.cuda.is_available():
        return False, 'no CUDA device'
    index = torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    if torch.version.hip:
        return True, f'{name} (ROCm) supports bf16'
    major, minor = torch.cuda.get_device_capability(index)
    native = torch.cuda.is_bf16_supported(including_emulation=False)
    verb = 'has' if native else 'lacks'
    return native, (f'{name}, compute capability {major}.{minor}, {verb} native bf16 '
                    '(>= 8.0: Ampere and newer)')


def resolve_auto_amp(bf16_supported: bool, loss_scale: Any = None) -> Dict[str, Any]:
    """``amp = dict(dtype='auto', loss_scale=...)`` for a device -> dtype and loss_scale.

    Args:
        bf16_supported (bool): whether the GPU computes in bf16 natively.
        loss_scale (optional): the loss scaling for the fp16 case ('dynamic', a number or
            a dict of GradScaler arguments). Defaults to None:
            :data:`AUTO_FP16_LOSS_SCALE`. Unused (scaling off) when bf16 is chosen.
    """
    if bf16_supported:
        return dict(dtype='bfloat16', loss_scale=dict(BF16_LOSS_SCALE))
    if loss_scale is None:
        loss_scale = dict(AUTO_FP16_LOSS_SCALE)
    return dict(dtype='float16', loss_scale=_check_loss_scale(loss_scale,
                                                              'amp.loss_scale'))


def _auto_amp(amp: dict) -> Dict[str, Any]:
    """Resolve ``dtype='auto'`` on this machine and log the choice with its reason."""
    from ..patches.cpu.amp_cpu import accelerator_available
    supported, reason = cuda_bf16_supported()
    wanted = resolve_auto_amp(supported, amp.get('loss_scale'))
    if supported:
        note = 'bfloat16 autocast, loss scaling off (bf16 has fp32\'s exponent range)'
        if amp.get('loss_scale') is not None:
            note += f'; amp.loss_scale={amp["loss_scale"]!r} applies to fp16 only'
    else:
        note = f'float16 autocast with loss_scale={wanted["loss_scale"]!r}'
        if not accelerator_available():
            note += (' (no GPU here: AmpOptimWrapper then runs bf16 autocast on the CPU '
                     'without loss scaling, see patches/cpu/amp_cpu.py)')
    print_log(f"amp dtype='auto': {reason}, so {note}. Set amp.dtype='float16' or "
              "'bfloat16' to choose.", logger='current', level=logging.INFO)
    return wanted


def _requested_amp(cfg: Config) -> Optional[Tuple[str, Dict[str, Any]]]:
    """(source, dict(dtype=..., loss_scale=...)) from ``fp16`` / ``amp``; pops both."""
    fp16, amp = cfg.pop('fp16', None), cfg.pop('amp', None)
    requests = []
    if fp16 is not None:
        if not isinstance(fp16, dict) or set(fp16) - {'loss_scale'}:
            raise ValueError(f'fp16 must be dict(loss_scale=...) (mmcv 1.x), got '
                             f"{fp16!r}; for bfloat16 use amp = dict(dtype='bfloat16').")
        requests.append(('fp16', dict(dtype='float16', loss_scale=_check_loss_scale(
            fp16.get('loss_scale', MMCV_DEFAULT_LOSS_SCALE), 'fp16.loss_scale'))))
    if amp is not None and amp is not False:
        amp = {} if amp is True else amp
        if not isinstance(amp, dict) or set(amp) - {'dtype', 'loss_scale'}:
            raise ValueError(f"amp must be True or dict(dtype='float16'|'bfloat16'|"
                             f"'auto', loss_scale=...), got {amp!r}.")
        dtype = amp.get('dtype', 'float16')
        if dtype == AMP_AUTO:
            requests.append(('amp', _auto_amp(amp)))
        elif dtype not in AMP_DTYPES:
            raise ValueError(f'amp.dtype must be one of {AMP_DTYPES + (AMP_AUTO,)}, got '
                             f'{dtype!r}.')
        else:
            # bf16 needs no scaling; an enabled GradScaler reads found_inf on the host
            # at every optimizer step (a full GPU wait)
            default = dict(BF16_LOSS_SCALE) if dtype == 'bfloat16' else 'dynamic'
            requests.append(('amp', dict(dtype=dtype, loss_scale=_check_loss_scale(
                amp.get('loss_scale', default), 'amp.loss_scale'))))
    if not requests:
        return None
    merge('mixed-precision settings', requests)
    return requests[0]


def translate_amp_config(cfg: Config) -> Config:
    """``fp16`` (mmcv 1.x) / ``amp`` (plugin) -> ``optim_wrapper`` ``AmpOptimWrapper``.

    ``fp16 = dict(loss_scale=512.)`` or ``dict(loss_scale='dynamic')`` means float16
    autocast with that loss scaling (mmcv 1.x default 512.); ``amp = dict(
    dtype='bfloat16')`` picks bfloat16 (``loss_scale`` defaults to off:
    ``dict(enabled=False)``; float16's to 'dynamic');
    ``amp = dict(dtype='auto')`` picks by the GPU (:func:`resolve_auto_amp`).
    An ``optim_wrapper`` that is already an ``AmpOptimWrapper`` must not disagree.
    """
    request = _requested_amp(cfg)
    if request is None:
        return cfg
    source, wanted = request
    wrapper = _optim_wrapper(cfg, source)
    kind = type_name(wrapper.get('type', 'OptimWrapper'))
    if kind not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise ConfigConflictError(
            f'`{source}` asks for AmpOptimWrapper but optim_wrapper.type = {kind!r}. '
            f'Remove `{source}` or use an OptimWrapper/AmpOptimWrapper.')
    if kind == 'AmpOptimWrapper':
        for key, value in wanted.items():
            if key in wrapper and wrapper[key] is not None:
                current = (_check_loss_scale(wrapper[key], f'optim_wrapper.{key}')
                           if key == 'loss_scale' else wrapper[key])
                merge(f'AMP {key}', [(f'optim_wrapper.{key}', current),
                                     (f'{source}.{key}', value)])
    wrapper['type'] = 'AmpOptimWrapper'
    for key, value in wanted.items():
        wrapper[key] = copy.deepcopy(value)
    return cfg
