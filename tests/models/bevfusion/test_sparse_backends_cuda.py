"""mmcv's sparse conv on CUDA against spconv on the CPU: same weights, same outputs.

Runs on the GPU machine (mmcv with CUDA ops, no spconv). The reference comes from the
CPU with spconv 2.x: the reduced model's weights (spconv layout), a batch of points and
the model's raw outputs, written by

    python -m tests.models.bevfusion.test_sparse_backends_cuda write REF.pth

and read from ``$BEVFUSION_BACKEND_REFERENCE``. Without CUDA (or without the file) the
tests are skipped.
"""
import os
import sys

import pytest
import torch

from .common import build, tiny_model_cfg, toy_batch

REF_ENV = 'BEVFUSION_BACKEND_REFERENCE'


def write_reference(path: str) -> None:
    torch.manual_seed(0)
    model = build(tiny_model_cfg('spconv'))
    with torch.no_grad():  # non-trivial BN statistics
        for name, value in model.state_dict().items():
            if 'running_var' in name:
                value.uniform_(0.5, 1.5)
            elif 'running_mean' in name:
                value.uniform_(-0.1, 0.1)
    model.eval()
    batch = toy_batch(seed=7)
    with torch.no_grad():
        inputs = model.data_preprocessor(batch, False)
        feats, coords, _ = model.voxelize(inputs['inputs']['points'])
        bev = model.pts_middle_encoder(feats, coords, 2)
        out = model(**inputs, mode='tensor')[0][0]
    torch.save(dict(state_dict=model.state_dict(), points=batch['inputs']['points'],
                    feats=feats, coords=coords, bev=bev, outputs=out), path)


def _rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.cpu() - ref).abs().max().item() / ref.abs().max().item()


def _reference():
    if not torch.cuda.is_available():
        pytest.skip('needs CUDA (mmcv sparse conv)')
    path = os.environ.get(REF_ENV)
    if not path or not os.path.isfile(path):
        pytest.skip(f'set {REF_ENV} to a file written by write_reference()')
    return torch.load(path, map_location='cpu', weights_only=False)


def test_mmcv_backend_matches_spconv_reference():
    ref = _reference()
    model = build(tiny_model_cfg('mmcv'))
    assert model.pts_middle_encoder.backend.name == 'mmcv'
    model.load_state_dict(ref['state_dict'])  # spconv layout -> mmcv layout
    model = model.cuda().eval()
    batch = toy_batch(seed=7)
    batch['inputs']['points'] = [p.cuda() for p in ref['points']]
    with torch.no_grad():
        inputs = model.data_preprocessor(batch, False)
        feats, coords, _ = model.voxelize(inputs['inputs']['points'])
        # 1. voxelization (mmcv CUDA kernel vs CPU kernel): same voxels, same means
        key = lambda c: c[:, 0] * 10**9 + c[:, 1] * 10**6 + c[:, 2] * 10**3 + c[:, 3]
        got, want = key(coords.long().cpu()), key(ref['coords'].long())
        print(f'voxels: {len(got)} (CUDA) vs {len(want)} (CPU)')
        assert torch.equal(got.sort().values, want.sort().values)
        order_got, order_want = got.argsort(), want.argsort()
        assert torch.allclose(feats.cpu()[order_got], ref['feats'][order_want], atol=1e-6)
        # 2. encoder on the CPU's voxels: mmcv sparse conv vs spconv
        bev = model.pts_middle_encoder(ref['feats'].cuda(), ref['coords'].cuda(), 2)
        err = _rel_err(bev, ref['bev'])
        print(f'BEV map from the same voxels: max abs diff / max abs = {err:.2e}')
        assert err < 1e-4
        out = model(**inputs, mode='tensor')[0][0]
    # proposals are picked by argsort of the heatmap: compare when they agree
    assert torch.equal(out['query_labels'].cpu(), ref['outputs']['query_labels'])
    for key in ('center', 'heatmap', 'dim', 'dense_heatmap'):
        diff = (out[key].cpu() - ref['outputs'][key]).abs().max().item()
        print(f'{key}: max abs diff {diff:.2e}')
        assert torch.allclose(out[key].cpu(), ref['outputs'][key], atol=1e-3, rtol=1e-3)


@pytest.mark.slow
def test_mmcv_backend_train_step_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip('needs CUDA (mmcv sparse conv)')
    from mmengine.optim import OptimWrapper
    model = build(tiny_model_cfg('mmcv')).cuda().train()
    optim = OptimWrapper(torch.optim.AdamW(model.parameters(), lr=1e-3))
    batch = toy_batch(seed=1)
    batch['inputs']['points'] = [p.cuda() for p in batch['inputs']['points']]
    for s in batch['data_samples']:
        s.gt_instances_3d = s.gt_instances_3d.to('cuda')
    losses = [float(model.train_step(batch, optim)['loss']) for _ in range(5)]
    print('losses', losses)
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


if __name__ == '__main__':
    if len(sys.argv) != 3 or sys.argv[1] != 'write':
        sys.exit('usage: python -m tests.models.bevfusion.test_sparse_backends_cuda '
                 'write REF.pth')
    write_reference(sys.argv[2])
