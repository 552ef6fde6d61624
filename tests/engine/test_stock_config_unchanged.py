"""A stock mmdet3d config with only ``custom_imports = ['mmdet3d_scaling']`` is built
exactly as upstream builds it, also under a 2-process gloo ``torchrun``.

Each rank builds the config twice: through ``Runner.from_cfg`` (the route of mmdet3d's
``tools/train.py``, where the plugin's hand-off sits) and through upstream's own
``from_cfg``, then compares the runner class, the model wrapper class, the collective
timeout in the config and the hook list. gloo needs two settings that upstream needs
without the plugin too on a CPU machine (backend and CPU-style DDP wrapping); they are
passed to both builds.
"""
import json

import pytest

from tests.multiprocess import run_torchrun


STOCK = ['mmdet3d::pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py',
         'mmdet3d::second/second_hv_secfpn_8xb6-80e_kitti-3d-3class.py']

WORKER = r'''
import json, os, sys
import torch
from mmengine.config import Config
from mmengine.runner import Runner
import mmdet3d_scaling
from mmdet3d_scaling.patches.fixes import runner_handoff

def describe(runner):
    return dict(runner=type(runner).__name__, wrapper=type(runner.model).__name__,
                env_cfg=runner.cfg.get('env_cfg'), model_wrapper_cfg=runner.cfg.get(
                    'model_wrapper_cfg'),
                hooks=[(type(h).__name__, str(h.priority)) for h in runner.hooks])

out = {}
for i, path in enumerate(sys.argv[2:]):
    seen = {}
    local = os.path.join(sys.argv[1], f'stock_{i}.py')  # fromfile takes mim paths in _base_
    with open(local, 'w') as f:
        f.write(f'_base_ = [{path!r}]\n')
    for route in ('handoff', 'upstream'):
        cfg = Config.fromfile(local)
        cfg.custom_imports = dict(imports=['mmdet3d_scaling'], allow_failed_imports=False)
        cfg.launcher = 'pytorch'
        cfg.work_dir = os.path.join(sys.argv[1], f'{i}_{route}')
        cfg.env_cfg.dist_cfg = dict(backend='gloo')
        cfg.model_wrapper_cfg = dict(type='MMDistributedDataParallel', device_ids=None)
        build = (Runner.from_cfg if route == 'handoff'
                 else lambda c: runner_handoff._upstream_from_cfg(Runner, c))
        seen[route] = describe(build(cfg))
    out[path] = seen
if int(os.environ['RANK']) == 0:
    print('RESULT ' + json.dumps(out, default=str))
torch.distributed.destroy_process_group()
'''


@pytest.mark.multiprocess
@pytest.mark.slow
def test_stock_configs_build_as_upstream_under_torchrun(tmp_path):
    script = tmp_path / 'worker.py'
    script.write_text(WORKER)
    # CUDA hidden from the 2 ranks where fewer than 2 GPUs are visible (gloo either way)
    done = run_torchrun(script, [tmp_path, *STOCK], 2, cwd=tmp_path, timeout=850)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    line = [l for l in done.stdout.splitlines() if l.startswith('RESULT ')][-1]
    result = json.loads(line[len('RESULT '):])
    for path, seen in result.items():
        assert seen['handoff'] == seen['upstream'], path
        assert seen['handoff']['runner'] == 'Runner'
        assert seen['handoff']['wrapper'] == 'MMDistributedDataParallel'
        assert 'timeout' not in seen['handoff']['env_cfg']['dist_cfg']
    assert 'no plugin keys in this config' in done.stdout + done.stderr
