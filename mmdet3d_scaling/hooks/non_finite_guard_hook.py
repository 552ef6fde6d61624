"""NonFiniteGuardHook: stop a run at the first non-finite loss or gradient norm.

Without it a NaN in the data (or a diverging LR) trains on with ``loss: nan`` and writes
checkpoints full of NaN with exit code 0. The checks reuse values already on the host:
mmengine's ``RuntimeInfoHook`` (priority ``VERY_HIGH``) turns every logged loss into a
Python float each iteration, and an ``OptimWrapper`` with ``clip_grad`` of type ``norm``
logs the gradient norm as a float at each optimizer step. Only a run without norm
clipping needs one extra reduction (are all weights finite after the step?) and one
read of its result per optimizer step, at the end of an iteration whose loss was
already read (the GPU has finished the step by then). With ``AsyncRuntimeInfoHook``
(``async_logging=True``) the values reach the host up to one iteration late: the guard
checks each iteration's values as they arrive, names the iteration they came from, and
checks them all before any checkpoint is saved.
"""
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.optim import OptimWrapper

from mmdet3d.registry import HOOKS

from ..monitoring.deferred_scalars import DRAINED_INFO
from ..registry import register
from .optimizer_step_param_scheduler_hook import optimizer_stepped

DATA_BATCH = Optional[Union[dict, tuple, list]]
SAMPLE_KEYS = ('sample_idx', 'lidar_path', 'img_path')
_MAX_LISTED_SAMPLES = 16


class NonFiniteError(RuntimeError):
    """A loss or gradient norm was NaN or infinite (raised by NonFiniteGuardHook)."""


def batch_samples(data_batch: Any) -> List[str]:
    """One line per sample of a collated mmdet3d batch: its index and files.

    Reads ``sample_idx`` / ``lidar_path`` / ``img_path`` from each data sample's
    metainfo; a batch without data samples gives an empty list.
    """
    samples = data_batch.get('data_samples') if isinstance(data_batch, dict) else None
    if not isinstance(samples, (list, tuple)):
        return []
    lines = []
    for sample in samples:
        meta = getattr(sample, 'metainfo', None) or {}
        parts = [f'{key}={meta[key]!r}' for key in SAMPLE_KEYS if meta.get(key) is not None]
        lines.append(', '.join(parts) or '(no sample_idx / lidar_path / img_path in '
                                         'its metainfo)')
    return lines


def _not_finite(value: float) -> bool:
    return value != value or value in (float('inf'), float('-inf'))


