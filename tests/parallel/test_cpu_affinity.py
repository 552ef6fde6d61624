"""``distributed.cpu_affinity='split'``: CPU shares per local rank.

The share computation on synthetic topologies (plain values, and sysfs trees written as
real files), the config check, and one real 2-process gloo run through torchrun where
each rank and one of its loader workers write down the CPUs they may run on.
"""
import json
import os
from typing import Dict, FrozenSet, List

import pytest
import torch
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.preparation import prepare_config
from mmdet3d_scaling.parallel import cpu_affinity as ca
from mmdet3d_scaling.parallel.cpu_affinity import (apply_cpu_affinity,
                                                          format_cpu_list, parse_cpu_list,
                                                          split_cpus)
from tests.parallel.dist_parts import toy_cfg
from tests.multiprocess import run_torchrun

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else []


def shares(allowed, siblings, numa, ranks) -> List[List[int]]:
    return [split_cpus(allowed, siblings, numa, r, ranks) for r in range(ranks)]


def ht_pairs(cores: int) -> Dict[int, FrozenSet[int]]:
    """Hyperthread pairs (0, cores), (1, cores + 1), ... as Linux numbers them."""
    return {cpu: frozenset({cpu % cores, cpu % cores + cores})
            for cpu in range(2 * cores)}


def assert_partition(parts, allowed) -> None:
    flat = [cpu for part in parts for cpu in part]
    assert len(flat) == len(set(flat)), f'shares overlap: {parts}'
    assert set(flat) == set(allowed)


# ------------------------------------------------------------- shares, plain values
def test_cpu_list_format_round_trip():
    assert parse_cpu_list('0-3,8,10-11\n') == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == '0-3,8,10-11'
    assert format_cpu_list([5]) == '5'


def test_sixteen_cpus_two_ranks_contiguous_halves():
    parts = shares(range(16), None, None, 2)
    assert parts == [list(range(8)), list(range(8, 16))]


def test_uneven_count_differs_by_one_cpu_at_most():
    parts = shares(range(7), None, None, 3)
    assert_partition(parts, range(7))
    assert sorted(len(p) for p in parts) == [2, 2, 3]


def test_hyperthread_siblings_stay_together():
    # 8 cores, CPU c and c + 8 on one core: halves by CPU number would give each rank
    # one thread of every core; whole cores go 0-3 + 8-11 and 4-7 + 12-15
    parts = shares(range(16), ht_pairs(8), None, 2)
    assert parts == [[0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]]
    for part in parts:
        for cpu in part:
            assert ht_pairs(8)[cpu] <= set(part)


def test_numa_nodes_keep_a_share_inside_one_node():
    # nodes interleaved with the core numbering: node 0 = 0-3 + 8-11 (cores 0-3)
    numa = {0: [0, 1, 2, 3, 8, 9, 10, 11], 1: [4, 5, 6, 7, 12, 13, 14, 15]}
    parts = shares(range(16), ht_pairs(8), numa, 4)
    assert parts == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    # without sibling information too: 0-3 and 8-11 are node 0, not 0-7
    parts = shares(range(16), None, numa, 2)
    assert parts == [numa[0], numa[1]]


def test_numa_split_that_would_starve_a_rank_is_not_taken():
    # node 0 has 6 CPUs, node 1 only 2: inside nodes, one rank would get 2 CPUs where
    # an even split gives both 4; the even split wins (ranks wait for the slowest)
    parts = shares(range(8), None, {0: range(6), 1: range(6, 8)}, 2)
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_whole_cores_give_way_when_a_share_would_be_short():
    # 16 CPUs on 8 two-thread cores, 3 ranks: whole cores give 6/4/6, one CPU less
    # than an even split's 5; single CPUs in core order give 5/6/5
    parts = shares(range(16), ht_pairs(8), None, 3)
    assert_partition(parts, range(16))
    assert min(len(p) for p in parts) == 5


