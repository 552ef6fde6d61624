"""tools/analysis/fit_table.py: the fastest fit's choice for several budgets of one
config, on a CPU with a modelled device (1 MiB a sample, no fixed part) in a real
ScalingRunner on the demo PointPillars (total batch 8: batches 8, 4, 2, 1 tried).

Budgets 2, 3 and 5 MiB keep 10 % free (1.8, 2.7, 4.5 MiB), so batch 4, 2 and 1 are
the largest that fit. ``--min-gain 10`` makes the earliest variant that fits the
choice (the timing of a shared CPU decides nothing). The key check: each smaller
budget's row, decided from the 5 MiB search, is what the search alone chooses at that
budget."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mmdet3d_scaling.batch_size.fastest_fit import FitTrial
from mmdet3d_scaling.diagnostics import fit_table
from tests.auto_batch_size_common import write_demo_config

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'analysis' / 'fit_table.py'
MiB = 2**20
MODELLED = ['--probe', 'modeled', '--mib-per-sample', '1', '--fixed-mib', '0',
            '--warmup-steps', '1', '--timed-steps', '1', '--min-gain', '10']


def _tool():
    spec = importlib.util.spec_from_file_location('fit_table_tool', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    return write_demo_config(str(tmp_path_factory.mktemp('fit_table')))


@pytest.fixture(scope='module')
def table_run(demo, tmp_path_factory):
    work = tmp_path_factory.mktemp('fit_table_work')
    out = work / 'table.json'
    done = subprocess.run(
        [sys.executable, str(TOOL), demo, '--budgets', '3MiB,2MiB,5MiB', *MODELLED,
         '--work-dir', str(work), '--out', str(out)],
        cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text()), done.stdout


def _row(data: dict, budget: str) -> dict:
    return next(r for r in data['budgets'] if r['budget'] == budget)


@pytest.mark.slow
def test_table_and_data_file(table_run):
    data, stdout = table_run
    assert [r['budget'] for r in data['budgets']] == ['2MiB', '3MiB', '5MiB']
    expected = {'2MiB': 1, '3MiB': 2, '5MiB': 4}
    for budget, batch in expected.items():
        choice = _row(data, budget)['choice']
        assert (choice['batch_size'], choice['accumulation']) == (batch, 8 // batch)
        assert not choice['checkpointing'] and choice['precision'] == 'fp32'
        assert choice['peak_reserved_bytes'] == batch * MiB
        assert choice['samples_per_s'] > 0
    sources = {r['budget']: [(a['batch_size'], a['source']) for a in r['variants']]
               for r in data['budgets']}
    assert sources['5MiB'] == [(8, 'search'), (4, 'search'), (2, 'search'), (1, 'search')]
    # 8 did not fit 5 MiB; 4 MiB is above 2.7 MiB: trained again (and out of memory)
    assert sources['3MiB'] == [(8, 'out'), (4, 'tried'), (2, 'reused'), (1, 'reused')]
    assert sources['2MiB'] == [(8, 'out'), (4, 'tried'), (2, 'tried'), (1, 'reused')]
    assert data['retrials'] == 3 and data['search']['budget_bytes'] == 5 * MiB
    lines = stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith('fit table:'))
    assert 'modeled-cpu' in lines[head] and 'total batch 8' in lines[head]
    assert lines[head + 1].startswith('budget | fits in | batch | acc. | checkpointing')
    assert lines[head + 2].startswith('2.00 MiB | 1.80 MiB | 1 | 8 | off')
    assert lines[head + 4].startswith('5.00 MiB | 4.50 MiB | 4 | 2 | off')
    assert lines[head + 4].endswith('4 search')
    assert 'written: ' in stdout


@pytest.mark.slow
def test_smaller_budgets_choose_as_their_own_search(table_run, demo, tmp_path):
    data, _ = table_run
    options = dict(margin=None, batch_sizes=None, warmup_steps=1, timed_steps=1,
                   min_gain=10.0)
    modelled = dict(mib_per_sample=1, fixed_mib=0)
    for budget in ('2MiB', '3MiB'):
        alone = fit_table.run(demo, budget, options, 'modeled', modelled,
                              str(tmp_path / budget))
        row = alone['rows'][0]
        assert row.choice.batch_size == _row(data, budget)['choice']['batch_size']
        assert [t.fits for t in alone['search'].trials] == [
            a['fits'] for a in _row(data, budget)['variants']]


def _trial(fits: bool, reserved: int) -> FitTrial:
    return FitTrial(4, False, fits, not fits, 1.0 if fits else None, reserved,
                    reserved, 0.1)


def test_a_trial_is_reused_only_when_the_cap_never_acted():
    assert fit_table.classify(_trial(True, 10), 10, undisturbed=True) == fit_table.REUSED
    assert fit_table.classify(_trial(True, 11), 10, undisturbed=True) == fit_table.TRIED
    assert fit_table.classify(_trial(True, 5), 10, undisturbed=False) == fit_table.TRIED
    assert fit_table.classify(_trial(False, 5), 10, undisturbed=True) == fit_table.OUT


def test_the_gpu_probe_notes_a_trial_whose_allocator_gave_memory_back(monkeypatch):
    counters = {'reserved_bytes.all.freed': 0, 'num_alloc_retries': 0, 'num_ooms': 0}
    monkeypatch.setattr(fit_table.torch.cuda, 'memory_stats', lambda device: counters)
    monkeypatch.setattr(fit_table.CudaMemoryProbe, 'peak_bytes', lambda self: 7)
    monkeypatch.setattr(fit_table.CudaMemoryProbe, 'limit', lambda self, n: n)
    watch = object.__new__(fit_table.CudaReleaseWatch)  # no CUDA device needed
    watch.undisturbed, watch.moved, watch._start, watch.device = [], [], None, None
    watch.limit(10)
    assert watch.peak_bytes() == 7
    watch.limit(10)
    counters['reserved_bytes.all.freed'] = 4096  # a segment released inside the trial
    watch.peak_bytes()
    watch.limit(10)  # a trial that ran out of memory never reads its peak
    assert watch.undisturbed == [True, False, None]
    assert watch.moved == [{}, {'reserved_bytes.all.freed': 4096}, {}]


def test_budgets_parse_sorted_and_once():
    assert fit_table.parse_budgets('24, 12,24GiB,1536MiB') == [
        ('1536MiB', 1536 * MiB), (12.0, 12 * 2**30),
        (24.0, 24 * 2**30)]


@pytest.mark.parametrize('budgets, named', [
    ('0', "'0'"), ('16,-2', "'-2'"), ('24 gigs', "'24 gigs'"), (',', "','")])
def test_bad_budget_names_the_value_and_the_fix(budgets, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _tool().parse_args(['configs/demo/pointpillars_synthetic_kitti_cpu.py',
                            '--budgets', budgets, '--probe', 'modeled'])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and '--budgets' in err and 'GiB' in err


def test_unknown_config_names_the_path_and_the_fix():
    with pytest.raises(SystemExit) as exit_info:
        _tool().main(['configs/nope/missing.py', '--probe', 'modeled'])
    message = str(exit_info.value.code)
    assert "'configs/nope/missing.py' not found" in message
    assert 'give the path of a config file' in message


def test_no_gpu_says_how_to_dry_run(capsys, monkeypatch):
    monkeypatch.setattr(fit_table, 'cuda_available', lambda: False)
    with pytest.raises(SystemExit):
        _tool().parse_args(['configs/demo/pointpillars_synthetic_kitti_cpu.py'])
    assert '--probe modeled' in capsys.readouterr().err
