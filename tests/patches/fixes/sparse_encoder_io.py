"""One side of a sparse-conv checkpoint round trip, in a process of its own.

    python -m tests.patches.fixes.sparse_encoder_io --backend mmcv|spconv --model NAME
        [--load CKPT] [--strip-metadata] --save STATE [--forward OUT]

``--backend mmcv`` hides spconv before mmdet3d is imported, so mmdet3d's registry keeps
mmcv's sparse convs (as on a machine without spconv). The encoder is built with seed 0,
``--load`` loads a state dict (strict) through ``load_state_dict``, ``--save`` writes the
model's state dict, ``--forward`` (CUDA only) the encoder's output for fixed voxels.
"""
import argparse
import sys

MODELS = {  # mmdet3d's stock encoder as SECOND / PV-RCNN use it, CenterPoint's blocks,
    # BEVFusion's own (the (X, Y, Z) order of projects/BEVFusion)
    'second': dict(type='SparseEncoder', in_channels=4, sparse_shape=[41, 160, 140],
                   order=('conv', 'norm', 'act')),
    'basicblock': dict(
        type='SparseEncoder', in_channels=5, sparse_shape=[41, 128, 128],
        output_channels=128, order=('conv', 'norm', 'act'),
        encoder_channels=((16, 16, 32), (32, 32, 64), (64, 64, 128), (128, 128)),
        encoder_paddings=((0, 0, 1), (0, 0, 1), (0, 0, [0, 1, 1]), (0, 0)),
        block_type='basicblock'),
    'bevfusion': dict(
        type='BEVFusionSparseEncoder', in_channels=5, sparse_shape=[128, 128, 41],
        order=('conv', 'norm', 'act'), norm_cfg=dict(type='BN1d', eps=1e-3, momentum=0.01),
        encoder_channels=((16, 16, 32), (32, 32, 64), (64, 64, 128), (128, 128)),
        encoder_paddings=((0, 0, 1), (0, 0, 1), (0, 0, (1, 1, 0)), (0, 0)),
        block_type='basicblock'),
}


def _voxels(model: str, device):
    import torch
    cfg = MODELS[model]
    gen = torch.Generator().manual_seed(3)
    shape = cfg['sparse_shape']
    n = 3000
    coords = torch.stack([torch.randint(0, s, (2 * n,), generator=gen) for s in shape], 1)
    batch = torch.arange(2 * n) % 2
    coords = torch.unique(torch.cat([batch[:, None], coords], 1), dim=0)[:n]
    feats = torch.randn(len(coords), cfg['in_channels'], generator=gen)
    return feats.to(device), coords.int().to(device)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('--backend', choices=['mmcv', 'spconv'], required=True)
    parser.add_argument('--model', choices=list(MODELS), required=True)
    parser.add_argument('--load')
    parser.add_argument('--strip-metadata', action='store_true')
    parser.add_argument('--save', required=True)
    parser.add_argument('--forward')
    args = parser.parse_args()
    if args.backend == 'mmcv':
        sys.modules['spconv'] = None  # an ImportError for mmdet3d and the plugin
    import torch
    import mmdet3d_scaling  # noqa: F401  (the fixes set, sparse_conv_layout among them)
    from mmdet3d.registry import MODELS as REGISTRY
    from mmdet3d.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    cfg = dict(MODELS[args.model])
    if args.model == 'bevfusion':
        cfg['sparse_backend'] = args.backend
    torch.manual_seed(0)
    model = REGISTRY.build(cfg)
    with torch.no_grad():  # BN statistics that a checkpoint would carry
        for name, value in model.state_dict().items():
            if 'running_var' in name:
                value.uniform_(0.5, 1.5)
            elif 'running_mean' in name:
                value.uniform_(-0.1, 0.1)
    if args.load:
        state = torch.load(args.load, weights_only=False)
        if args.strip_metadata:
            state = dict(state)  # a plain dict: no _metadata, no versions
        model.load_state_dict(state, strict=True)
    torch.save(model.state_dict(), args.save)
    if args.forward:
        model = model.cuda().eval()
        feats, coords = _voxels(args.model, 'cuda')
        with torch.no_grad():
            out = model(feats, coords, 2)
        out = out[0] if isinstance(out, tuple) else out
        torch.save(out.cpu(), args.forward)


if __name__ == '__main__':
    main()
