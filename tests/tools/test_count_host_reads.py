"""tools/analysis/count_host_reads.py on the demo PointPillars (CPU): the counts, and
the reads that patches/speed/max_iou_assigner.py removes, with and without that patch (and
without patches/speed/anchor_targets.py, which bypasses the assigner)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.auto_batch_size_common import write_demo_config

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'analysis' / 'count_host_reads.py'
ASSIGNER = 'mmdet/models/task_modules/assigners/max_iou_assigner.py'


def _count(base: Path, config: str, name: str, skip: str, *extra: str) -> dict:
    out = base / f'{name}.json'
    env = dict(os.environ, MMDET3D_SCALING_SKIP_PATCHES=skip)
    proc = subprocess.run(
        [sys.executable, str(TOOL), str(config), '--work-dir', str(base / name), '--out',
         str(out), *extra, '--cfg-options', 'randomness.seed=0',
         'train_dataloader.batch_size=2'],
        cwd=str(REPO), env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert 'host reads a training step' in proc.stdout
    return json.loads(out.read_text())


@pytest.fixture(scope='module')
def counts(tmp_path_factory):
    base = tmp_path_factory.mktemp('host_reads')
    config = write_demo_config(str(base))
    # anchor_targets off in both: it takes PointPillars' per-class targets past the
    # assigner altogether (its own reads: tests/patches/speed/test_anchor_targets.py)
    return (_count(base, config, 'upstream', 'max_iou_assigner,anchor_targets'),
            _count(base, config, 'patched', 'anchor_targets', '--launches', '--cuda-api'))


@pytest.mark.slow
def test_the_assigner_loop_is_counted_upstream_and_gone_with_the_patch(counts):
    upstream, patched = counts
    assert upstream['steps'] == 1 and upstream['samples'] == 2
    upstream_sites = {s['site'] for s in upstream['sites']}
    assert any(ASSIGNER in site for site in upstream_sites)
    assert not any(ASSIGNER in s['site'] for s in patched['sites'])
    # same seed, same batch: the difference is exactly the assigner's reads
    assigner = sum(s['count'] for s in upstream['sites'] if ASSIGNER in s['site'])
    assert patched['reads_per_step'] == pytest.approx(upstream['reads_per_step']
                                                      - assigner)
    assert patched['reads_per_step'] < upstream['reads_per_step']


@pytest.mark.slow
def test_launches_are_counted_by_site_beside_the_reads(counts):
    """--launches (patched run only): kernel-running operators by call site, copies among
    them; the read counts above are the same with the launch census on."""
    upstream, patched = counts
    assert 'launches_per_step' not in upstream
    sites = patched['launch_sites']
    assert patched['launches_per_step'] == pytest.approx(
        patched['launches_per_sample'] * 2)
    assert sum(s['count'] for s in sites) <= patched['launches_per_step']
    assert 0 <= patched['copies_per_step'] < patched['launches_per_step']
    # a PointPillars step runs hundreds of kernels, in mmdet3d's model code and in the
    # backward pass (attributed to the line that calls backward, in mmengine)
    assert patched['launches_per_step'] > 100
    assert any('/mmdet3d/models/' in s['site'] for s in sites)
    assert any('/mmengine/optim/' in s['site'] for s in sites)
    counts_desc = [s['count'] for s in sites]
    assert counts_desc == sorted(counts_desc, reverse=True)


@pytest.mark.slow
def test_bad_arguments_are_errors():
    proc = subprocess.run([sys.executable, str(TOOL), 'x.py', '--steps', '0'],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and '--steps must be >= 1, got 0' in proc.stderr


@pytest.mark.slow
def test_cuda_api_profile_runs_after_the_counts(counts):
    """--cuda-api (patched run): further steps under torch.profiler; on a CPU there are
    no CUDA calls to count (GPU attribution: tests/diagnostics/test_profiling.py)."""
    upstream, patched = counts
    api = patched['cuda_api']
    assert 'cuda_api' not in upstream
    assert api['device'] == 'cpu' and api['wall_ms_per_step'] > 0
    assert api['calls_per_iter'] == 0 and api['sites'] == [] and api['by_call'] == {}
