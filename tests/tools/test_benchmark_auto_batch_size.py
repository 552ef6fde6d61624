"""tools/benchmark_auto_batch_size.py on the CPU with a modelled device: search, the
no-margin bound, its confirmation by training on random batches, training after."""
import importlib.util
import json
from pathlib import Path

import pytest

from tests.auto_batch_size_common import write_demo_config

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'benchmark_auto_batch_size.py'


def _load_tool():
    spec = importlib.util.spec_from_file_location('benchmark_auto_batch_size', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp('abs_bench')
    config = write_demo_config(str(base))
    out = base / 'result.json'
    # modelled device: 44 MiB, 8 MiB a sample on top of the training state
    result = _load_tool().main([
        str(config), '--probe', 'modeled', '--capacity-mib', '44', '--mib-per-sample', '8',
        '--iters', '2', '--verify-steps', '2', '--max-batch-size', '16',
        '--work-dir', str(base / 'work'), '--out', str(out)])
    return result, json.loads(out.read_text())


def test_search_bound_and_confirmation(run):
    result, written = run
    assert written == json.loads(json.dumps(result))
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


def test_bad_verify_steps_is_an_error():
    with pytest.raises(SystemExit):
        _load_tool().parse_args(['x.py', '--verify-steps', '-1'])
