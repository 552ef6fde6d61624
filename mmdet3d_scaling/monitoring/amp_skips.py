"""Optimizer steps that a GradScaler skipped (inf/nan gradients), counted without a sync.

GradScaler decides on the host whether to call ``optimizer.step()`` (its own
``found_inf`` sync), so a step post-hook on the optimizer sees exactly the steps taken;
the optim wrapper's ``should_update()`` after each iteration says which iterations asked
for one. Skipped = asked - taken, for dynamic and static loss scales alike. Only
:meth:`AmpSkips.figures` reads the GPU (the scale, once per report).
"""
from typing import Any, Dict, Optional, Tuple

import torch
from mmengine.optim import OptimWrapper, OptimWrapperDict


def loss_scaler_of(wrapper: Any) -> Tuple[Optional[Any], str]:
    """(the wrapper's enabled GradScaler, '') or (None, the reason there is none)."""
    if isinstance(wrapper, OptimWrapperDict) or not isinstance(wrapper, OptimWrapper):
        return None, f'optim_wrapper is a {type(wrapper).__name__}, not one ' \
                     'AmpOptimWrapper'
    scaler = getattr(wrapper, 'loss_scaler', None)
    if scaler is None:
        return None, 'no AmpOptimWrapper (no loss scaling)'
    if not isinstance(scaler, torch.amp.GradScaler) or not scaler.is_enabled():
        return None, ('the AmpOptimWrapper\'s loss scaling is off (bf16, or a CPU '
                      'run), so no step is ever skipped')
    return scaler, ''


class AmpSkips:
    """Counts the optimizer steps asked for and taken under ``wrapper``'s GradScaler.

    Call :meth:`after_iter` after every training iteration and :meth:`close` at the end
    (it removes the step hook from the optimizer).

    Args:
        wrapper: an optim wrapper with an enabled GradScaler as ``loss_scaler``
            (:func:`loss_scaler_of` says whether it has one).
    """

    def __init__(self, wrapper: OptimWrapper) -> None:
        self.scaler = wrapper.loss_scaler
        self.asked = 0
        self.taken = 0
        self._reported = 0
        self._asked_reported = 0
        self._handle = wrapper.optimizer.register_step_post_hook(self._on_step)

    def _on_step(self, optimizer, args, kwargs) -> None:
        self.taken += 1

    def after_iter(self, stepped: bool) -> None:
        """Count an iteration; ``stepped``: it ended an accumulation window, i.e. asked
        for an optimizer step."""
        if stepped:
            self.asked += 1

    @property
    def skipped(self) -> int:
        """Optimizer steps skipped since counting began."""
        return self.asked - self.taken

    def figures(self) -> Tuple[Dict[str, float], int]:
        """(``skipped_steps``, ``skipped_steps_interval``, ``grad_scale`` for this
        report; optimizer steps asked for since the previous report)."""
        in_interval = self.skipped - self._reported
        asked = self.asked - self._asked_reported
        self._reported, self._asked_reported = self.skipped, self.asked
        return {'skipped_steps': float(self.skipped),
                'skipped_steps_interval': float(in_interval),
                'grad_scale': float(self.scaler.get_scale())}, asked

    def close(self) -> None:
        """Stop counting (removes the optimizer's step hook)."""
        self._handle.remove()
