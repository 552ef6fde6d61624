"""HangDoctorHook: a rank that hangs or is lost stops the job within minutes, named.

Added by ``distributed = dict(hang_timeout_s=...)`` (default 300 s whenever a config has
a ``distributed`` key and runs distributed; ``None`` turns it off). The hook tells the
rank's :class:`~mmdet3d_scaling.engine.hang_doctor.HangDoctor` which phase the rank is in
(attribute stores only: no host sync, no collective); the doctor's watchdog thread does
the rest (engine/hang_doctor.py, docs/failure_modes.md "Hangs and lost nodes").
"""
from typing import Any, Optional

from mmengine.dist import get_rank, get_world_size, is_distributed
from mmengine.hooks import Hook

from mmdet3d.registry import HOOKS

from ..engine.hang_doctor import HangDoctor
from ..registry import register


@register(HOOKS)
class HangDoctorHook(Hook):
    """Watch this rank's progress and its peers' heartbeats; stop a hung job, named.

    Stall detection starts at the first training, validation or test iteration (start-up
    work such as resuming or an auto batch size search is not timed); rank 0's metric
    computation after the last validation / test batch is not timed either (the other
    ranks wait for it in a collective; ``distributed.timeout_minutes`` bounds it). A
    peer without heartbeat and an unreachable store are detected in every phase.
    Single-process runs: the hook does nothing.

    Args:
        timeout_s (float): seconds without progress on a rank (or without a peer's
            heartbeat) after which every rank logs its stack and the job exits with
            code 75. Defaults to 300.
        interval_s (float, optional): seconds between two heartbeats of a rank; also
            the delay with which the other ranks learn of the stop. Defaults to
            ``min(10, timeout_s / 4)``.
        collective_timeout_s (float, optional): the collective timeout, seconds, named
            in the report; set by the ``distributed`` config step from
            ``env_cfg.dist_cfg.timeout``. Defaults to None (not named).
    """

    priority = 'VERY_HIGH'  # its before_* marks come before other hooks' work

    def __init__(self, timeout_s: float = 300.0, interval_s: Optional[float] = None,
                 collective_timeout_s: Optional[float] = None):
        for name, value in (('timeout_s', timeout_s), ('interval_s', interval_s)):
            if value is not None and (isinstance(value, bool)
                                      or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f'HangDoctorHook {name} must be a positive number of '
                                 f'seconds, got {value!r}')
        self.timeout_s = float(timeout_s)
        self.interval_s = float(interval_s) if interval_s is not None \
            else min(10.0, self.timeout_s / 4)
        self.collective_timeout_s = collective_timeout_s
        self.doctor: Optional[HangDoctor] = None

    # ------------------------------------------------------------------ life cycle
    def before_run(self, runner) -> None:
        """Start the watchdog (distributed runs only)."""
        if not is_distributed() or self.doctor is not None:
            return
        from torch.distributed.distributed_c10d import _get_default_store
        self.doctor = HangDoctor(self.timeout_s, self.interval_s, get_rank(),
                                 get_world_size(), _get_default_store(), runner.logger,
                                 collective_timeout_s=self.collective_timeout_s)
        self.doctor.mark('start-up (weights, resume, before_train hooks)', runner.iter,
                         exempt=True)
        self.doctor.start()
        # the last before_train_iter (after every other hook's) marks the step itself
        if not any(isinstance(h, _TrainStepMark) and h.owner is self for h in runner.hooks):
            runner.register_hook(_TrainStepMark(self), priority='LOWEST')
        runner.logger.info(
            f'hang doctor: on; a rank without progress (or a peer without heartbeat) for '
            f'{self.timeout_s:g} s stops the job with every rank\'s stack '
            f'(distributed.hang_timeout_s; None turns it off); heartbeat every '
            f'{self.interval_s:g} s.')

    def after_run(self, runner) -> None:
        """Stop the watchdog (before the process group goes)."""
        self.stop()

    def stop(self) -> None:
        """Stop the watchdog thread, if any."""
        if self.doctor is not None:
            self.doctor.stop()
            self.doctor = None

    def _mark(self, phase: str, iteration: int, exempt: bool = False) -> None:
        if self.doctor is not None:
            self.doctor.mark(phase, iteration, exempt)

    # ------------------------------------------------------------------ training
    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        self._mark(f'train iteration {runner.iter + 1}: before_train_iter hooks',
                   runner.iter + 1)

    def mark_train_step(self, runner) -> None:
        """Called by :class:`_TrainStepMark` right before the training step."""
        self._mark(f'train iteration {runner.iter + 1}: train_step (forward, backward, '
                   'optimizer step)', runner.iter + 1)

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        self._mark(f'after train iteration {runner.iter + 1}: hooks (logging, '
                   'checkpoint), then loading the next batch', runner.iter + 1)

    def before_train_epoch(self, runner) -> None:
        self._mark(f'train epoch {runner.epoch + 1}: loading the first batch',
                   runner.iter)

    def after_train_epoch(self, runner) -> None:
        self._mark(f'after train epoch {runner.epoch}: hooks (checkpoint, validation)',
                   runner.iter)

    # ------------------------------------------------------------------ evaluation
    def _eval_iter(self, runner, mode: str, batch_idx: int, after: bool) -> None:
        loader = runner.val_dataloader if mode == 'val' else runner.test_dataloader
        last = after and batch_idx == len(loader) - 1
        if last:
            phase = f'{mode}: computing the metric (rank 0; the others wait)'
        else:
            phase = f"{mode} batch {batch_idx + 1}/{len(loader)}: " + \
                ('after the batch' if after else f'{mode}_step')
        self._mark(phase, runner.iter, exempt=last)

    def before_val_epoch(self, runner) -> None:
        self._mark('validation: loading the first batch', runner.iter)

    def before_val_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        self._eval_iter(runner, 'val', batch_idx, after=False)

    def after_val_iter(self, runner, batch_idx: int, data_batch: Any = None,
                       outputs: Any = None) -> None:
        self._eval_iter(runner, 'val', batch_idx, after=True)

    def after_val_epoch(self, runner, metrics: Any = None) -> None:
        self._mark('after validation: hooks', runner.iter)

    def before_test_epoch(self, runner) -> None:
        self._mark('test: loading the first batch', runner.iter)

    def before_test_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        self._eval_iter(runner, 'test', batch_idx, after=False)

    def after_test_iter(self, runner, batch_idx: int, data_batch: Any = None,
                        outputs: Any = None) -> None:
        self._eval_iter(runner, 'test', batch_idx, after=True)

    def after_test_epoch(self, runner, metrics: Any = None) -> None:
        self._mark('after test: hooks', runner.iter)


class _TrainStepMark(Hook):
    """Registered by HangDoctorHook after every other hook: its ``before_train_iter``
    runs last, so the phase says ``train_step`` only once the step began (a rank stuck
    in another hook's ``before_train_iter`` is named as such)."""

    priority = 'LOWEST'

    def __init__(self, owner: HangDoctorHook) -> None:
        self.owner = owner

    def before_train_iter(self, runner, batch_idx: int, data_batch: Any = None) -> None:
        self.owner.mark_train_step(runner)
