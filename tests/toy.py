"""A tiny model and dataset for tests of runner mechanics (not of detection).

Tests of detection use real mmdet3d models and datasets; these exist for checks that
need exact arithmetic (e.g. accumulation equivalence) or a checkpoint in seconds.
"""
import torch
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS
from torch.utils.data import Dataset


@MODELS.register_module(force=True)
class ToyRegressor(BaseModel):
    """Linear regression with an MSE loss; no BatchNorm, deterministic."""

    def __init__(self, in_features: int = 4):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, 1)

    def forward(self, inputs, targets=None, mode='tensor'):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        out = self.linear(inputs).squeeze(-1)
        if mode == 'loss':
            targets = torch.stack(targets) if isinstance(targets, list) else targets
            return dict(loss=((out - targets) ** 2).mean())
        return out


@MODELS.register_module(force=True)
class ToyBNRegressor(ToyRegressor):
    """ToyRegressor behind a BatchNorm1d (momentum 0.1): running statistics to check."""

    def __init__(self, in_features: int = 4, momentum: float = 0.1):
        super().__init__(in_features)
        self.bn = torch.nn.BatchNorm1d(in_features, momentum=momentum)

    def forward(self, inputs, targets=None, mode='tensor'):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        return super().forward(self.bn(inputs), targets, mode)


@DATASETS.register_module(force=True)
class ToyDataset(Dataset):
    """``length`` fixed random samples ``dict(inputs, targets)``; with ``same_inputs``
    every sample has the first one's inputs (batch statistics then do not depend on
    how a batch is split)."""

    def __init__(self, length: int = 16, in_features: int = 4, seed: int = 0,
                 same_inputs: bool = False):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(length, in_features, generator=gen)
        if same_inputs:
            self.x[:] = self.x[0]
        self.y = self.x.sum(1) + 0.1 * torch.randn(length, generator=gen)
        self.metainfo = dict(classes=('toy',))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, idx: int) -> dict:
        return dict(inputs=self.x[idx], targets=self.y[idx])


def toy_runner_cfg(work_dir, max_iters: int = 4, batch_size: int = 2, **overrides) -> dict:
    """Kwargs for ``mmengine.runner.Runner`` training ToyRegressor with SGD."""
    cfg = dict(
        model=dict(type='ToyRegressor'),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=dict(type='ToyDataset'), batch_size=batch_size, num_workers=0,
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=max_iters,
                                           by_epoch=False)),
        env_cfg=dict(dist_cfg=dict(backend='gloo')),
        log_level='WARNING',
    )
    cfg.update(overrides)
    return cfg
