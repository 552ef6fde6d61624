"""SyncBN conversion on a real mmdet3d SparseEncoder (BatchNorm1d in spconv containers).

The multi-process check (statistics really synchronised over gloo) is in
``test_ddp_runner.py``; these run in one process.
"""
import pytest
import torch
from mmengine.model import BaseModel
from mmengine.model.utils import convert_sync_batchnorm as mmengine_convert
from mmengine.runner import Runner
from torch import nn

import mmdet3d_scaling  # noqa: F401
from mmdet3d.registry import MODELS
from mmdet3d_scaling.parallel.sync_bn import (convert_sync_bn, norm_layer_counts,
                                                     resolve_implementation)

spconv = pytest.importorskip('spconv.pytorch')
SPARSE_SHAPE = [41, 24, 24]


def build_encoder(norm_type: str = 'BN1d') -> nn.Module:
    """A small SECOND-style SparseEncoder from mmdet3d's registry."""
    return MODELS.build(dict(
        type='SparseEncoder', in_channels=4, sparse_shape=SPARSE_SHAPE,
        norm_cfg=dict(type=norm_type, eps=1e-3, momentum=0.01), base_channels=8,
        output_channels=16, encoder_channels=((8, ), (8, 8), (16, 16), (16, 16)),
        encoder_paddings=((1, ), (1, 1), (1, 1), ((0, 1, 1), 1))))


def sparse_input(seed: int = 0, n: int = 300):
    gen = torch.Generator().manual_seed(seed)
    coords = torch.stack([torch.randint(0, s, (n, ), generator=gen) for s in SPARSE_SHAPE], 1)
    coords = torch.unique(coords, dim=0)
    coors = torch.cat([torch.zeros(len(coords), 1, dtype=torch.long), coords], 1).int()
    feats = torch.randn(len(coords), 4, generator=gen) * (1 + seed)
    return feats, coors


def _bn1d_count(module: nn.Module) -> int:
    return sum(type(m) is nn.BatchNorm1d for m in module.modules())


@pytest.mark.parametrize('impl,cls_name', [('torch', 'SyncBatchNorm'),
                                           ('naive', 'NaiveSyncBatchNorm1d')])
def test_conversion_reaches_every_bn_of_a_sparse_encoder(impl, cls_name):
    encoder = build_encoder()
    n_bn = _bn1d_count(encoder)
    assert n_bn >= 7  # conv_input, every encoder layer, conv_out
    params_before = {id(p) for p in encoder.parameters()}
    converted = convert_sync_bn(encoder, impl)
    assert _bn1d_count(converted) == 0
    assert norm_layer_counts(converted) == {cls_name: n_bn}
    # the very same Parameter objects: an optimizer built before still updates them
    assert {id(p) for p in converted.parameters()} == params_before


def test_converted_layers_compute_what_the_originals_did():
    import copy
    torch.manual_seed(0)
    encoder = build_encoder()
    for m in encoder.modules():  # non-trivial statistics and affine parameters
        if isinstance(m, nn.BatchNorm1d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
            nn.init.uniform_(m.weight, 0.5, 2)
    original = [m for m in copy.deepcopy(encoder).modules()
                if isinstance(m, nn.BatchNorm1d)]
    converted = convert_sync_bn(encoder, 'torch').eval()
    synced = [m for m in converted.modules() if isinstance(m, nn.SyncBatchNorm)]
    assert len(synced) == len(original)
    for bn, sync in zip(original, synced):
        x = torch.randn(50, bn.num_features)
        assert torch.equal(bn.eval()(x), sync(x))  # eval: running statistics, no sync
    feats, coors = sparse_input()
    with torch.no_grad():
        assert converted(feats, coors, 1).shape == (1, 32, 3, 3)


def test_spconv_sparse_batchnorm_keeps_taking_sparse_tensors():
    from spconv.pytorch.modules import SparseBatchNorm, SparseSyncBatchNorm
    net = nn.Sequential(SparseBatchNorm(4))
    # mmengine's conversion loses the sparse-tensor handling ...
    assert type(mmengine_convert(nn.Sequential(SparseBatchNorm(4)))[0]) is nn.SyncBatchNorm
    # ... ours keeps it: spconv's own synchronised class, or the sparse naive form
    assert type(convert_sync_bn(net, 'torch')[0]) is SparseSyncBatchNorm
    naive = convert_sync_bn(nn.Sequential(SparseBatchNorm(4)), 'naive')[0]
    feats, coors = sparse_input()
    x = spconv.SparseConvTensor(feats, coors, SPARSE_SHAPE, 1)
    out = naive.train()(x)
    assert isinstance(out, spconv.SparseConvTensor)
    assert torch.allclose(out.features.mean(0), torch.zeros(4), atol=1e-5)


def test_layers_that_already_sync_are_kept_and_bn3d_is_reported():
    from mmdet3d.models.layers.norm import NaiveSyncBatchNorm1d
    net = nn.Sequential(NaiveSyncBatchNorm1d(3), nn.BatchNorm3d(2), nn.BatchNorm2d(2))
    out = convert_sync_bn(net, 'naive')
    assert [type(m).__name__ for m in out] == [
        'NaiveSyncBatchNorm1d', 'BatchNorm3d', 'NaiveSyncBatchNorm2d']


class TwoParts(nn.Module):
    """A sparse encoder and a dense head, as in SECOND-style detectors."""

    def __init__(self):
        super().__init__()
        self.middle_encoder = build_encoder()
        self.head = nn.Sequential(nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4),
                                  nn.Sequential(nn.BatchNorm1d(4)))