@register(HOOKS)
class NonFiniteGuardHook(Hook):
    """Fail the run at the first iteration with a non-finite loss or gradient norm.

    After every training iteration it checks, on every rank:

    - **losses**: each value the model returned (``loss`` and its parts), as mmengine's
      ``RuntimeInfoHook`` already put them on the host;
    - **gradient norm**: at each optimizer step, the norm logged by norm clipping
      (``optim_wrapper.clip_grad=dict(max_norm=...)``); without norm clipping, whether
      all weights are still finite after the step (one reduction and one host read per
      optimizer step; ``check_weights``).

    A step that an ``AmpOptimWrapper``'s loss scaler skipped (inf/nan gradients under a
    too-large loss scale: the scaler lowers the scale and the weights do not change) is
    not an error. A non-finite *loss* is one also under AMP: loss scaling acts on
    gradients and never makes a loss finite again.

    On a failure it raises :class:`NonFiniteError` naming the iteration, the epoch, the
    rank, the non-finite values and the samples of the batch (``sample_idx``,
    ``lidar_path``, ``img_path`` from the data samples' metainfo), and the last
    checkpoint, which it leaves untouched: the priority ``HIGH`` runs it before
    ``CheckpointHook`` (``VERY_LOW``), ``ParamSchedulerHook`` (``LOW``), ``LoggerHook``
    and any EMA hook of the same iteration, so nothing is saved after the bad step.
    ``tools/train.py`` then ends with a non-zero exit code. In distributed runs a
    non-finite loss on one rank makes the averaged gradients non-finite on all ranks,
    so every rank stops at the same iteration; the rank that read the bad sample names
    it.

    Args:
        check_loss (bool): check the logged loss values. Defaults to True.
        check_grad_norm (bool): check the gradient norm of norm clipping at each
            optimizer step. Defaults to True.
        check_weights (bool | str): after each optimizer step, check that every weight
            is finite: ``'auto'`` only when no norm clipping logs a gradient norm,
            True always, False never. Defaults to ``'auto'``.
    """

    priority = 'HIGH'  # after RuntimeInfoHook (VERY_HIGH), before CheckpointHook

    def __init__(self, check_loss: bool = True, check_grad_norm: bool = True,
                 check_weights: Union[bool, str] = 'auto') -> None:
        for name, value in (('check_loss', check_loss),
                            ('check_grad_norm', check_grad_norm)):
            if not isinstance(value, bool):
                raise TypeError(f'NonFiniteGuardHook: {name} must be True or False, got '
                                f'{value!r}.')
        if check_weights not in (True, False, 'auto'):
            raise ValueError(f"NonFiniteGuardHook: check_weights must be True, False or "
                             f"'auto', got {check_weights!r}.")
        self.check_loss = check_loss
        self.check_grad_norm = check_grad_norm
        self.check_weights = check_weights
        self._steps_taken = 0
        self._step_handle = None
        # async log reads: per iteration not yet read, (stepped, samples of its batch)
        self._waiting: Dict[int, Tuple[bool, List[str]]] = {}
        self._checked_serial = 0

    # ------------------------------------------------------------------ set-up
    def before_train(self, runner) -> None:
        """Count the optimizer steps taken (a skipped AMP step takes none)."""
        wrapper = runner.optim_wrapper
        if isinstance(wrapper, OptimWrapper) and self._step_handle is None:
            self._step_handle = wrapper.optimizer.register_step_post_hook(self._on_step)

    def after_train(self, runner) -> None:
        """Remove the optimizer step hook."""
        if self._step_handle is not None:
            self._step_handle.remove()
            self._step_handle = None

    def _on_step(self, optimizer, args, kwargs) -> None:
        self._steps_taken += 1

    @staticmethod
    def _clips_by_norm(wrapper: Any) -> bool:
        return (isinstance(wrapper, OptimWrapper) and bool(
            getattr(wrapper, 'clip_grad_kwargs', None))
            and getattr(wrapper, 'grad_name', None) == 'grad_norm')

    # ------------------------------------------------------------------ checks
    def before_train_iter(self, runner, batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        """Count this iteration's optimizer steps only (not e.g. batch size trials)."""
        self._steps_taken = 0

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Raise :class:`NonFiniteError` if this iteration produced a non-finite value."""
        taken = self._steps_taken
        stepped = optimizer_stepped(runner)
        skipped_by_scaler = stepped and taken == 0 and self._scaler_enabled(runner)
        checked_step = stepped and not skipped_by_scaler
        if runner.message_hub.get_info(DRAINED_INFO) is not None:  # async log reads
            self._waiting[runner.iter] = (checked_step, batch_samples(data_batch))
            self._check_arrived(runner)
            if checked_step and self._checks_weights(runner.optim_wrapper) and \
                    not self._weights_finite(runner.model):
                self._raise(runner, {'weights after the optimizer step': float('nan')},
                            batch_samples(data_batch), runner.iter)
            return
        bad: Dict[str, float] = {}
        if self.check_loss:
            bad.update(self._bad_losses(runner, outputs))
        if checked_step:
            bad.update(self._bad_gradients(runner))
        if bad:
            self._raise(runner, bad, batch_samples(data_batch), runner.iter)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """With async log reads: check what arrived before the save (every value:
        ``AsyncRuntimeInfoHook`` hands everything over before a save)."""
        if runner.message_hub.get_info(DRAINED_INFO) is not None:
            self._check_arrived(runner)

    def _check_arrived(self, runner) -> None:
        """Check the iterations whose values ``AsyncRuntimeInfoHook`` handed over."""
        serial, arrived = runner.message_hub.get_info(DRAINED_INFO)
        if serial == self._checked_serial:
            return
        self._checked_serial = serial
        grad_key = f'train/{getattr(runner.optim_wrapper, "grad_name", "grad_norm")}'
        by_norm = self._clips_by_norm(runner.optim_wrapper)
        for iteration, values in arrived:
            stepped, samples = self._waiting.pop(iteration, (True, []))
            bad = {}
            for key, value in values.items():
                is_norm = key == grad_key
                wanted = (self.check_grad_norm and by_norm and stepped) if is_norm \
                    else self.check_loss
                if wanted and _not_finite(value):
                    bad[key[len('train/'):]] = value
            if bad:
                self._raise(runner, bad, samples, iteration)
        if arrived:  # iterations sealed without values never arrive: forget them
            last = arrived[-1][0]
            for iteration in [i for i in self._waiting if i <= last]:
                del self._waiting[iteration]

    def _checks_weights(self, wrapper: Any) -> bool:
        return self.check_weights is True or (self.check_weights == 'auto'
                                              and not self._clips_by_norm(wrapper))

    def _raise(self, runner, bad: Dict[str, float], samples: List[str],
               iteration: int) -> None:
        raise NonFiniteError(self._message(runner, bad, samples, iteration))

    @staticmethod
    def _scaler_enabled(runner) -> bool:
        scaler = getattr(runner.optim_wrapper, 'loss_scaler', None)
        return isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()

    @staticmethod
    def _bad_losses(runner, outputs: Optional[dict]) -> Dict[str, float]:
        bad = {}
        for key in outputs or {}:
            buffer = runner.message_hub.log_scalars.get(f'train/{key}')
            if buffer is None:  # not logged (RuntimeInfoHook missing): read it
                value = outputs[key]
                value = float(value.detach()) if torch.is_tensor(value) else float(value)
            else:
                value = buffer.current()
            if _not_finite(value):
                bad[key] = value
        return bad

    def _bad_gradients(self, runner) -> Dict[str, float]:
        wrapper = runner.optim_wrapper
        by_norm = self._clips_by_norm(wrapper)
        bad = {}
        if by_norm and self.check_grad_norm:
            buffer = runner.message_hub.log_scalars.get('train/grad_norm')
            if buffer is not None and _not_finite(buffer.current()):
                bad['grad_norm'] = buffer.current()
        if self._checks_weights(wrapper):
            if not self._weights_finite(runner.model):
                bad['weights after the optimizer step'] = float('nan')
        return bad

    @staticmethod
    def _weights_finite(model: torch.nn.Module) -> bool:
        params = [p.detach() for p in model.parameters() if p.requires_grad]
        if not params:
            return True
        # one fused norm per device, one host read: NaN / inf anywhere makes it so
        sums = [torch.stack(torch._foreach_norm(group)).sum().float().cpu()
                for group in _by_device(params)]
        return bool(torch.isfinite(torch.stack(sums)).all())

    # ----------------------------------------------------------------- message
    @staticmethod
    def _message(runner, bad: Dict[str, float], samples: List[str],
                 iteration: int) -> str:
        values = ', '.join(f'{k}={v}' for k, v in bad.items())
        listed = samples[:_MAX_LISTED_SAMPLES]
        if len(samples) > len(listed):
            listed.append(f'... and {len(samples) - len(listed)} more')
        sample_text = ('\n  samples of this batch on this rank:\n    '
                       + '\n    '.join(listed)) if listed else \
            '\n  (the batch has no data_samples metainfo naming its files)'
        stop = (f'at iteration {runner.iter + 1} (async_logging reads values up to one '
                f'iteration late), before a checkpoint was saved after it'
                if iteration != runner.iter else
                "before this iteration's hooks saved anything")
        last = runner.message_hub.get_info('last_ckpt')
        last_text = (f'the last checkpoint, {osp.basename(last)!r} in '
                     f'{osp.dirname(last)!r}, is untouched' if last else
                     'no checkpoint was saved before it')
        return (
            f'NonFiniteGuardHook: non-finite value at iteration {iteration + 1} '
            f'(epoch {runner.epoch + 1}) on rank {runner.rank}: {values}.'
            f'{sample_text}\n  Training stopped {stop}: {last_text}. Check these files for NaN / inf values (add '
            "dict(type='CheckFiniteInputs') after the loading transforms of the train "
            'pipeline to name the file and the values), or lower the learning rate / '
            'clip gradients (optim_wrapper.clip_grad=dict(max_norm=..., norm_type=2)) '
            'if the data is clean.')


def _by_device(params: Sequence[torch.Tensor]) -> List[List[torch.Tensor]]:
    groups: Dict[Any, List[torch.Tensor]] = {}
    for p in params:
        groups.setdefault((p.device, p.dtype), []).append(p)
    return list(groups.values())
