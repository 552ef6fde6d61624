"""Ops of the BEVFusion camera branch, in PyTorch (Triton optional)."""
from .bev_pool import (NUM_DUMP_ROWS, bev_pool, cell_index, geometry_cell_index,
                       pool_depth_context, pool_frustum)

__all__ = [
    'NUM_DUMP_ROWS', 'bev_pool', 'cell_index', 'geometry_cell_index',
    'pool_depth_context', 'pool_frustum'
]
