"""mmdet3d 1.4.0: ``VoxelSetAbstraction.sample_key_points`` samples one scan at a time.

PV-RCNN picks its keypoints (2048 a scan) by furthest point sampling, one mmcv
``furthest_point_sample`` call per sample. That kernel runs one thread block per scan
and is sequential over the keypoints, so each call keeps one of the H200's 132 SMs busy
for ~3.5 ms while the rest wait: at batch 8 the FPS kernels were 28.3 ms of a
micro-batch's 193 ms of kernels, the second-largest kernel
(docs/data/same_call_2026-12-04/pv_rcnn_b8_spconv_profile.log).

The patch issues the same per-sample calls, each on its own CUDA stream (torch's stream
pool), so the scans are sampled side by side; the current stream waits for all of them
before the keypoints are stacked. Same kernel on the same inputs: the same keypoints,
bit for bit (``tests/patches/speed/test_keypoint_sampling.py``). Tensors cross streams
as the caching allocator needs it (``record_stream``). On a CPU, with voxel centres as
the source (``voxel_center_as_source``) or for one scan, upstream's method runs.
"""
import importlib
from typing import List, Optional

import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'
MODULE = 'mmdet3d.models.middle_encoders.voxel_set_abstraction'


def _sample_one(points: Tensor, num_keypoints: int) -> Tensor:
    """Upstream's keypoints of one scan ``(N, 3)``: FPS, repeated when N is smaller."""
    fps = importlib.import_module(MODULE).furthest_point_sample  # a CPU twin rebinds it
    idx = fps(points.unsqueeze(dim=0).contiguous(), num_keypoints).long()[0]
    num_points = points.shape[0]
    if num_points < num_keypoints:
        times = int(num_keypoints / num_points) + 1
        idx = idx[:num_points].repeat(times)[:num_keypoints]
    return points[idx]


def sample_key_points(self, points: List[Tensor], coors: Optional[Tensor]) -> Tensor:
    """``VoxelSetAbstraction.sample_key_points`` with the scans sampled concurrently."""
    if (self.voxel_center_as_source or not points or len(points) < 2
            or not points[0].is_cuda):
        return sample_key_points.original(self, points, coors)
    main = torch.cuda.current_stream(points[0].device)
    keypoints, sides = [], []
    for scan in points:
        side = torch.cuda.Stream(device=scan.device)  # from torch's pool: no creation
        side.wait_stream(main)  # the scan is ready (waits for main only, not the others)
        with torch.cuda.stream(side):
            out = _sample_one(scan[..., :3], self.num_keypoints)
        scan.record_stream(side)  # read there: not reused before it is done
        out.record_stream(main)  # made there, used here
        keypoints.append(out)
        sides.append(side)
    for side in sides:  # after all are queued, or each scan would wait for the last
        main.wait_stream(side)
    return torch.stack(keypoints, dim=0)  # (B, M, 3)


PATCH = declare(method_patch(
    'keypoint_sampling', 'speed', f'{MODULE}:VoxelSetAbstraction', 'sample_key_points',
    sample_key_points, UPSTREAM,
    why="PV-RCNN's furthest point sampling runs scan after scan on one SM each (28 ms "
        'of kernels at batch 8): the same calls on parallel streams'))
