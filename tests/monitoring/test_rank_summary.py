"""The cross-rank summary: the arithmetic on a table, and the gather with gloo ranks."""
import json
import math
import socket
from pathlib import Path

import pytest
import torch

from mmdet3d_scaling.monitoring.rank_summary import ACROSS_RANK_KEYS, across_ranks, spread
from tests.multiprocess import start_ranks


def test_spread_of_a_table():
    nan = math.nan
    table = torch.tensor([[10.0, 0.1, 100.0, nan],
                          [30.0, 0.4, 300.0, 50.0]], dtype=torch.float64)
    values = spread(table)
    assert values == dict(samples_per_s_min=10.0, samples_per_s_max=30.0,
                          samples_per_s_global=40.0,
                          data_wait_share_min=pytest.approx(0.1),
                          data_wait_share_max=pytest.approx(0.4),
                          data_wait_share_max_rank=1.0,
                          mem_peak_mb_min=100.0, mem_peak_mb_max=300.0)
    assert 'util_pct_min' not in values  # rank 0 does not know it


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _rank(rank: int, out: str, port: int) -> None:
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    try:
        mine = dict(samples_per_s=10.0 * (rank + 1), data_wait_share=0.5 - 0.25 * rank)
        Path(out, f'{rank}.json').write_text(json.dumps(across_ranks(mine)))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_across_ranks_with_two_gloo_processes(tmp_path):
    start_ranks(_rank, (str(tmp_path), _free_port()), nprocs=2, cpu_only=True)
    results = [json.loads((tmp_path / f'{r}.json').read_text()) for r in (0, 1)]
    assert results[0] == results[1]  # every rank gets the same summary
    assert results[0] == dict(samples_per_s_min=10.0, samples_per_s_max=20.0,
                              samples_per_s_global=30.0, data_wait_share_min=0.25,
                              data_wait_share_max=0.5, data_wait_share_max_rank=0.0)
    assert set(ACROSS_RANK_KEYS) >= {'samples_per_s', 'data_wait_share'}
