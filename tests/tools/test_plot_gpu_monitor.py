"""tools/analysis/plot_gpu_monitor.py on logs written by real training runs.

``across_ranks.png`` from a real 2-process log is checked in
``tests/hooks/test_gpu_monitor_hook.py`` (its gloo run is spawned once for both).
"""
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from tests.toy import toy_runner_cfg

TOOL = Path(__file__).resolve().parents[2] / 'tools' / 'analysis' / 'plot_gpu_monitor.py'
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


def _train(work_dir: Path, monitor: bool) -> None:
    cfg = toy_runner_cfg(work_dir, max_iters=6, default_scope='mmdet3d',
                         experiment_name=f'plot_{uuid.uuid4().hex[:8]}')
    cfg['default_hooks']['logger'] = dict(type='LoggerHook', interval=2)
    if monitor:
        cfg['custom_hooks'] = [dict(type='GPUMonitorHook')]
    Runner(**cfg).train()


def _run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _assert_pngs(paths):
    for path in paths:
        data = Path(path).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000, path


@pytest.mark.slow
def test_plots_from_a_work_dir(tmp_path):
    _train(tmp_path / 'work', monitor=True)
    out = tmp_path / 'plots'
    result = _run_tool(tmp_path / 'work', '--out-dir', out)
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in out.iterdir())
    assert {'data_wait.png', 'throughput.png'} <= set(names)
    _assert_pngs(out.iterdir())
    assert result.stdout.count('.png') == len(names)


@pytest.mark.slow
def test_default_out_dir_and_direct_json(tmp_path):
    _train(tmp_path, monitor=True)
    log = next(tmp_path.glob('*/vis_data/scalars.json'))
    result = _run_tool(log)
    assert result.returncode == 0, result.stderr
    _assert_pngs((log.parent / 'gpu_monitor_plots').iterdir())


@pytest.mark.slow
def test_log_without_monitor_keys_is_a_clear_error(tmp_path):
    _train(tmp_path, monitor=False)
    result = _run_tool(tmp_path)
    assert result.returncode == 1
    assert 'no GPUMonitorHook figures' in result.stderr
    assert "custom_hooks = [dict(type='GPUMonitorHook')]" in result.stderr


@pytest.mark.slow
def test_missing_path_is_named(tmp_path):
    result = _run_tool(tmp_path / 'nope')
    assert result.returncode == 1 and 'nope' in result.stderr
