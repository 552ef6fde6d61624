"""The benchmark worker loads its timing hooks without the plugin in a stock run.

Each case runs in a fresh interpreter (this test process has imported the plugin), as
the worker does when the orchestrator starts it as a script.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmdet3d_scaling.diagnostics.scaling_benchmark import launch

REPO = Path(__file__).resolve().parents[3]
HOOKS = ('benchmark_timer_hook', 'peak_memory_hook', 'profile_hook', 'progress_file_hook')

PROBE = '''
import importlib.util, json, sys
sys.path.insert(0, {root!r})
if {plugin!r}:
    import mmdet3d_scaling
spec = importlib.util.spec_from_file_location('bench_worker', {worker!r})
worker = importlib.util.module_from_spec(spec)
spec.loader.exec_module(worker)
timer = worker.plugin_module('diagnostics.hooks.benchmark_timer_hook').BenchmarkTimerHook
for name in {hooks!r}:
    worker.plugin_module('diagnostics.hooks.' + name)
worker.plugin_module('parallel.launcher')
from mmdet3d.registry import HOOKS
print(json.dumps(dict(
    modules=sorted(m for m in sys.modules if m.startswith('mmdet3d_scaling')),
    registered='GPUMonitorHook' in HOOKS.module_dict,
    timer=timer.__module__)))
'''


def _probe(plugin: bool) -> dict:
    code = PROBE.format(root=str(REPO), plugin=plugin, worker=launch.WORKER, hooks=HOOKS)
    done = subprocess.run([sys.executable, '-c', code], cwd=str(REPO),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_stock_run_loads_the_hooks_without_the_plugin():
    found = _probe(plugin=False)
    assert found['timer'] == 'mmdet3d_scaling.diagnostics.hooks.benchmark_timer_hook'
    assert not found['registered']  # no class of the plugin registered
    modules = set(found['modules'])
    assert 'mmdet3d_scaling.engine.optim_state' in modules
    # neither the patches nor the plugin's registrations were imported
    assert not modules & {'mmdet3d_scaling.patches', 'mmdet3d_scaling.hooks',
                          'mmdet3d_scaling.engine.runner', 'mmdet3d_scaling.models'}


@pytest.mark.slow
def test_plugin_run_imports_as_usual():
    found = _probe(plugin=True)
    assert found['registered']
    assert {'mmdet3d_scaling.patches', 'mmdet3d_scaling.hooks'} <= set(found['modules'])