def test_scope_converts_only_the_named_submodules():
    net = TwoParts()
    n_sparse = _bn1d_count(net.middle_encoder)
    convert_sync_bn(net, 'allreduce', scope=['head.1', 'head.2'])
    assert _bn1d_count(net.middle_encoder) == n_sparse  # outside the scope: untouched
    assert [type(m).__name__ for m in (net.head[1], net.head[2][0])] == [
        'AllReduceSyncBatchNorm', 'AllReduceSyncBatchNorm']
    net = TwoParts()
    convert_sync_bn(net, 'allreduce', scope=['middle_encoder'])
    assert _bn1d_count(net.middle_encoder) == 0
    assert type(net.head[1]) is nn.BatchNorm2d and type(net.head[2][0]) is nn.BatchNorm1d
    # a name covers everything below it
    assert norm_layer_counts(convert_sync_bn(TwoParts(), 'allreduce', scope=['head'])) \
        == {'BatchNorm1d': n_sparse, 'AllReduceSyncBatchNorm': 2}


@pytest.mark.parametrize('scope,match', [
    (['backbone'], r"\['backbone'\] hold no BatchNorm layer.*middle_encoder, head"),
    (['head.0'], r"\['head.0'\] hold no BatchNorm"),  # the conv, no BN inside
    ('head', 'must be None or a non-empty list'),
    ([], 'must be None or a non-empty list'),
])
def test_bad_scope_is_an_error_naming_it(scope, match):
    net = TwoParts()
    with pytest.raises(ValueError, match=match):
        convert_sync_bn(net, 'allreduce', scope=scope)
    assert _bn1d_count(net.middle_encoder) > 0  # nothing converted before the error


def test_scope_without_sync_bn_is_an_error():
    from mmdet3d_scaling.parallel.ddp_wrapper import ScalingDistributedDataParallel
    with pytest.raises(ValueError, match=r"sync_bn_scope=\['head'\] needs sync_bn"):
        ScalingDistributedDataParallel(TwoParts(), sync_bn=None, sync_bn_scope=['head'])


def test_resolve_implementation():
    assert resolve_implementation('torch', cuda=True) == 'torch'
    assert resolve_implementation('mmcv', cuda=False) == 'naive'
    with pytest.raises(ValueError, match="sync_bn='apex'"):
        resolve_implementation('apex')


@MODELS.register_module(name='H4SparseModel', force=True)
class H4SparseModel(BaseModel):
    """A BaseModel around a real SparseEncoder built from mmdet3d's registry."""

    def __init__(self, norm_type: str = 'SyncBN'):
        super().__init__()
        self.encoder = build_encoder(norm_type)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        feats, coors = inputs
        out = self.encoder(feats, coors, 1)
        return dict(loss=out.mean()) if mode == 'loss' else out


def test_single_process_runner_reverts_sync_bn_inside_sparse_encoder(tmp_path):
    n_bn = norm_layer_counts(H4SparseModel('SyncBN'))['SyncBatchNorm']
    assert n_bn >= 7
    runner = Runner(model=dict(type='H4SparseModel', norm_type='SyncBN'),
                    work_dir=str(tmp_path), default_scope='mmdet3d', log_level='WARNING',
                    experiment_name='revert')
    model = runner.model
    assert not isinstance(model, nn.parallel.DistributedDataParallel)  # bare model
    assert 'SyncBatchNorm' not in norm_layer_counts(model)
    assert sum(norm_layer_counts(model).values()) == n_bn
    model.train()
    loss = model(sparse_input(), mode='loss')['loss']
    loss.backward()
