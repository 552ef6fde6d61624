"""Camera-to-BEV view transforms of BEVFusion (Lift-Splat-Shoot), no compiled ops.

State-dict compatible with mmdet3d's ``projects/BEVFusion`` ``LSSTransform`` and
``DepthLSSTransform`` (``dx``, ``bx``, ``nx``, ``frustum``, ``dtransform``,
``depthnet``, ``downsample``). Same forward arguments; options of ours:

* ``with_cp``: gradient checkpointing of depth-net + pooling (the frustum tensor and
  the depth-net activations are recomputed in backward instead of kept).
* ``memory_efficient``: pool ``depth x context`` without materialising the
  ``B x N x D x H x W x C`` frustum tensor (Triton on CUDA, else chunked PyTorch).
* ``deterministic``: BEV pooling without atomics (bit-reproducible).

Geometry and the LiDAR depth map are computed in fp32 with autocast off, so mixed
precision never moves a frustum point to another BEV cell.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from mmengine.model import BaseModule
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mmdet3d.registry import MODELS
from ...registry import register
from .ops import geometry_cell_index, pool_depth_context, pool_frustum


def gen_dx_bx(xbound: Sequence[float], ybound: Sequence[float],
              zbound: Sequence[float]) -> Tuple[Tensor, Tensor, Tensor]:
    """Cell size, first cell centre and cell count along x, y, z (upstream layout)."""
    bounds = (xbound, ybound, zbound)
    dx = torch.tensor([b[2] for b in bounds], dtype=torch.float32)
    bx = torch.tensor([b[0] + b[2] / 2.0 for b in bounds], dtype=torch.float32)
    nx = torch.tensor([int((b[1] - b[0]) / b[2]) for b in bounds], dtype=torch.long)
    return dx, bx, nx


def _bev_downsample(channels: int, downsample: int) -> nn.Module:
    """Conv-BN-ReLU x3 with a stride-2 middle conv (``downsample=2``) or identity."""
    if downsample == 1:
        return nn.Identity()
    if downsample != 2:
        raise ValueError(f'downsample must be 1 or 2 (as upstream), got {downsample}.')

    def block(stride: int) -> List[nn.Module]:
        return [
            nn.Conv2d(channels, channels, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(True)
        ]

    return nn.Sequential(*block(1), *block(downsample), *block(1))


# Slots the dropped entries of ``_last_write`` go to. Most of the depth map's (points x
# cameras) projections miss their image (a point is seen by one or two of six cameras);
# on a single slot the atomic max would queue on one address.
SPARE_SLOTS = 4096


def _last_write(index: Tensor, values: Tensor, size: int,
                keep: Optional[Tensor] = None) -> Tensor:
    """``out[index[i]] = values[i]`` for every ``i`` in order (where ``keep[i]``, if
    given), into zeros of ``size``: where indices repeat, the last write wins, on the
    CPU and on CUDA alike.

    ``index_put_`` with repeated indices keeps an arbitrary one of the values on CUDA
    (and on CPU threads); the winner is chosen here as the largest position, by a max
    (exact in any order), then gathered. Dropped entries (any index) are written to
    ``SPARE_SLOTS`` slots past the end. No host read.
    """
    if index.numel() == 0:  # a sample without points
        return values.new_zeros(size)
    position = torch.arange(index.numel(), device=index.device)
    slots = size
    if keep is not None:
        index = torch.where(keep, index, size + position % SPARE_SLOTS)
        slots += SPARE_SLOTS
    winner = torch.full((slots, ), -1, dtype=torch.long, device=index.device)
    winner.scatter_reduce_(0, index, position, 'amax')
    winner = winner[:size]
    return torch.where(winner >= 0, values[winner.clamp(min=0)], values.new_zeros(()))


def _no_autocast(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


class BaseViewTransform(BaseModule):
    """Lift camera features onto a frustum of depth bins and splat them into BEV.

    Args:
        in_channels: channels of the image features (neck output).
        out_channels: BEV channels ``C`` (per z cell).
        image_size: network input image ``(H, W)`` in pixels.
        feature_size: image feature map ``(fH, fW)``.
        xbound, ybound, zbound: ``(min, max, step)`` of the BEV grid in metres.
        dbound: ``(min, max, step)`` of the depth bins in metres.
        with_cp: gradient checkpointing of depth-net + pooling. Default False.
        memory_efficient: pool without the frustum tensor. Default False.
        deterministic: pool without atomics. Default False.
        depth_chunk: depth bins per step of the PyTorch lean pooling. Default 8.
        init_cfg: mmengine init config. Default None.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 image_size: Sequence[int],
                 feature_size: Sequence[int],
                 xbound: Sequence[float],
                 ybound: Sequence[float],
                 zbound: Sequence[float],
                 dbound: Sequence[float],
                 with_cp: bool = False,
                 memory_efficient: bool = False,
                 deterministic: bool = False,
                 depth_chunk: int = 8,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        self.in_channels = in_channels
        self.image_size = tuple(image_size)
        self.feature_size = tuple(feature_size)
        self.xbound, self.ybound, self.zbound = xbound, ybound, zbound
        self.dbound = dbound
        dx, bx, nx = gen_dx_bx(xbound, ybound, zbound)
        # Parameters (not buffers) without gradient: upstream's state-dict layout.
        self.dx = nn.Parameter(dx, requires_grad=False)
        self.bx = nn.Parameter(bx, requires_grad=False)
        self.nx = nn.Parameter(nx, requires_grad=False)
        self.grid_xyz = tuple(int(v) for v in nx)
        self.C = out_channels
        self.frustum = self.create_frustum()
        self.D = self.frustum.shape[0]
        self.with_cp = with_cp
        self.memory_efficient = memory_efficient
        self.deterministic = deterministic
        self.depth_chunk = depth_chunk

    def create_frustum(self) -> nn.Parameter:
        """``D x fH x fW x 3`` (u, v, depth) of every frustum point, in image pixels."""
        iH, iW = self.image_size
        fH, fW = self.feature_size
        ds = torch.arange(*self.dbound, dtype=torch.float).view(-1, 1, 1)
        D = ds.shape[0]
        ds = ds.expand(D, fH, fW)
        xs = torch.linspace(0, iW - 1, fW, dtype=torch.float).view(1, 1, fW)
        ys = torch.linspace(0, iH - 1, fH, dtype=torch.float).view(1, fH, 1)
        frustum = torch.stack((xs.expand(D, fH, fW), ys.expand(D, fH, fW), ds), -1)
        return nn.Parameter(frustum, requires_grad=False)

    def get_geometry(self, camera2lidar_rots: Tensor, camera2lidar_trans: Tensor,
                     intrins: Tensor, post_rots: Tensor, post_trans: Tensor,
                     extra_rots: Optional[Tensor] = None,
                     extra_trans: Optional[Tensor] = None) -> Tensor:
        """LiDAR-frame ``B x N x D x fH x fW x 3`` coordinates of the frustum points."""
        with _no_autocast(self.frustum.device):
            f32 = [t.float() if t is not None else None for t in (
                camera2lidar_rots, camera2lidar_trans, intrins, post_rots, post_trans,
                extra_rots, extra_trans)]
            c2l_rots, c2l_trans, intrins, post_rots, post_trans, e_rots, e_trans = f32
            B, N = c2l_trans.shape[:2]
            # Undo the image augmentation, then pixel -> camera -> LiDAR.
            pts = self.frustum.float() - post_trans.view(B, N, 1, 1, 1, 3)
            inv_post = torch.linalg.inv_ex(post_rots)[0]
            pts = torch.einsum('bnij,bndhwj->bndhwi', inv_post, pts)
            pts = torch.cat((pts[..., :2] * pts[..., 2:3], pts[..., 2:3]), -1)
            combine = c2l_rots.matmul(torch.linalg.inv_ex(intrins)[0])
            pts = torch.einsum('bnij,bndhwj->bndhwi', combine, pts)
            pts = pts + c2l_trans.view(B, N, 1, 1, 1, 3)
            if e_rots is not None:  # the LiDAR augmentation (rotation/scale/flip)
                pts = torch.einsum('bij,bndhwj->bndhwi', e_rots, pts)
            if e_trans is not None:
                pts = pts + e_trans.view(B, 1, 1, 1, 1, 3)
        return pts

    def cell_index(self, geom: Tensor) -> Tensor:
        """Flat BEV cell index ``B x N x D x fH x fW`` of the frustum points."""
        with _no_autocast(geom.device):
            lower = (self.bx - self.dx / 2.0).float()
            return geometry_cell_index(geom, lower, self.dx.float(), self.grid_xyz)

    def depth_and_context(self, img: Tensor,
                          depth_map: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """Depth distribution ``(B*N, D, fH, fW)`` and context ``(B*N, C, fH, fW)``."""
        raise NotImplementedError

    def _lift_splat(self, img: Tensor, depth_map: Optional[Tensor],
                    index: Tensor) -> Tensor:
        """Depth-net + pooling: ``(B, nz * C, nx, ny)`` BEV features."""
        B, N = img.shape[:2]
        depth, context = self.depth_and_context(img, depth_map)
        nx, ny, nz = self.grid_xyz
        num_cells = B * nz * nx * ny
        if self.memory_efficient:
            rows = pool_depth_context(
                depth, context.permute(0, 2, 3, 1), index.flatten(0, 1), num_cells,
                deterministic=self.deterministic, chunk=self.depth_chunk)
        else:
            # (B*N, C, D, fH, fW) -> (B, N, D, fH, fW, C): upstream's frustum tensor.
            frustum = depth.unsqueeze(1) * context.unsqueeze(2)
            frustum = frustum.view(B, N, self.C, *depth.shape[1:]).permute(0, 1, 3, 4, 5, 2)
            rows = pool_frustum(frustum.reshape(-1, self.C), index.reshape(-1), num_cells,
                                deterministic=self.deterministic)
        bev = rows.view(B, nz, nx, ny, self.C).permute(0, 1, 4, 2, 3)
        return bev.reshape(B, nz * self.C, nx, ny)

    def lift_splat(self, img: Tensor, depth_map: Optional[Tensor],
                   index: Tensor) -> Tensor:
        if self.with_cp and self.training and torch.is_grad_enabled():
            return checkpoint(self._lift_splat, img, depth_map, index,
                              use_reentrant=False)
        return self._lift_splat(img, depth_map, index)

    def geometry_index(self, camera2lidar: Tensor, cam_intrinsic: Tensor,
                       img_aug_matrix: Tensor, lidar_aug_matrix: Tensor) -> Tensor:
        geom = self.get_geometry(
            camera2lidar[..., :3, :3], camera2lidar[..., :3, 3],
            cam_intrinsic[..., :3, :3], img_aug_matrix[..., :3, :3],
            img_aug_matrix[..., :3, 3], lidar_aug_matrix[..., :3, :3],
            lidar_aug_matrix[..., :3, 3])
        return self.cell_index(geom)


@register(MODELS)
class LSSTransform(BaseViewTransform):
    """LSS view transform with a 1x1 depth-net on image features only.

    Args:
        downsample: 1, or 2 for a stride-2 conv block on the BEV output. Default 1.
        **kwargs: see :class:`BaseViewTransform`.
    """

    def __init__(self, in_channels: int, out_channels: int, *args,
                 downsample: int = 1, **kwargs) -> None:
        super().__init__(in_channels, out_channels, *args, **kwargs)
        self.depthnet = nn.Conv2d(in_channels, self.D + self.C, 1)
        self.downsample = _bev_downsample(out_channels, downsample)

    def depth_and_context(self, img: Tensor, depth_map: Optional[Tensor] = None):
        x = self.depthnet(img.flatten(0, 1))
        return x[:, :self.D].softmax(dim=1), x[:, self.D:self.D + self.C]

    def forward(self, img: Tensor, points, lidar2image, camera_intrinsics: Tensor,
                camera2lidar: Tensor, img_aug_matrix: Tensor, lidar_aug_matrix: Tensor,
                metas=None, **kwargs) -> Tensor:
        """``img``: ``(B, N, C_in, fH, fW)``; matrices ``(B, N, 4, 4)`` / ``(B, 4, 4)``."""
        index = self.geometry_index(camera2lidar, camera_intrinsics, img_aug_matrix,
                                    lidar_aug_matrix)
        return self.downsample(self.lift_splat(img, None, index))


@register(MODELS)
class DepthLSSTransform(BaseViewTransform):
    """LSS view transform whose depth-net also sees a sparse LiDAR depth map.

    The LiDAR points are projected into every (augmented) camera image; the depth map
    goes through ``dtransform`` (to the feature resolution, 64 channels) and is
    concatenated with the image features before ``depthnet``.

    Args:
        downsample: 1, or 2 for a stride-2 conv block on the BEV output. Default 1.
        **kwargs: see :class:`BaseViewTransform`.
    """

    def __init__(self, in_channels: int, out_channels: int, *args,
                 downsample: int = 1, **kwargs) -> None:
        super().__init__(in_channels, out_channels, *args, **kwargs)
        self.dtransform = nn.Sequential(
            nn.Conv2d(1, 8, 1), nn.BatchNorm2d(8), nn.ReLU(True),
            nn.Conv2d(8, 32, 5, stride=4, padding=2), nn.BatchNorm2d(32), nn.ReLU(True),
            nn.Conv2d(32, 64, 5, stride=2, padding=2), nn.BatchNorm2d(64),
            nn.ReLU(True))
        self.depthnet = nn.Sequential(
            nn.Conv2d(in_channels + 64, in_channels, 3, padding=1),
            nn.BatchNorm2d(in_channels), nn.ReLU(True),
            nn.Conv2d(in_channels, in_channels, 3, padding=1),
            nn.BatchNorm2d(in_channels), nn.ReLU(True),
            nn.Conv2d(in_channels, self.D + self.C, 1))
        self.downsample = _bev_downsample(out_channels, downsample)

    def depth_and_context(self, img: Tensor, depth_map: Optional[Tensor]):
        d = self.dtransform(depth_map.flatten(0, 1).to(img.dtype))
        x = self.depthnet(torch.cat([d, img.flatten(0, 1)], dim=1))
        return x[:, :self.D].softmax(dim=1), x[:, self.D:self.D + self.C]

    def lidar_depth_map(self, points: List[Tensor], lidar2image: Tensor,
                        img_aug_matrix: Tensor, lidar_aug_matrix: Tensor,
                        num_cams: int) -> Tensor:
        """``(B, N, 1, H, W)`` fp32 map of LiDAR depths (0 where no point projects).

        Points are in the augmented LiDAR frame: undo ``lidar_aug_matrix``, project
        with ``lidar2image``, apply ``img_aug_matrix``. Where several points hit one
        pixel, the last of them in input order is kept, on every device. Upstream
        writes them all at once: its loop's result on the CPU, an arbitrary one of
        them on CUDA, so two of its runs on one batch differ.
        """
        iH, iW = self.image_size
        device = lidar2image.device
        maps = []
        with _no_autocast(device):
            for b, pts in enumerate(points):
                maps.append(self._one_depth_map(
                    pts[:, :3].float(), lidar2image[b].float(), img_aug_matrix[b].float(),
                    lidar_aug_matrix[b].float(), num_cams, iH, iW))
        return torch.stack(maps).view(len(points), num_cams, 1, iH, iW)

    @staticmethod
    def _one_depth_map(xyz: Tensor, lidar2image: Tensor, img_aug: Tensor,
                       lidar_aug: Tensor, num_cams: int, iH: int, iW: int) -> Tensor:
        xyz = (xyz - lidar_aug[:3, 3]).matmul(torch.linalg.inv_ex(lidar_aug[:3, :3])[0].T)
        cam = torch.einsum('nij,pj->npi', lidar2image[:, :3, :3], xyz)
        cam = cam + lidar2image[:, None, :3, 3]
        dist = cam[..., 2]
        z = dist.clamp(1e-5, 1e5)
        uvz = torch.cat((cam[..., :2] / z.unsqueeze(-1), z.unsqueeze(-1)), -1)
        uvz = torch.einsum('nij,npj->npi', img_aug[:, :3, :3], uvz)
        uv = uvz[..., :2] + img_aug[:, None, :2, 3]
        col, row = uv.unbind(-1)
        on_img = (row >= 0) & (row < iH) & (col >= 0) & (col < iW)
        cam_ix = torch.arange(num_cams, device=xyz.device).view(-1, 1)
        flat = (cam_ix * iH + row.long()) * iW + col.long()
        return _last_write(flat.reshape(-1), dist.reshape(-1), num_cams * iH * iW,
                           keep=on_img.reshape(-1))

    def forward(self, img: Tensor, points: List[Tensor], lidar2image: Tensor,
                cam_intrinsic: Tensor, camera2lidar: Tensor, img_aug_matrix: Tensor,
                lidar_aug_matrix: Tensor, metas=None, **kwargs) -> Tensor:
        """``img``: ``(B, N, C_in, fH, fW)``; ``points``: B tensors ``(P_b, >=3)``;
        camera matrices ``(B, N, 4, 4)``, ``lidar_aug_matrix`` ``(B, 4, 4)``."""
        depth_map = self.lidar_depth_map(points, lidar2image, img_aug_matrix,
                                         lidar_aug_matrix, img.shape[1])
        index = self.geometry_index(camera2lidar, cam_intrinsic, img_aug_matrix,
                                    lidar_aug_matrix)
        return self.downsample(self.lift_splat(img, depth_map, index))
