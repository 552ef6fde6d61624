"""The parity benchmark (mmdet3d_scaling.diagnostics.parity, tools/benchmark_parity.py).

The planner (effective batch, B, K, process counts -> arrangements and their
``--cfg-options``, errors naming a bad combination), the config rewrites (schedule,
data root), the statistics, and end to end: the demo config on a few synthetic frames,
2 optimizer steps, trained through tools/train.py and evaluated through tools/test.py
in two arrangements, and a run that fails and is recorded as failed.
"""
import json
import os.path as osp
from pathlib import Path

import pytest
from mmengine.config import Config

from mmdet3d_scaling.diagnostics import parity, parity_cli
from mmdet3d_scaling.diagnostics.parity import ParityError

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / 'configs' / 'demo' / 'pointpillars_synthetic_kitti_cpu.py')


# --------------------------------------------------------------------------- planner
def test_plan_total_4_as_1x4_on_1_and_2_processes():
    plan = parity.plan_arrangements(4, 1, 4, nprocs=[2])
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
    plan = parity.plan_arrangements(16, 2, 8, nprocs=[4, 2], stock=True, stock_batch=4)
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
        parity.plan_arrangements(*args[:3], nprocs=args[3])
    for name in names:
        assert name in str(err.value)


def test_only_selects_known_arrangements_and_names_unknown_ones():
    plan = parity.plan_arrangements(4, 1, 4, nprocs=[2])
    assert [a.name for a in parity.select(plan, ['1proc_b4', '1proc_b1_acc4'])] == [
        '1proc_b1_acc4', '1proc_b4']
    with pytest.raises(ParityError, match=r'--only 3proc_b1: no such arrangement.*'
                                          r'planned: 1proc_b1_acc4, 1proc_b4'):
        parity.select(plan, ['3proc_b1'])


# -------------------------------------------------------------------- config rewrites
def test_schedule_keeps_its_shape_when_shortened():
    cfg = Config.fromfile(DEMO)  # 300 steps: warm-up 0-30, cosine 30-300 (T_max 270)
    out = parity.schedule_overrides(cfg, 150)
    assert out['train_cfg.max_iters'] == 150
    assert out['default_hooks.checkpoint.interval'] == 150
    assert (out['param_scheduler.0.end'], out['param_scheduler.1.begin'],
            out['param_scheduler.1.end'], out['param_scheduler.1.T_max']) == (15, 15,
                                                                              150, 135)
    tiny = parity.schedule_overrides(cfg, 2)  # no empty scheduler range
    assert (tiny['param_scheduler.0.end'], tiny['param_scheduler.1.begin'],
            tiny['param_scheduler.1.end']) == (1, 1, 2)


def test_schedule_of_an_epoch_based_config_is_refused():
    cfg = Config(dict(train_cfg=dict(type='EpochBasedTrainLoop', max_epochs=12)))
    with pytest.raises(ParityError, match='--iters needs an iteration-based config'):
        parity.schedule_overrides(cfg, 10)


def test_data_root_moves_every_derived_path():
    cfg = Config.fromfile(DEMO)
    old = cfg.data_root
    cfg.merge_from_dict(parity.data_root_overrides(cfg, '/elsewhere/kitti'))
    paths = [(p, v) for p, v in parity._walk(cfg.to_dict(), '') if isinstance(v, str)]
    assert not [p for p, v in paths if v.startswith(old)]
    assert cfg.train_dataloader.dataset.dataset.data_root == '/elsewhere/kitti/'
    assert cfg.test_evaluator.ann_file == '/elsewhere/kitti/kitti_infos_val.pkl'


def test_training_options_parse_back_into_a_buildable_config(tmp_path):
    """The training --cfg-options leave validation off entirely (no val_dataloader
    recreated by a data-root path under it) and DictAction reads them back."""
    bench = parity.prepare(DEMO, str(tmp_path), 1, 4, [0], iters=3,
                           data_root=str(tmp_path / 'data'))
    args = parity_cli.parse_args([DEMO, '--batch', '1', '--accumulation', '4',
                               '--cfg-options', *parity.format_options(
                                   bench.runs[0].options)])
    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict(args.cfg_options)
    assert cfg.val_dataloader is None and cfg.val_cfg is None and cfg.val_evaluator is None
    assert cfg.scaling == dict(total_batch_size=4, per_gpu_batch_size=1,
                               max_per_gpu_batch_size=1)
    assert cfg.train_cfg.max_iters == 3 and cfg.default_hooks.logger.interval == 1
    assert cfg.test_dataloader.dataset.data_root == str(tmp_path / 'data') + '/'


