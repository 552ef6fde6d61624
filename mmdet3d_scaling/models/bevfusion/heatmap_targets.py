"""Gaussian heatmap targets of ``TransFusionHead``, computed on the host in one pass.

Upstream draws each ground-truth box with a dozen 0-dim tensor operations on the GPU and
reads several of them back (``width <= 0``, ``int(radius)``, ``int(label)``, the centre):
about ten host synchronisations and twenty launches per box, so the loss of a batch of
four nuScenes frames left the GPU idle for ~130 ms on an H200. Here the boxes are copied
to the host once, the radii and centres of all boxes are computed as vectors with the
same float32 operations in the same order, the Gaussians are drawn into a host array
the way mmdet3d's ``draw_heatmap_gaussian`` draws them (its own ``gaussian_2d`` kernels,
cached by radius), and the map's set cells go to the device in one copy.

Exactness: every step is elementwise float32 arithmetic, so a vector gives each box the
bits a 0-dim tensor gives it, with one device difference that is reproduced on purpose:
CUDA divides a tensor by a Python number as a multiplication by its float32 reciprocal,
the CPU divides. ``device`` names whose rounding to follow; tests compare both against
upstream's loop.
"""
import functools
from typing import Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from mmdet3d.models.utils.gaussian import gaussian_2d


def scalar_div(x: Tensor, divisor: float, cuda: bool) -> Tensor:
    """``x / divisor`` rounded as torch rounds it on CUDA (``cuda``) or on the CPU."""
    if cuda:  # ATen's CUDA div with a CPU scalar: a * (1.0f / float(b))
        return x * float(np.float32(1.0) / np.float32(divisor))
    return x / divisor


def gaussian_radii(height: Tensor, width: Tensor, min_overlap: float,
                   cuda: bool) -> Tensor:
    """mmdet3d's ``gaussian_radius`` for vectors of box sizes (same operation order)."""
    b1 = height + width
    c1 = scalar_div(width * height * (1 - min_overlap), 1 + min_overlap, cuda)
    r1 = (b1 + torch.sqrt(b1 ** 2 - 4 * c1)) / 2
    b2 = 2 * (height + width)
    c2 = (1 - min_overlap) * width * height
    r2 = (b2 + torch.sqrt(b2 ** 2 - 4 * 4 * c2)) / 2
    a3 = 4 * min_overlap
    b3 = -2 * min_overlap * (height + width)
    c3 = (min_overlap - 1) * width * height
    r3 = (b3 + torch.sqrt(b3 ** 2 - 4 * a3 * c3)) / 2
    return torch.minimum(torch.minimum(r1, r2), r3)


def box_centres_and_radii(boxes: Tensor, voxel_size: Sequence[float],
                          point_cloud_range: Sequence[float], out_size_factor: int,
                          gaussian_overlap: float, min_radius: int,
                          cuda: bool) -> Tuple[Tensor, Tensor, Tensor]:
    """Heatmap cell ``(col, row)`` and radius of each drawable box, and which are.

    Args:
        boxes (Tensor): ``[N, >=5]`` float32 host tensor: gravity centre x, y, z, then
            dx, dy (metres).

    Returns:
        tuple: ``keep [N]`` (positive BEV size), ``centres [M, 2]`` int32 and
        ``radii [M]`` int64 of the kept boxes.
    """
    osf = out_size_factor
    width = scalar_div(scalar_div(boxes[:, 3], voxel_size[0], cuda), osf, cuda)
    length = scalar_div(scalar_div(boxes[:, 4], voxel_size[1], cuda), osf, cuda)
    keep = (width > 0) & (length > 0)
    width, length, boxes = width[keep], length[keep], boxes[keep]
    radii = gaussian_radii(length, width, gaussian_overlap, cuda).to(torch.int64)
    radii = radii.clamp(min=min_radius)
    cx = scalar_div(scalar_div(boxes[:, 0] - point_cloud_range[0], voxel_size[0], cuda),
                    osf, cuda)
    cy = scalar_div(scalar_div(boxes[:, 1] - point_cloud_range[1], voxel_size[1], cuda),
                    osf, cuda)
    centres = torch.stack([cy, cx], dim=1).to(torch.int32)
    return keep, centres, radii


@functools.lru_cache(maxsize=None)
def _gaussian(radius: int) -> np.ndarray:
    """mmdet3d's Gaussian of a radius, as the float32 values it is drawn with."""
    diameter = 2 * radius + 1
    kernel = gaussian_2d((diameter, diameter), sigma=diameter / 6).astype(np.float32)
    kernel.setflags(write=False)
    return kernel


