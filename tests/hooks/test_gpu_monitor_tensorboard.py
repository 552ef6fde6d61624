"""GPUMonitorHook's scalars reach a TensorBoard event file (real Runner, real writer).

The TensorBoard switch documented in ``configs/_base_/default_runtime.py`` and
docs/monitoring.md is checked as written: the commented line, uncommented, and the
child-config form both give a visualizer with ``TensorboardVisBackend`` next to the JSON
log's ``LocalVisBackend``; a run with that visualizer is read back with TensorBoard's
own ``EventAccumulator``.
"""
import uuid
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from mmengine.config import Config
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401  (registers the hook)
from tests.toy import toy_runner_cfg

event_accumulator = pytest.importorskip(
    'tensorboard.backend.event_processing.event_accumulator',
    reason='tensorboard is a runtime requirement (requirements/runtime.txt)')

REPO = Path(__file__).resolve().parents[2]
DEFAULT_RUNTIME = REPO / 'configs' / '_base_' / 'default_runtime.py'
TENSORBOARD_LINE = ("# vis_backends = [dict(type='LocalVisBackend'), "
                    "dict(type='TensorboardVisBackend')]")
# What GPUMonitorHook reports without a GPU (and with one: these plus memory / NVML).
CPU_KEYS = ('gpu_data_wait_share', 'gpu_samples_per_s', 'gpu_samples_per_s_global')


def _backend_types(cfg: Config) -> List[str]:
    return [backend['type'] for backend in cfg.visualizer.vis_backends]


def _switched_base(tmp_path: Path) -> Config:
    """default_runtime.py with its documented TensorBoard line used instead of the first."""
    text = DEFAULT_RUNTIME.read_text()
    assert TENSORBOARD_LINE in text, (f'{DEFAULT_RUNTIME} lost the documented TensorBoard '
                                      f'switch {TENSORBOARD_LINE!r}')
    default_line = "vis_backends = [dict(type='LocalVisBackend')]\n"
    switched = text.replace(default_line, '')
    switched = switched.replace(TENSORBOARD_LINE, TENSORBOARD_LINE[2:])
    path = tmp_path / 'default_runtime_tensorboard.py'
    path.write_text(switched)
    return Config.fromfile(str(path))


def test_default_runtime_keeps_json_log_only():
    cfg = Config.fromfile(str(DEFAULT_RUNTIME))
    assert _backend_types(cfg) == ['LocalVisBackend']


def test_documented_switches_add_tensorboard(tmp_path):
    assert _backend_types(_switched_base(tmp_path)) == ['LocalVisBackend',
                                                         'TensorboardVisBackend']
    child = tmp_path / 'child.py'
    child.write_text(
        f"_base_ = [{str(DEFAULT_RUNTIME)!r}]\n"
        "visualizer = dict(vis_backends=[dict(type='LocalVisBackend'),\n"
        "                                dict(type='TensorboardVisBackend')])\n")
    cfg = Config.fromfile(str(child))
    assert _backend_types(cfg) == ['LocalVisBackend', 'TensorboardVisBackend']
    assert cfg.visualizer.type == 'Det3DLocalVisualizer'  # the rest of the base kept


def _train(work_dir: Path, visualizer: dict, max_iters: int, log_interval: int) -> Runner:
    cfg = toy_runner_cfg(work_dir, max_iters=max_iters, batch_size=2, log_level='INFO',
                         default_scope='mmdet3d',
                         experiment_name=f'gpu_monitor_tb_{uuid.uuid4().hex[:8]}')
    cfg['default_hooks']['logger'] = dict(type='LoggerHook', interval=log_interval)
    cfg['custom_hooks'] = [dict(type='GPUMonitorHook')]
    # A unique name: the visualizer is a process-wide singleton by name, and an earlier
    # test's instance would keep writing into that test's directory.
    cfg['visualizer'] = dict(visualizer, name=f'visualizer_{uuid.uuid4().hex[:8]}')
    runner = Runner(**cfg)
    runner.train()
    runner.visualizer.close()  # flushes the event file
    return runner


def _read_events(log_dir: Path) -> Dict[str, List[Tuple[int, float]]]:
    files = sorted(log_dir.rglob('events.out.tfevents.*'))
    assert files, f'no TensorBoard event file under {log_dir}'
    acc = event_accumulator.EventAccumulator(str(files[0].parent))
    acc.Reload()
    return {tag: [(event.step, event.value) for event in acc.Scalars(tag)]
            for tag in acc.Tags()['scalars']}


@pytest.mark.slow
def test_monitor_scalars_arrive_in_event_file(tmp_path):
    visualizer = _switched_base(tmp_path).visualizer.to_dict()
    visualizer.pop('name')
    runner = _train(tmp_path / 'work', visualizer, max_iters=8, log_interval=2)
    events = _read_events(Path(runner.log_dir))
    hub = runner.message_hub
    for key in CPU_KEYS:
        assert key in events, f'{key} missing from the event file; tags: {sorted(events)}'
        steps = [step for step, _ in events[key]]
        assert steps == [2, 4, 6, 8], f'{key}: one value per log interval, got {steps}'
        reported = hub.get_scalar(f'train/{key}').data[0]  # what the hook reported
        written = [value for _, value in events[key]]
        assert written == pytest.approx(list(reported), rel=1e-6), key
    assert all(0 <= value <= 1 for _, value in events['gpu_data_wait_share'])
    assert all(value > 0 for _, value in events['gpu_samples_per_s'])
    # Same figures in the JSON scalar log, which LocalVisBackend still writes.
    assert (Path(runner.log_dir) / 'vis_data' / f'{runner.timestamp}.json').is_file()