# ------------------------------------------------------------------------ statistics
def test_describe():
    d = parity.describe([1.0, 2.0, 3.0])
    assert d == dict(n=3, mean=2.0, std=1.0, min=1.0, max=3.0, spread=2.0)
    assert parity.describe([5.0])['std'] == 0.0
    with pytest.raises(ParityError):
        parity.describe([])


def test_summary_compares_with_the_reference_and_keeps_failures():
    plan = parity.plan_arrangements(4, 1, 4, nprocs=[2])

    def rec(name, seed, ap, status='ok'):
        return dict(arrangement=name, seed=seed, status=status, train_wall_s=10.0,
                    test_wall_s=2.0, metrics={'3D_AP40_moderate': ap})

    records = [rec('1proc_b1_acc4', 0, 5.0), rec('1proc_b1_acc4', 1, 7.0),
               rec('1proc_b4', 0, 6.5), rec('1proc_b4', 1, 8.5),
               rec('2proc_b1_acc2', 0, 20.0), rec('2proc_b1_acc2', 1, 0.0, 'train failed')]
    summary = parity.summarise(records, plan)
    assert summary['1proc_b1_acc4']['metrics']['3D_AP40_moderate']['mean'] == 6.0
    assert summary['1proc_b4']['vs_reference']['3D_AP40_moderate'] == dict(
        delta_mean=1.5, ranges_overlap=True)
    two = summary['2proc_b1_acc2']
    assert two['seeds'] == [0] and two['failed_seeds'] == [1]
    assert two['vs_reference']['3D_AP40_moderate']['ranges_overlap'] is False
    table = parity.markdown_table(summary, metrics=['3D_AP40_moderate'])
    assert '| `1proc_b1_acc4` | 0, 1 | 6.00 ± 1.41 [5.00, 7.00] | 10 | 2 |' in table


def test_table_columns_follow_the_metrics_held():
    def entry(**metrics):
        return dict(seeds=[0], metrics={k: parity.describe([v]) for k, v in metrics.items()})

    nus = parity.markdown_table({'1proc_b1_acc2': entry(mAP=0.25, NDS=0.3)})
    assert '| arrangement | seeds | mAP | NDS |' in nus and '0.25 ± 0.00' in nus
    kitti = parity.markdown_table({'a': entry(**{'3D_AP40_moderate': 4.0})})
    assert '3D AP40 moderate | BEV AP40 moderate' in kitti


def test_loss_per_step_averages_each_accumulation_window(tmp_path):
    log_dir = tmp_path / '20260101_000000'
    (log_dir / 'vis_data').mkdir(parents=True)
    (log_dir / '20260101_000000.log').write_text('')
    lines = [dict(lr=0.1, loss=float(i), iter=i, step=i) for i in range(1, 9)]
    (log_dir / 'vis_data' / 'scalars.json').write_text(
        '\n'.join(json.dumps(line) for line in lines))
    assert parity.loss_per_step(str(tmp_path), 4) == [2.5, 6.5]
    assert parity.loss_per_step(str(tmp_path), 1) == [float(i) for i in range(1, 9)]


def test_headline_metrics():
    prefix = 'Kitti metric/pred_instances_3d/KITTI/'
    got = parity.headline_metrics({prefix + 'Overall_3D_AP40_moderate': 3.0,
                                   prefix + 'Car_BEV_AP40_moderate_strict': 9.0,
                                   prefix + 'Car_BEV_AP40_moderate_loose': 20.0})
    assert got == {'3D_AP40_moderate': 3.0, 'Car_BEV_AP40_moderate': 9.0}
    assert parity.headline_metrics({'NuScenes metric/pred_instances_3d_NuScenes/NDS': 0.4,
                                    'NuScenes metric/pred_instances_3d_NuScenes/mAP': 0.3}
                                   ) == {'NDS': 0.4, 'mAP': 0.3}
    with pytest.raises(ParityError, match='no KITTI AP40 moderate'):
        parity.headline_metrics({'accuracy': 1.0})


# ------------------------------------------------------------------------- the tool
def test_dry_run_prints_every_command_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / 'out'
    assert parity_cli.main([DEMO, '--batch', '1', '--accumulation', '4', '--seeds', '0,1',
                         '--iters', '5', '--out', str(out), '--dry-run']) == 0
    text = capsys.readouterr().out
    assert text.count('tools/train.py') == 4 and text.count('tools/test.py') == 6
    assert 'dist_train.sh ' + DEMO + ' 2 ' in text
    assert 'scaling.per_gpu_batch_size=1' in text and 'scaling.total_batch_size=4' in text
    assert not out.exists()