def draw_heatmap(labels: Tensor, centres: Tensor, radii: Tensor, num_classes: int,
                 x_size: int, y_size: int) -> Tensor:
    """:func:`draw_heatmap_array` as a tensor (sharing its memory)."""
    return torch.from_numpy(draw_heatmap_array(labels, centres, radii, num_classes,
                                               x_size, y_size))


def draw_heatmap_array(labels: Tensor, centres: Tensor, radii: Tensor, num_classes: int,
                       x_size: int, y_size: int) -> np.ndarray:
    """``[K, X, Y]`` host heatmap with one Gaussian per box: :func:`heatmap_cells`
    written into zeros."""
    heatmap = np.zeros((num_classes, x_size, y_size), dtype=np.float32)
    cells, values = heatmap_cells(labels, centres, radii, num_classes, x_size, y_size)
    heatmap.reshape(-1)[cells] = values
    return heatmap


def check_labels(labels: np.ndarray, num_classes: int) -> None:
    """A clear error for a ground-truth label that is no class index: upstream's
    ``heatmap[label]`` raises for ``label >= K`` and draws a negative one into another
    class; set cells of a batch would land in the next sample's map."""
    bad = labels[(labels < 0) | (labels >= num_classes)]
    if len(bad):
        raise ValueError(f'heatmap target: ground-truth label {int(bad[0])} is not a class '
                         f'index 0..{num_classes - 1}; filter the boxes of other classes '
                         "(ObjectNameFilter) or set the head's num_classes.")


def heatmap_cells(labels: Tensor, centres: Tensor, radii: Tensor, num_classes: int,
                  x_size: int, y_size: int,
                  maps: Optional[Tensor] = None) -> Tuple[np.ndarray, np.ndarray]:
    """The cells of the ``[K, X, Y]`` heatmap that the Gaussians set: flat indices
    (int64, ascending, each once) and float32 values; every other cell is 0.

    mmdet3d's ``draw_heatmap_gaussian`` draws each box's Gaussian into the window of the
    plane around its centre (centre ``(x, y)`` = column, row), clipped to the plane, and
    keeps the elementwise maximum where Gaussians overlap. Its window arithmetic selects
    exactly the kernel cells ``(row - y + r, col - x + r)`` whose plane cell is inside the
    plane, for any centre (outside the plane too), so the boxes are drawn here as vectors,
    one group per radius, with the same float32 kernel values: the same cells and
    values. NumPy, not torch: no intra-op thread pool is woken on a host that the loader
    workers keep busy (a 10 x 180 x 180 ``torch.zeros`` alone took 5-10 ms there); and no
    Python step per box, which on a drawing thread holds the GIL that the main thread
    needs. A batch's map has few set cells (7,424 of 1.3 M for 4 x 40 random boxes), so
    the map travels to the GPU as these cells (tens of KB) instead of 5 MB.

    Args:
        maps (Tensor, optional): ``[M]`` index of the map each box belongs to, for a
            batch of ``[B, K, X, Y]`` maps drawn at once (flat indices then address the
            batch). Default: one map.
    """
    labels = labels.numpy().astype(np.int64)
    check_labels(labels, num_classes)
    plane = x_size * y_size
    if maps is not None:
        labels = labels + maps.numpy().astype(np.int64) * num_classes
    x, y = centres.numpy().astype(np.int64).T
    radii = radii.numpy().astype(np.int64)
    found_cells, found_values = [], []
    for radius in np.unique(radii).tolist():
        box = np.flatnonzero(radii == radius)
        offsets = np.arange(-radius, radius + 1)
        rows = y[box, None, None] + offsets[None, :, None]  # [n, D, 1]
        cols = x[box, None, None] + offsets[None, None, :]  # [n, 1, D]
        inside = (rows >= 0) & (rows < x_size) & (cols >= 0) & (cols < y_size)
        cells = labels[box, None, None] * plane + rows * y_size + cols
        found_cells.append(cells[inside])
        found_values.append(np.broadcast_to(_gaussian(radius), inside.shape)[inside])
    if not found_cells:
        return np.zeros(0, np.int64), np.zeros(0, np.float32)
    cells = np.concatenate(found_cells)
    values = np.concatenate(found_values)
    order = np.argsort(cells, kind='stable')
    cells, values = cells[order], values[order]
    first = np.flatnonzero(np.concatenate([[True], cells[1:] != cells[:-1]]))
    cells, values = cells[first], np.maximum.reduceat(values, first)
    set_ = values != 0  # Gaussian tails cut to 0 leave the cell as it was
    return cells[set_], values[set_]
