"""The statistics (mmdet3d_scaling.diagnostics.parity.summary): per arrangement over
seeds, compared with the reference, as the docs' table."""
import pytest

from mmdet3d_scaling.diagnostics.parity.errors import ParityError
from mmdet3d_scaling.diagnostics.parity.plan import plan_arrangements
from mmdet3d_scaling.diagnostics.parity.summary import describe, markdown_table, summarise


def test_describe():
    d = describe([1.0, 2.0, 3.0])
    assert d == dict(n=3, mean=2.0, std=1.0, min=1.0, max=3.0, spread=2.0)
    assert describe([5.0])['std'] == 0.0
    with pytest.raises(ParityError):
        describe([])

def test_summary_compares_with_the_reference_and_keeps_failures():
    plan = plan_arrangements(4, 1, 4, nprocs=[2])

    def rec(name, seed, ap, status='ok'):
        return dict(arrangement=name, seed=seed, status=status, train_wall_s=10.0,
                    test_wall_s=2.0, metrics={'3D_AP40_moderate': ap})

    records = [rec('1proc_b1_acc4', 0, 5.0), rec('1proc_b1_acc4', 1, 7.0),
               rec('1proc_b4', 0, 6.5), rec('1proc_b4', 1, 8.5),
               rec('2proc_b1_acc2', 0, 20.0), rec('2proc_b1_acc2', 1, 0.0, 'train failed')]
    summary = summarise(records, plan)
    assert summary['1proc_b1_acc4']['metrics']['3D_AP40_moderate']['mean'] == 6.0
    assert summary['1proc_b4']['vs_reference']['3D_AP40_moderate'] == dict(
        delta_mean=1.5, ranges_overlap=True)
    two = summary['2proc_b1_acc2']
    assert two['seeds'] == [0] and two['failed_seeds'] == [1]
    assert two['vs_reference']['3D_AP40_moderate']['ranges_overlap'] is False
    table = markdown_table(summary, metrics=['3D_AP40_moderate'])
    assert '| `1proc_b1_acc4` | 0, 1 | 6.00 ± 1.41 [5.00, 7.00] | 10 | 2 |' in table

def test_table_columns_follow_the_metrics_held():
    def entry(**metrics):
        return dict(seeds=[0], metrics={k: describe([v]) for k, v in metrics.items()})

    nus = markdown_table({'1proc_b1_acc2': entry(mAP=0.25, NDS=0.3)})
    assert '| arrangement | seeds | mAP | NDS |' in nus and '0.25 ± 0.00' in nus
    kitti = markdown_table({'a': entry(**{'3D_AP40_moderate': 4.0})})
    assert '3D AP40 moderate | BEV AP40 moderate' in kitti
