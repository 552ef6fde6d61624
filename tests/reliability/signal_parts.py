"""Parts of the signal tests' toy runs (imported by their configs' custom_imports)."""
import os.path as osp
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(name='SlowIterHook', force=True)
class SlowIterHook(Hook):
    """Sleeps ``wait_s`` before each iteration; after iteration ``at`` touches
    ``<marker>.rank<R>`` (the test signals once every rank wrote it)."""

    priority = 'LOWEST'

    def __init__(self, marker: str, at: int = 2, wait_s: float = 0.3):
        self.marker, self.at, self.wait_s = marker, at, wait_s

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        time.sleep(self.wait_s)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        path = f'{self.marker}.rank{runner.rank}'
        if runner.iter + 1 == self.at and not osp.exists(path):
            open(path, 'w').close()
