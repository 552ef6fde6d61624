"""Preparing a benchmark (mmdet3d_scaling.diagnostics.parity.benchmark): the runs'
``--cfg-options`` and what the launch builds from them
(mmdet3d_scaling.diagnostics.parity.launch)."""
import json
from pathlib import Path

from mmengine.config import Config

from mmdet3d_scaling.diagnostics import parity_cli
from mmdet3d_scaling.diagnostics.parity.benchmark import prepare
from mmdet3d_scaling.diagnostics.parity.launch import RESULT_FILE, finished_record
from mmdet3d_scaling.diagnostics.parity.overrides import format_options

DEMO = str(Path(__file__).resolve().parents[3] / 'configs' / 'demo' /
           'pointpillars_synthetic_kitti_cpu.py')


def test_training_options_parse_back_into_a_buildable_config(tmp_path):
    """The training --cfg-options leave validation off entirely (no val_dataloader
    recreated by a data-root path under it) and DictAction reads them back."""
    bench = prepare(DEMO, str(tmp_path), 1, 4, [0], iters=3,
                           data_root=str(tmp_path / 'data'))
    args = parity_cli.parse_args([DEMO, '--batch', '1', '--accumulation', '4',
                               '--cfg-options', *format_options(
                                   bench.runs[0].options)])
    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict(args.cfg_options)
    assert cfg.val_dataloader is None and cfg.val_cfg is None and cfg.val_evaluator is None
    assert cfg.scaling == dict(total_batch_size=4, per_gpu_batch_size=1,
                               max_per_gpu_batch_size=1)
    assert cfg.train_cfg.max_iters == 3 and cfg.default_hooks.logger.interval == 1
    assert cfg.test_dataloader.dataset.data_root == str(tmp_path / 'data') + '/'


def test_runs_seed_by_seed_with_their_commands(tmp_path):
    """Every arrangement of a seed before the next seed; 1 process through
    tools/train.py, N through tools/dist_train.sh; the test reads the run's checkpoint."""
    bench = prepare(DEMO, str(tmp_path), 1, 4, [0, 1], iters=3)
    assert [(r.arrangement.name, r.seed) for r in bench.runs] == [
        ('1proc_b1_acc4', 0), ('1proc_b4', 0), ('2proc_b1_acc2', 0),
        ('1proc_b1_acc4', 1), ('1proc_b4', 1), ('2proc_b1_acc2', 1)]
    one, two = bench.runs[0], bench.runs[2]
    assert one.train_cmd('py')[:2] == ['py', str(Path(DEMO).parents[2] / 'tools' /
                                                 'train.py')]
    assert two.train_cmd('py')[0] == 'bash' and two.train_cmd('py')[3] == '2'
    assert one.test_cmd('ck.pth', 'py')[3] == 'ck.pth'
    assert one.work_dir == str(tmp_path / 'runs' / '1proc_b1_acc4' / 'seed0')


def test_only_a_finished_identical_run_is_reused(tmp_path):
    spec = prepare(DEMO, str(tmp_path), 1, 4, [0], iters=3).runs[0]
    assert finished_record(spec) is None
    Path(spec.work_dir).mkdir(parents=True)
    saved = Path(spec.work_dir) / RESULT_FILE
    record = dict(status='ok', cfg_options=format_options(spec.options))
    saved.write_text(json.dumps(record))
    assert finished_record(spec) == record
    saved.write_text(json.dumps(dict(record, status='train failed (exit 1)')))
    assert finished_record(spec) is None
    saved.write_text(json.dumps(dict(record, cfg_options=['train_cfg.max_iters=4'])))
    assert finished_record(spec) is None