def test_bad_combination_stops_the_tool_with_the_reason(tmp_path):
    with pytest.raises(SystemExit, match='--accumulation 4 cannot be split over 3'):
        parity_cli.main([DEMO, '--batch', '1', '--accumulation', '4', '--nproc', '3',
                      '--out', str(tmp_path), '--dry-run'])


@pytest.fixture(scope='module')
def tiny_kitti(tmp_path_factory):
    from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
    root = tmp_path_factory.mktemp('parity') / 'kitti'
    write_kitti(str(root), train_frames=8, val_frames=2, seed=0, progress=False)
    return root


def _bench(root, out, *extra) -> int:
    """The tool's main in this process (saves a start-up); the runs are subprocesses."""
    return parity_cli.main(
        [DEMO, '--batch', '1', '--accumulation', '4', '--seeds', '0', '--iters', '2',
         '--data-root', str(root), '--out', str(out),
         '--cfg-options', 'train_dataloader.num_workers=0',
         'test_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
         'test_dataloader.persistent_workers=False', *extra])


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_two_arrangements_end_to_end(tiny_kitti, tmp_path, capsys):
    out = tmp_path / 'out'
    assert _bench(tiny_kitti, out, '--only', '1proc_b1_acc4,1proc_b4') == 0
    report = json.loads((out / 'parity.json').read_text())
    runs = {r['arrangement']: r for r in report['runs']}
    assert set(runs) == {'1proc_b1_acc4', '1proc_b4'}
    for name, loop_iters in (('1proc_b1_acc4', 8), ('1proc_b4', 2)):
        run = runs[name]
        assert run['status'] == 'ok' and run['seed'] == 0
        # 2 optimizer steps: 8 micro-batches of 1 or 2 batches of 4 (the recipe's plan)
        assert osp.basename(parity.last_checkpoint(run['work_dir'])) == \
            f'iter_{loop_iters}.pth'
        assert len(run['loss_curve']) == 2
        assert {'3D_AP40_moderate', 'BEV_AP40_moderate',
                'Car_3D_AP40_moderate'} <= set(run['metrics'])
        assert run['train_wall_s'] > 0 and run['test_wall_s'] > 0
        assert f'scaling.per_gpu_batch_size={1 if loop_iters == 8 else 4}' in \
            run['cfg_options']
        assert report['summary'][name]['metrics']['3D_AP40_moderate']['n'] == 1
    assert (out / 'parity.png').stat().st_size > 0
    assert report['total_batch'] == 4 and report['iters'] == 2
    # a second call reuses the finished runs instead of training again
    assert _bench(tiny_kitti, out, '--only', '1proc_b1_acc4,1proc_b4') == 0
    assert 'reusing the finished run' in capsys.readouterr().out
    again = json.loads((out / 'parity.json').read_text())
    assert [r['train_wall_s'] for r in again['runs']] == [
        r['train_wall_s'] for r in report['runs']]


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_a_failed_run_is_recorded_and_the_tool_exits_1(tiny_kitti, tmp_path):
    out = tmp_path / 'out'
    assert _bench(tiny_kitti, out, 'model.voxel_encoder.type=NoSuchEncoder',
                  '--only', '1proc_b4') == 1
    run = json.loads((out / 'parity.json').read_text())['runs'][0]
    assert run['status'] == 'train failed (exit 1)'
    assert 'NoSuchEncoder' in run['log_tail']


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_runs_at_once_keep_the_plan_order(tiny_kitti, tmp_path, capsys):
    out = tmp_path / 'out'
    assert _bench(tiny_kitti, out, '--only', '1proc_b1_acc4,1proc_b4', '--jobs', '2') == 0
    report = json.loads((out / 'parity.json').read_text())
    assert [r['arrangement'] for r in report['runs']] == ['1proc_b1_acc4', '1proc_b4']
    assert all(r['status'] == 'ok' for r in report['runs'])
    assert report['jobs'] == 2 and [r['runs_at_once'] for r in report['runs']] == [2, 2]
    assert capsys.readouterr().out.count(': queued, work dir ') == 2


def test_jobs_must_be_positive(tiny_kitti, tmp_path):
    with pytest.raises(SystemExit, match='--jobs must be a positive integer, got 0'):
        _bench(tiny_kitti, tmp_path / 'out', '--only', '1proc_b4', '--jobs', '0')
    assert not (tmp_path / 'out' / 'runs').exists()
