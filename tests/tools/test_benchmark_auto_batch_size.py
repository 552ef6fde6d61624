"""tools/benchmark_auto_batch_size.py on the CPU with a modelled device: search, the
no-margin bound, its confirmation by training on random batches, training after.

The CLI runs in a subprocess (flags, printed table, JSON as a user gets them); the
figures are read back through the package module it wraps."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmdet3d_scaling.diagnostics import batch_size_benchmark as benchmark
from tests.auto_batch_size_common import write_demo_config

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'benchmark_auto_batch_size.py'


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *argv], cwd=REPO,
                          capture_output=True, text=True)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp('abs_bench')
    config = write_demo_config(str(base))
    out = base / 'result.json'
    # modelled device: 44 MiB, 8 MiB a sample on top of the training state
    done = _cli(str(config), '--probe', 'modeled', '--capacity-mib', '44',
                '--mib-per-sample', '8', '--iters', '2', '--verify-steps', '2',
                '--max-batch-size', '16', '--work-dir', str(base / 'work'),
                '--out', str(out))
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text()), done.stdout, out


@pytest.mark.slow
def test_search_bound_and_confirmation(run):
    result, stdout, out = run
    # the table of what was written, then where
    assert benchmark.table(result) + f'\nwritten: {out}\n' in stdout
    found, bound, largest = result['found'], result['largest_2step'], result['largest']
    assert 1 <= found < bound <= 16
    # 10 % kept free costs one 8 MiB sample of 44 MiB here
    assert all(t['fits'] == (t['peak_bytes'] is not None
                             and t['peak_bytes'] <= 0.9 * 44 * 2**20)
               for t in result['search_trials'] if not t['oom'])
    # a modelled device does not fragment: random batches confirm the bound at once
    assert largest == bound
    assert [(t['batch_size'], t['fits']) for t in result['verify_trials']] == [(bound, True)]
    assert result['ratio'] == pytest.approx(found / largest)
    assert result['iters_done'] == 2 and not result['oom_in_training']
    assert result['targets']['no_oom'] and result['targets']['search_lt_60s']


@pytest.mark.slow
def test_bad_verify_steps_is_an_error():
    done = _cli('x.py', '--verify-steps', '-1')
    assert done.returncode == 2  # argparse's usage error
    assert '--verify-steps must be >= 0, got -1' in done.stderr


def test_default_output_is_in_the_work_dir():
    assert benchmark.default_out('w') == str(Path('w', 'benchmark_auto_batch_size.json'))
    assert benchmark.default_out(None) == str(
        Path('work_dirs', 'benchmark_auto_batch_size', 'benchmark_auto_batch_size.json'))
