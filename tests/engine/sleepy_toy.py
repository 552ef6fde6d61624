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


CONFIG = '''
custom_imports = dict(imports=['mmdet3d_scaling', 'tests.engine.sleepy_toy'{imports}],
                      allow_failed_imports=False)
runner_type = 'ScalingRunner'
default_scope = 'mmdet3d'  # the plugin's hooks are registered in mmdet3d's registries
model = dict(type='SleepyToyRegressor', sleep_rank=1, at_call=3{model})
train_dataloader = dict(
    dataset=dict(type='ToyDataset', length=64), batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
train_cfg = dict(by_epoch=False, max_iters=20)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=100, by_epoch=False))
env_cfg = dict(dist_cfg=dict(backend='{backend}'))
distributed = dict(hang_timeout_s={hang_timeout_s}, timeout_minutes={timeout_minutes})
log_level = 'INFO'
'''


def sleepy_config(backend: str = 'gloo', hang_timeout_s: float = 10,
                  timeout_minutes: float = 5, sleep_s: float = None,
                  imports: tuple = ()) -> str:
    """The 2-rank hang-doctor run: rank 1 sleeps (``sleep_s``, default the model's) in
    its 3rd training forward; ``imports``: more modules for ``custom_imports``."""
    return CONFIG.format(
        backend=backend, hang_timeout_s=hang_timeout_s, timeout_minutes=timeout_minutes,
        model='' if sleep_s is None else f', sleep_s={sleep_s}',
        imports=''.join(f', {m!r}' for m in imports))


from mmengine.hooks import Hook  # noqa: E402
from mmengine.registry import HOOKS  # noqa: E402


@HOOKS.register_module(force=True)
class SleepyBeforeIterHook(Hook):
    """Sleeps ``sleep_s`` in ``before_train_iter`` of iteration ``at`` (1-based) on
    global rank ``sleep_rank``: a rank stuck in a hook, before its step."""

    priority = 'NORMAL'

    def __init__(self, sleep_rank: int = 1, at: int = 3, sleep_s: float = 600.0):
        self.sleep_rank, self.at, self.sleep_s = sleep_rank, at, sleep_s

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter + 1 == self.at and runner.rank == self.sleep_rank:
            time.sleep(self.sleep_s)
