"""Device memory the CUDA driver keeps after mmcv's strided sparse convolution.

One forward of mmdet3d's ``SparseEncoder`` (SECOND / PV-RCNN's, KITTI-like grid
41 x 160 x 140, 3,000 voxels, batch 2) on mmcv's ops, spconv hidden; free device memory
(``torch.cuda.mem_get_info``) and the per-thread local memory the context holds
(``mmdet3d_scaling.utils.cuda_local_memory``) before it, after it, after giving the
local memory back, and after a second forward. torch's reserved memory after the first
forward shows how little of the drop is the allocator's.

    PYTHONPATH=<no spconv> python benchmarks/mmcv_local_memory.py [--out FILE.json]
"""
import argparse
import json
import os.path as osp
import sys

sys.modules['spconv'] = None  # mmcv's sparse conv, as on a machine without spconv
sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402

from mmdet3d_scaling.utils import cuda_local_memory  # noqa: E402

GIB = 2 ** 30


def _voxels(n: int = 3000, shape=(41, 160, 140)):
    gen = torch.Generator().manual_seed(3)
    coords = torch.stack([torch.randint(0, s, (2 * n,), generator=gen) for s in shape], 1)
    batch = torch.arange(2 * n) % 2
    coords = torch.unique(torch.cat([batch[:, None], coords], 1), dim=0)[:n]
    return torch.randn(len(coords), 4, generator=gen).cuda(), coords.int().cuda()


def _state(label: str) -> dict:
    torch.cuda.synchronize()
    row = dict(state=label, free_gib=round(torch.cuda.mem_get_info()[0] / GIB, 2),
               stack_bytes=cuda_local_memory.stack_size_bytes(),
               kept_gib=round((cuda_local_memory.kept_bytes() or 0) / GIB, 2),
               reserved_gib=round(torch.cuda.memory_reserved() / GIB, 3))
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--out', help='write the rows as JSON here')
    args = parser.parse_args()
    from mmdet3d.models.middle_encoders import SparseEncoder
    torch.manual_seed(0)
    model = SparseEncoder(in_channels=4, sparse_shape=[41, 160, 140],
                          order=('conv', 'norm', 'act')).cuda().eval()
    feats, coords = _voxels()
    rows = [_state('before the forward')]
    with torch.no_grad():
        model(feats, coords, 2)
    rows.append(_state('after the forward'))
    cuda_local_memory.release()
    rows.append(_state('after cuda_local_memory.release()'))
    with torch.no_grad():
        model(feats, coords, 2)
    rows.append(_state('after a second forward'))
    result = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)


if __name__ == '__main__':
    main()