def test_a_restricted_allowed_set():
    assert shares({2, 3, 5, 7}, None, None, 2) == [[2, 3], [5, 7]]
    assert shares({2, 3, 5, 7}, None, None, 4) == [[2], [3], [5], [7]]
    # with 3 and 7 on one core the only whole-core split is 3 + 1 CPUs: even wins
    siblings = {cpu: frozenset({cpu % 4, cpu % 4 + 4}) for cpu in range(8)}
    parts = shares({2, 3, 5, 7}, siblings, None, 2)
    assert_partition(parts, {2, 3, 5, 7})
    assert [len(p) for p in parts] == [2, 2]


def test_two_cpus_two_ranks_one_each():
    assert shares({0, 1}, {0: frozenset({0}), 1: frozenset({1})}, {0: {0, 1}}, 2) == \
        [[0], [1]]


def test_fewer_cpus_than_ranks_is_an_error_naming_the_counts():
    with pytest.raises(ValueError, match=r'3 CPU\(s\) allowed \(0-2\) for 4 local ranks'
                       r'.*cpu_affinity=None'):
        split_cpus({0, 1, 2}, None, None, 0, 4)
    with pytest.raises(ValueError, match='local rank 2 is outside 0..1'):
        split_cpus(range(4), None, None, 2, 2)


# ------------------------------------------------------------- sysfs as real files
def _write_sysfs(root, siblings: Dict[int, str], nodes: Dict[int, str]) -> str:
    for cpu, text in siblings.items():
        topo = root / 'devices' / 'system' / 'cpu' / f'cpu{cpu}' / 'topology'
        topo.mkdir(parents=True)
        (topo / 'thread_siblings_list').write_text(text + '\n')
    for node, text in nodes.items():
        path = root / 'devices' / 'system' / 'node' / f'node{node}'
        path.mkdir(parents=True)
        (path / 'cpulist').write_text(text + '\n')
    return str(root)


def test_topology_read_from_a_sysfs_tree(tmp_path):
    root = _write_sysfs(tmp_path, {c: f'{c % 4},{c % 4 + 4}' for c in range(8)},
                        {0: '0-1,4-5', 1: '2-3,6-7'})
    siblings = ca.read_siblings(range(8), root)
    nodes = ca.read_numa_nodes(root)
    assert siblings[1] == {1, 5} and nodes == {0: {0, 1, 4, 5}, 1: {2, 3, 6, 7}}
    assert shares(range(8), siblings, nodes, 2) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert ca.describe_share([0, 1, 4, 5], nodes) == '0-1,4-5 (4 CPUs, NUMA node 0)'


def test_unreadable_topology_means_plain_cpus(tmp_path):
    assert ca.read_siblings(range(4), str(tmp_path)) == {}
    assert ca.read_numa_nodes(str(tmp_path)) == {}


def test_this_machine_topology_is_readable_or_empty():
    siblings = ca.read_siblings(ALLOWED)
    assert all(cpu in siblings[cpu] for cpu in siblings)
    for members in ca.read_numa_nodes().values():
        assert members


# ------------------------------------------------------------- config and runner
def test_bad_value_is_an_error_naming_value_and_choices(tmp_path):
    with pytest.raises(ValueError, match=r"distributed.cpu_affinity must be None or one "
                       r"of \('split',\), got 'yes'"):
        prepare_config(toy_cfg(str(tmp_path), launcher='pytorch',
                               distributed=dict(cpu_affinity='yes')))


def test_the_key_is_not_a_wrapper_option(tmp_path):
    cfg = prepare_config(toy_cfg(str(tmp_path), launcher='pytorch',
                                 distributed=dict(cpu_affinity='split')))
    assert 'cpu_affinity' not in cfg.model_wrapper_cfg


@pytest.mark.parametrize('environ,reason', [
    ({}, 'no LOCAL_RANK / LOCAL_WORLD_SIZE'),
    ({'LOCAL_RANK': '0', 'LOCAL_WORLD_SIZE': '1'}, 'one rank on this host')])
def test_nothing_to_split_leaves_the_process_alone(environ, reason, capsys):
    before = os.sched_getaffinity(0)
    assert apply_cpu_affinity(dict(cpu_affinity='split'), None, environ) is None
    assert os.sched_getaffinity(0) == before
    assert reason in capsys.readouterr().out
    assert apply_cpu_affinity(dict(cpu_affinity=None), None, environ) is None


