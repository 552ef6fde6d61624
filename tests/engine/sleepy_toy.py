"""ToyRegressor whose forward sleeps on one rank at one call: a rank stuck in its step."""
import os
import time

from mmengine.registry import MODELS

from tests.toy import ToyRegressor


@MODELS.register_module(force=True)
class SleepyToyRegressor(ToyRegressor):
    """Sleeps ``sleep_s`` seconds in the ``at_call``-th training forward of global rank
    ``sleep_rank`` (the others then wait for it in DDP's gradient all-reduce)."""

    def __init__(self, sleep_rank: int = 1, at_call: int = 3, sleep_s: float = 600.0):
        super().__init__()
        self.sleep_rank, self.at_call, self.sleep_s = sleep_rank, at_call, sleep_s
        self.calls = 0

    def forward(self, inputs, targets=None, mode='tensor'):
        if mode == 'loss':
            self.calls += 1
            if self.calls == self.at_call and \
                    int(os.environ.get('RANK', '0')) == self.sleep_rank:
                time.sleep(self.sleep_s)  # the step that never ends
        return super().forward(inputs, targets, mode)
