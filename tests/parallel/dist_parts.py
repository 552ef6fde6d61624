"""Shared parts of the multi-process tests: registered toy parts, configs, a spawner.

One start of worker processes runs a list of checks in the same process group
(starting processes and process groups is the slow part).
"""
import json
import os
import socket
from typing import Callable, Dict, List, Optional

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, MODELS

from tests.toy import ToyDataset, ToyRegressor
from tests.multiprocess import start_ranks


@MODELS.register_module(name='H4ToyRegressor', force=True)
class H4ToyRegressor(ToyRegressor):
    """ToyRegressor (no BatchNorm) built from a config string."""


@MODELS.register_module(name='H4ToyWithUnused', force=True)
class H4ToyWithUnused(ToyRegressor):
    """ToyRegressor plus a layer that never reaches the loss."""

    def __init__(self, in_features: int = 4):
        super().__init__(in_features)
        self.unused_head = torch.nn.Linear(in_features, 2)


@MODELS.register_module(name='H4ToyWithBN', force=True)
class H4ToyWithBN(ToyRegressor):
    """ToyRegressor behind a BatchNorm1d (to see SyncBN statistics)."""

    def __init__(self, in_features: int = 4):
        super().__init__(in_features)
        self.bn = torch.nn.BatchNorm1d(in_features)

    def forward(self, inputs, targets=None, mode='tensor'):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        return super().forward(self.bn(inputs), targets, mode)


@DATASETS.register_module(name='H4ToyDataset', force=True)
class H4ToyDataset(ToyDataset):
    pass


@HOOKS.register_module(name='H4RecordHook', force=True)
class H4RecordHook(Hook):
    """Writes (iter, lr) before every iteration and the resume state to a JSON file."""
    priority = 'LOWEST'

    def __init__(self, path: str):
        self.path = path
        self.record = dict(lrs={}, start_iter=None)

    def before_train(self, runner) -> None:
        self.record['start_iter'] = runner.iter

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        wrapper = runner.optim_wrapper
        self.record['lrs'][str(runner.iter)] = wrapper.optimizer.param_groups[0]['lr']

    def after_train(self, runner) -> None:
        if runner.rank == 0:
            with open(self.path, 'w') as f:
                json.dump(self.record, f)


def toy_cfg(work_dir: str, *, max_iters: int = 6, batch_size: int = 2,
            model: str = 'H4ToyRegressor', launcher: str = 'none', length: int = 16,
            checkpoint_interval: Optional[int] = None, record: Optional[str] = None,
            name: str = 'toy', **extra) -> Config:
    """A ScalingRunner config (default_scope mmdet3d, iteration loop, MultiStepLR)."""
    hooks = [dict(type='H4RecordHook', path=record)] if record else []
    cfg = dict(
        default_scope='mmdet3d',
        runner_type='ScalingRunner',  # gloo / CPU-style DDP where there is no CUDA
        experiment_name=name,
        model=dict(type=model),
        work_dir=work_dir,
        launcher=launcher,
        train_dataloader=dict(
            dataset=dict(type='H4ToyDataset', length=length), batch_size=batch_size,
            num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(type='OptimWrapper',
                           optimizer=dict(type='SGD', lr=0.05, momentum=0.9)),
        # step-wise LR: the same values whether schedulers step per micro-batch or per
        # optimizer step, so plans with different accumulation are comparable exactly
        param_scheduler=[dict(type='MultiStepLR', by_epoch=False, milestones=[3],
                              gamma=0.1)],
        train_cfg=dict(type='IterBasedTrainLoop', max_iters=max_iters),
        default_hooks=dict(
            checkpoint=dict(type='CheckpointHook', by_epoch=False,
                            interval=checkpoint_interval or max_iters),
            logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=hooks,
        # a short timeout: a failing rank must not leave the others waiting 30 min
        env_cfg=dict(dist_cfg=dict(backend='gloo', timeout=180)),
        log_level='WARNING',
        randomness=dict(seed=0),  # same initial weights in every run and on rank 0
    )
    cfg.update(extra)
    return Config(cfg)


def params_of(model) -> Dict[str, List[float]]:
    module = getattr(model, 'module', model)
    return {k: v.detach().flatten().tolist() for k, v in module.state_dict().items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _worker(rank: int, world_size: int, port: int, out_dir: str,
            checks: List[Callable]) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import mmdet3d_scaling  # noqa: F401
    # an exception ends this process and mp.spawn stops the others (no hang in a
    # collective the failed rank never reaches) and re-raises it with its traceback
    results = {check.__name__: check(rank, world_size, out_dir) for check in checks}
    with open(os.path.join(out_dir, f'rank{rank}.json'), 'w') as f:
        json.dump(results, f)


def spawn_checks(world_size: int, out_dir: str, checks: List[Callable]) -> List[dict]:
    """Run ``checks`` in ``world_size`` gloo processes; per-rank dicts of results.

    Forked where there is no CUDA: the children inherit the imported mmdet3d stack
    instead of importing it again (tens of seconds each on a busy 2-core machine).
    """
    # gloo CPU ranks on any machine: where CUDA is visible they are spawned with it
    # hidden (tests/multiprocess.py), else forked
    start_ranks(_worker, (world_size, free_port(), out_dir, checks), nprocs=world_size,
                cpu_only=True)
    results = []
    for rank in range(world_size):
        with open(os.path.join(out_dir, f'rank{rank}.json')) as f:
            results.append(json.load(f))
    return results
