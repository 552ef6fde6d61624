"""The parity tool (mmdet3d_scaling.diagnostics.parity_cli, tools/benchmark_parity.py).

The dry run and the errors that stop it, and end to end: the demo config on a few
synthetic frames, 2 optimizer steps, trained through tools/train.py and evaluated through
tools/test.py in two arrangements at once, reused by a second call, and a run that fails
and is recorded as failed.
"""
import json
import os.path as osp
from pathlib import Path

import pytest

from mmdet3d_scaling.diagnostics import parity_cli
from mmdet3d_scaling.diagnostics.parity.logs import last_checkpoint

REPO = Path(__file__).resolve().parents[2]
DEMO = str(REPO / 'configs' / 'demo' / 'pointpillars_synthetic_kitti_cpu.py')


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


def test_jobs_must_be_positive(tiny_kitti, tmp_path):
    with pytest.raises(SystemExit, match='--jobs must be a positive integer, got 0'):
        _bench(tiny_kitti, tmp_path / 'out', '--only', '1proc_b4', '--jobs', '0')
    assert not (tmp_path / 'out' / 'runs').exists()


@pytest.mark.slow  # trains and tests twice in subprocesses
def test_two_arrangements_at_once_end_to_end_then_reused(tiny_kitti, tmp_path, capsys):
    """Two runs at once (``--jobs 2``) are reported in plan order with their metrics and
    loss curves; a second call, one run at a time, reuses them instead of training."""
    out = tmp_path / 'out'
    assert _bench(tiny_kitti, out, '--only', '1proc_b1_acc4,1proc_b4', '--jobs', '2') == 0
    assert capsys.readouterr().out.count(': queued, work dir ') == 2
    report = json.loads((out / 'parity.json').read_text())
    assert [r['arrangement'] for r in report['runs']] == ['1proc_b1_acc4', '1proc_b4']
    assert report['jobs'] == 2 and [r['runs_at_once'] for r in report['runs']] == [2, 2]
    runs = {r['arrangement']: r for r in report['runs']}
    for name, loop_iters in (('1proc_b1_acc4', 8), ('1proc_b4', 2)):
        run = runs[name]
        assert run['status'] == 'ok' and run['seed'] == 0
        # 2 optimizer steps: 8 micro-batches of 1 or 2 batches of 4 (the recipe's plan)
        assert osp.basename(last_checkpoint(run['work_dir'])) == f'iter_{loop_iters}.pth'
        assert len(run['loss_curve']) == 2
        assert {'3D_AP40_moderate', 'BEV_AP40_moderate',
                'Car_3D_AP40_moderate'} <= set(run['metrics'])
        assert run['train_wall_s'] > 0 and run['test_wall_s'] > 0
        assert f'scaling.per_gpu_batch_size={1 if loop_iters == 8 else 4}' in \
            run['cfg_options']
        assert report['summary'][name]['metrics']['3D_AP40_moderate']['n'] == 1
    assert (out / 'parity.png').stat().st_size > 0
    assert report['total_batch'] == 4 and report['iters'] == 2
    assert _bench(tiny_kitti, out, '--only', '1proc_b1_acc4,1proc_b4') == 0
    assert capsys.readouterr().out.count('reusing the finished run') == 2
    again = json.loads((out / 'parity.json').read_text())
    assert [r['train_wall_s'] for r in again['runs']] == [
        r['train_wall_s'] for r in report['runs']]


@pytest.mark.slow  # a subprocess that fails to build the model
def test_a_failed_run_is_recorded_and_the_tool_exits_1(tiny_kitti, tmp_path):
    out = tmp_path / 'out'
    assert _bench(tiny_kitti, out, 'model.voxel_encoder.type=NoSuchEncoder',
                  '--only', '1proc_b4') == 1
    run = json.loads((out / 'parity.json').read_text())['runs'][0]
    assert run['status'] == 'train failed (exit 1)'
    assert 'NoSuchEncoder' in run['log_tail']
