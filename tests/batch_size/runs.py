"""What the search hooks' tests share: a real Runner trained on the demo config with a
hook that records the batches it saw, the log it wrote, and a modelled device."""
import logging
from typing import List, Tuple, Type

from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401  (registers the hooks, hands configs to ScalingRunner)
from mmdet3d.registry import HOOKS

MiB = 2**20


def modeled_probe(capacity_bytes: int, per_sample: float = MiB) -> dict:
    """A modelled device's probe config: ``per_sample`` bytes a sample, nothing fixed."""
    return dict(type='ModeledMemoryProbe', capacity_bytes=capacity_bytes, fixed_bytes=0,
                bytes_per_sample=per_sample)


class SeenBatches(Hook):
    """The batch each training iteration received and whether the optimizer stepped."""

    priority = 'LOWEST'

    def __init__(self):
        self.batches: List[int] = []
        self.stepped: List[bool] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.batches.append(len(data_batch['data_samples']))
        self.stepped.append(runner.optim_wrapper.should_update())


HOOKS.register_module(module=SeenBatches, force=True)  # configs must stay printable


class LogCapture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def train(cfg: Config, hook_type: Type[Hook]) -> Tuple[Runner, Hook, SeenBatches,
                                                        List[str]]:
    """Build the runner from ``cfg`` (plain ``Runner.from_cfg``: the plugin's hand-off
    builds a ScalingRunner), train; the runner, its ``hook_type`` hook, what
    :class:`SeenBatches` saw and the log lines."""
    cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [dict(type='SeenBatches')]
    runner = Runner.from_cfg(cfg)
    capture = LogCapture()
    runner.logger.addHandler(capture)
    try:
        runner.train()
    finally:
        runner.logger.removeHandler(capture)
    hook = next(h for h in runner.hooks if isinstance(h, hook_type))
    seen = next(h for h in runner.hooks if isinstance(h, SeenBatches))
    return runner, hook, seen, capture.lines
