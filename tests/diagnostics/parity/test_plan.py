"""The planner (mmdet3d_scaling.diagnostics.parity.plan): effective batch, B, K and
process counts -> arrangements and their ``--cfg-options``; errors naming a bad
combination."""
import pytest

from mmdet3d_scaling.diagnostics.parity.errors import ParityError
from mmdet3d_scaling.diagnostics.parity.plan import plan_arrangements, select


def test_plan_total_4_as_1x4_on_1_and_2_processes():
    plan = plan_arrangements(4, 1, 4, nprocs=[2])
    assert [a.name for a in plan] == ['1proc_b1_acc4', '1proc_b4', '2proc_b1_acc2']
    assert [(a.nproc, a.per_gpu_batch, a.accumulation) for a in plan] == [
        (1, 1, 4), (1, 4, 1), (2, 1, 2)]
    assert all(a.total_batch == 4 for a in plan)
    # the recipe keeps the total and fixes the micro-batch (and the cap, so it is legal)
    assert plan[2].overrides() == {'scaling.total_batch_size': 4,
                                   'scaling.per_gpu_batch_size': 1,
                                   'scaling.max_per_gpu_batch_size': 1}
    assert plan[1].overrides()['scaling.per_gpu_batch_size'] == 4

def test_plan_more_process_counts_and_stock():
    plan = plan_arrangements(16, 2, 8, nprocs=[4, 2], stock=True, stock_batch=4)
    assert [a.name for a in plan] == ['1proc_b2_acc8', '1proc_b16', '2proc_b2_acc4',
                                      '4proc_b2_acc2', 'stock']
    assert plan[-1].overrides() == {}  # the config as written

@pytest.mark.parametrize('args, names', [
    ((8, 3, 4, [2]), ['--batch 3 x --accumulation 4 = 12', 'is 8', '2 x 4']),
    ((4, 4, 1, [2]), ['--accumulation 1', 'same run', 'K >= 2']),
    ((6, 2, 3, [2]), ['--accumulation 3 cannot be split over 2 processes',
                      'drop 2 from --nproc']),
    ((4, 1, 4, [1]), ['process count 1 is always run']),
    ((4, 1, 4, [0]), ['process count must be a positive integer, got 0']),
    ((0, 1, 4, [2]), ['total batch must be a positive integer, got 0']),
])
def test_plan_errors_name_the_bad_combination(args, names):
    with pytest.raises(ParityError) as err:
        plan_arrangements(*args[:3], nprocs=args[3])
    for name in names:
        assert name in str(err.value)

def test_only_selects_known_arrangements_and_names_unknown_ones():
    plan = plan_arrangements(4, 1, 4, nprocs=[2])
    assert [a.name for a in select(plan, ['1proc_b4', '1proc_b1_acc4'])] == [
        '1proc_b1_acc4', '1proc_b4']
    with pytest.raises(ParityError, match=r'--only 3proc_b1: no such arrangement.*'
                                          r'planned: 1proc_b1_acc4, 1proc_b4'):
        select(plan, ['3proc_b1'])
