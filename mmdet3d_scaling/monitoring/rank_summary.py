"""Min / max of a few figures over the ranks, with one small all_gather per report."""
import math
from typing import Dict, Mapping, Sequence

import torch
import torch.distributed as torch_dist
from mmengine.dist import get_comm_device, get_world_size

#: figures compared across ranks, in the order of the gathered vector
ACROSS_RANK_KEYS = ('samples_per_s', 'data_wait_share', 'mem_peak_mb', 'util_pct')


def spread(table: torch.Tensor, keys: Sequence[str] = ACROSS_RANK_KEYS) -> Dict[str, float]:
    """``<key>_min`` / ``<key>_max`` of a ranks x keys table (NaN: not known there).

    A key that some rank does not know is left out. ``samples_per_s`` also gives
    ``samples_per_s_global`` (the sum), ``data_wait_share`` gives
    ``data_wait_share_max_rank`` (the rank that waited most).
    """
    values: Dict[str, float] = {}
    for col, key in enumerate(keys):
        column = table[:, col]
        if not bool((~torch.isnan(column)).all()):
            continue
        values[f'{key}_min'] = float(column.min())
        values[f'{key}_max'] = float(column.max())
        if key == 'samples_per_s':
            values['samples_per_s_global'] = float(column.sum())
        if key == 'data_wait_share':
            values['data_wait_share_max_rank'] = float(int(column.argmax()))
    return values


def across_ranks(values: Mapping[str, float],
                 keys: Sequence[str] = ACROSS_RANK_KEYS) -> Dict[str, float]:
    """:func:`spread` of this rank's ``values`` and every other rank's.

    A collective: every rank of the default process group must call it, with the same
    ``keys``. One all_gather of ``len(keys)`` float64 values on the backend's device.
    """
    local = torch.tensor([values.get(k, math.nan) for k in keys], dtype=torch.float64)
    local = local.to(get_comm_device())
    gathered = [torch.empty_like(local) for _ in range(get_world_size())]
    torch_dist.all_gather(gathered, local)
    return spread(torch.stack(gathered).cpu(), keys)