@pytest.mark.skipif(len(ALLOWED) < 2, reason='needs 2 CPUs to split')
def test_a_second_runner_in_one_process_splits_the_original_set():
    threads = torch.get_num_threads()
    environ = {'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '2'}
    try:
        first = apply_cpu_affinity(dict(cpu_affinity='split'), None, environ)
        again = apply_cpu_affinity(dict(cpu_affinity='split'), None, environ)
        assert first == again == sorted(os.sched_getaffinity(0))
        assert set(first) < set(ALLOWED)
        assert torch.get_num_threads() <= len(first)
    finally:
        os.sched_setaffinity(0, ALLOWED)
        torch.set_num_threads(threads)
        ca._last_split = None


def test_single_process_runner_keeps_its_cpus(tmp_path, monkeypatch):
    for name in ('LOCAL_RANK', 'LOCAL_WORLD_SIZE'):
        monkeypatch.delenv(name, raising=False)
    before = os.sched_getaffinity(0)
    Runner.from_cfg(toy_cfg(str(tmp_path), distributed=dict(cpu_affinity='split')))
    assert os.sched_getaffinity(0) == before


# ------------------------------------------------------------- torchrun, 2 gloo ranks
WORKER = r'''
import json, os, sys
import torch
from mmengine.registry import DATASETS
from mmengine.runner import Runner
import mmdet3d_scaling
from tests.parallel.dist_parts import toy_cfg
from tests.toy import ToyDataset

OUT = sys.argv[1]

@DATASETS.register_module(name='AffinityRecordingDataset', force=True)
class AffinityRecordingDataset(ToyDataset):
    """Writes the CPUs of the process that loads the samples (a loader worker)."""
    def __getitem__(self, idx):
        info = torch.utils.data.get_worker_info()
        path = os.path.join(OUT, f'worker_rank{os.environ["RANK"]}.json')
        if info is not None and not os.path.exists(path):
            with open(path, 'w') as f:
                json.dump(sorted(os.sched_getaffinity(0)), f)
        return super().__getitem__(idx)

cfg = toy_cfg(os.path.join(OUT, 'work'), launcher='pytorch', max_iters=2, length=8,
              log_level='INFO', distributed=dict(cpu_affinity='split'))
cfg.train_dataloader.dataset.type = 'AffinityRecordingDataset'
cfg.train_dataloader.num_workers = 1
runner = Runner.from_cfg(cfg)
main = dict(cpus=sorted(os.sched_getaffinity(0)), threads=torch.get_num_threads())
runner.train()
with open(os.path.join(OUT, f'rank{os.environ["RANK"]}.json'), 'w') as f:
    json.dump(main, f)
'''


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.skipif(len(ALLOWED) < 2, reason='2 ranks need 2 CPUs to split')
def test_two_ranks_under_torchrun_get_disjoint_shares(tmp_path):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    done = run_torchrun(script, [tmp_path], 2, cwd=tmp_path, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    ranks = [json.loads((tmp_path / f'rank{r}.json').read_text()) for r in range(2)]
    workers = [json.loads((tmp_path / f'worker_rank{r}.json').read_text())
               for r in range(2)]
    assert_partition([r['cpus'] for r in ranks], ALLOWED)  # the launcher's set, split
    assert abs(len(ranks[0]['cpus']) - len(ranks[1]['cpus'])) <= 1
    for rank, worker in zip(ranks, workers):
        assert worker == rank['cpus']  # the forked loader worker inherited the share
        assert rank['threads'] <= len(rank['cpus'])
    # rank 0's line is on the console (mmengine shows no other rank's log there)
    cpus = [format_cpu_list(rank['cpus']) for rank in ranks]
    assert (f"distributed.cpu_affinity='split': local rank 0 of 2 -> CPUs {cpus[0]} "
            f"({len(ranks[0]['cpus'])} CPU") in log, log[-4000:]
    assert f'local ranks 0-1: {cpus[0]} | {cpus[1]}' in log
