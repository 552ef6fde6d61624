"""tools/benchmark_scaling.py end to end on the CPU (gloo): real training runs of the
PointPillars synthetic config on tiny synthetic KITTI data, 1 and 2 processes, with the
comm-off run for 2, then the merge step (scaling.json / scaling.md / scaling.png).

One tool invocation (three spawned runs) serves every assertion on the measured
figures; the merge arithmetic (mmdet3d_scaling.diagnostics.scaling_benchmark) is also
checked on hand-written per-rank records.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmdet3d_scaling.diagnostics.hooks import benchmark_timer_hook
from mmdet3d_scaling.diagnostics.scaling_benchmark import (benchmark, comparison, launch,
                                                            outputs, summary)
from tests.auto_batch_size_common import write_dataset

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / 'tools' / 'benchmark_scaling.py'
CONFIG = REPO / 'configs' / 'pointpillars' / 'pointpillars_synthetic_kitti.py'
LABEL = CONFIG.stem
PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
WARMUP, ITERS = 1, 2
TOTAL = 4  # effective batch (the config's 8, halved for time)


def small_config_options(data_root: str) -> list:
    """--cfg-options: the data root, no loader workers, no ObjectSample draws (its first
    collision test compiles numba kernels for ~30 s in every process), fewer channels,
    a smaller effective batch."""
    pipe = 'train_dataloader.dataset.dataset.pipeline.2.db_sampler'
    return [
        f'train_dataloader.dataset.dataset.data_root={data_root}/',
        f'{pipe}.data_root={data_root}/',
        f'{pipe}.info_path={data_root}/kitti_dbinfos_train.pkl',
        f'{pipe}.sample_groups.Car=0', f'{pipe}.sample_groups.Pedestrian=0',
        f'{pipe}.sample_groups.Cyclist=0',
        'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
        'model.voxel_encoder.feat_channels=[16]', 'model.middle_encoder.in_channels=16',
        'model.backbone.in_channels=16', 'model.backbone.layer_nums=[1,1,1]',
        'model.backbone.out_channels=[16,32,64]', 'model.neck.in_channels=[16,32,64]',
        'model.neck.out_channels=[32,32,32]', 'model.bbox_head.in_channels=96',
        'model.bbox_head.feat_channels=96',
        f'scaling.total_batch_size={TOTAL}',  # 2 x 1 x 2 and 2 x 2 x 1: fewer iterations
    ]


def run_tool(out: Path, data_root: str, *extra: str,
             check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(TOOL), str(CONFIG), '--devices', 'cpu',
           '--iters', str(ITERS), '--warmup', str(WARMUP), '--out', str(out),
           *extra, '--cfg-options', *small_config_options(data_root)]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True,
                          timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope='module')
def data_root(tmp_path_factory) -> str:
    return write_dataset(str(tmp_path_factory.mktemp('bench_kitti')), train_frames=8)


@pytest.fixture(scope='module')
def bench(tmp_path_factory, data_root):
    out = tmp_path_factory.mktemp('bench_out')
    proc = run_tool(out, data_root, '--nproc', '1,2', '--profile-steps', '1',
                    '--independent')
    return out, proc


def _raw(out: Path, n: int, comm: str) -> dict:
    with open(out / f'{LABEL}_n{n}_comm-{comm}' / 'result.json') as f:
        return json.load(f)


def _throughput(raw: dict) -> float:
    """samples/s from the per-rank records: all samples over the slowest rank's time."""
    return (sum(r['samples'] for r in raw['ranks'])
            / max(r['seconds'] for r in raw['ranks']))


@pytest.mark.slow
def test_outputs_written(bench):
    out, proc = bench
    for name in ('scaling.json', 'scaling.md', 'scaling.png'):
        assert (out / name).stat().st_size > 0, name
    assert (out / 'scaling.png').read_bytes()[:8] == PNG_MAGIC
    table = (out / 'scaling.md').read_text()
    assert table.startswith('Command: `') and '| config | GPUs |' in table
    main_table = table.split('| host syncs / iter |')[0]  # before the profile table
    rows = [line for line in main_table.splitlines() if line.startswith(f'| {LABEL} |')]
    assert [row.split('|')[2].strip() for row in rows] == ['1', '2']
    assert '2 x 1 x 2 = 4' in rows[0] and '2 x 2 x 1 = 4' in rows[1]  # same batch
    assert 'wrote' in proc.stdout


@pytest.mark.slow
def test_figures_come_from_the_measured_runs(bench):
    out, _ = bench
    result = json.loads((out / 'scaling.json').read_text())
    assert result['nproc'] == [1, 2] and result['devices'] == 'cpu'
    rows = {row['world_size']: row for row in result['rows']}
    assert sorted(rows) == [1, 2]
    raw1, raw2 = _raw(out, 1, 'on'), _raw(out, 2, 'on')
    assert [r['rank'] for r in raw2['ranks']] == [0, 1]
    for n, raw in ((1, raw1), (2, raw2)):
        row = rows[n]
        assert row['total_batch'] == TOTAL
        assert row['per_gpu_batch'] * n * row['accumulation'] == TOTAL
        # the measured window: ITERS optimizer steps of accumulation micro-batches each
        assert all(r['iters'] == ITERS * row['accumulation'] for r in raw['ranks'])
        assert all(r['samples'] == ITERS * TOTAL // n for r in raw['ranks'])
        assert all(r['seconds'] > 0 for r in raw['ranks'])
        assert row['samples_per_s'] == pytest.approx(_throughput(raw))
        assert row['step_s'] == pytest.approx(
            max(r['seconds'] for r in raw['ranks']) / ITERS)
        assert 0 <= row['data_wait_share'] < 1
        assert row['peak_mem_mb'] is None  # CPU: no CUDA allocator figures
        spread = row['spread']
        assert spread['samples_per_s_min'] <= spread['samples_per_s_max']
        # each rank's main thread: CPUs it may use, torch's threads, the process's threads
        assert len(row['host']) == n
        assert all(h['cpus_allowed'] >= 1 and h['cpus_allowed_at_start'] >= 1
                   and h['intra_op_threads'] >= 1 and h['process_threads'] >= 1
                   for h in row['host'])
    assert 'CPUs / ' in (out / 'scaling.md').read_text()
    expected = _throughput(raw2) / (2 * _throughput(raw1))
    assert rows[2]['efficiency'] == pytest.approx(expected)
    assert rows[2]['speedup'] == pytest.approx(2 * expected)
    assert rows[1]['efficiency'] == pytest.approx(1.0)
    assert rows[2]['gpu_monitor'].get('gpu_samples_per_s_min') is not None  # cross-rank


@pytest.mark.slow
def test_comm_time_from_the_comm_off_run(bench):
    out, _ = bench
    rows = {r['world_size']: r for r in json.loads((out / 'scaling.json').read_text())['rows']}
    off = _raw(out, 2, 'off')
    assert off['comm'] == 'off' and off['world_size'] == 2
    no_comm_step = max(r['seconds'] for r in off['ranks']) / ITERS
    assert rows[2]['no_comm_step_s'] == pytest.approx(no_comm_step)
    assert rows[2]['comm_step_s'] == pytest.approx(
        max(0.0, rows[2]['step_s'] - no_comm_step))
    assert rows[2]['comm_share'] == pytest.approx(rows[2]['comm_step_s'] / rows[2]['step_s'])
    assert rows[1]['comm_step_s'] == 0.0  # one process communicates nothing
    assert not (out / f'{LABEL}_n1_comm-off').exists()  # no comm-off run for 1 process


@pytest.mark.slow
def test_profile_runs_find_the_collectives(bench):
    """--profile-steps: a separate profiled run per N; per-rank summaries in the rows and
    a second table. Over gloo the all-reduces show up as CPU-side collective time."""
    out, _ = bench
    rows = {r['world_size']: r for r in json.loads((out / 'scaling.json').read_text())['rows']}
    for n in (1, 2):
        prof = rows[n]['profile']
        assert [p['rank'] for p in prof] == list(range(n))
        for p in prof:
            assert p['iterations'] == rows[n]['accumulation']  # 1 step of micro-batches
            assert p['wall_ms_per_iter'] > 0
            assert p['host_syncs_per_iter'] == 0  # no CUDA here
            assert p['top_cpu'] and p['top_cpu'][0]['ms_per_iter'] > 0
            # call sites of host reads (.item() in losses / logging), none inside torch
            assert p['sync_sites'] and all('/torch/' not in x['site']
                                           for x in p['sync_sites'])
    assert all(p['comm_cpu_ms_per_iter'] > 0 for p in rows[2]['profile'])
    assert rows[1]['profile'][0]['comm_cpu_ms_per_iter'] == 0  # one process: nothing
    assert (out / f'{LABEL}_n2_profile' / 'result.json').exists()
    table = (out / 'scaling.md').read_text().split('| samples/s (distributed) |')[0]
    assert '| host syncs / iter |' in table
    assert len([line for line in table.splitlines()
                if line.startswith(f'| {LABEL} |')]) == 4  # 2 timed + 2 profiled rows


def test_merge_arithmetic_on_given_records(tmp_path):
    def raw(world, seconds, samples, wait=0.1):
        return dict(world_size=world, accumulation=8 // (2 * world), per_gpu_batch=2,
                    dataset_len=100, device='test', ranks=[
                        dict(rank=r, seconds=s, iters=4, samples=samples, data_wait_s=wait,
                             peak_mem_mb=None) for r, s in enumerate(seconds)])
    one = dict(summary.summarise(raw(1, [10.0], 40), None), label='m', config='m.py')
    two = dict(summary.summarise(raw(2, [6.0, 5.0], 40), 200), label='m', config='m.py')
    assert one['samples_per_s'] == pytest.approx(4.0)
    assert two['samples_per_s'] == pytest.approx(80 / 6.0)  # slowest rank sets the pace
    assert two['epoch_s'] == pytest.approx(200 / (80 / 6.0))
    assert two['spread']['samples_per_s_min'] == pytest.approx(40 / 6.0)
    summary.add_scaling([one, two])
    assert two['efficiency'] == pytest.approx((80 / 6.0) / (2 * 4.0))
    result = dict(config='m.py', command='x', rows=[one, two])
    outputs.write_outputs(result, str(tmp_path))
    assert (tmp_path / 'scaling.png').read_bytes()[:8] == PNG_MAGIC
    assert f"| {two['efficiency']:.2f} |" in (tmp_path / 'scaling.md').read_text()


def test_a_result_counts_only_with_every_rank(tmp_path):
    """A run that died while exiting still counts if all ranks wrote their figures."""
    path = tmp_path / 'result.json'
    assert launch.read_result(str(path), 2) is None  # nothing written
    path.write_text(json.dumps(dict(ranks=[dict(rank=0)])))
    assert launch.read_result(str(path), 2) is None  # one of two ranks
    path.write_text(json.dumps(dict(ranks=[dict(rank=0), dict(rank=1)])))
    assert launch.read_result(str(path), 2)['ranks'][1]['rank'] == 1


@pytest.mark.slow
def test_independent_runs_give_the_no_communication_ceiling(bench):
    """--independent: two single-process runs at once, no process group; their summed
    rate against the 2-process run and the 1-process run."""
    out, _ = bench
    rows = {r['world_size']: r for r in json.loads((out / 'scaling.json').read_text())['rows']}
    assert 'independent' not in rows[1]
    ind = rows[2]['independent']
    raws = []
    for i in range(2):
        with open(out / f'{LABEL}_n2_independent' / f'run{i}' / 'result.json') as f:
            raws.append(json.load(f))
    assert [r['world_size'] for r in raws] == [1, 1]  # no process group
    assert all(r['ranks'][0]['samples'] == ITERS * TOTAL for r in raws)  # a full run each
    rates = [_throughput(r) for r in raws]
    assert ind['samples_per_s_per_run'] == pytest.approx(rates)
    assert ind['samples_per_s'] == pytest.approx(sum(rates))
    assert ind['ceiling_efficiency'] == pytest.approx(
        sum(rates) / (2 * rows[1]['samples_per_s']))
    assert ind['ddp_cost'] == pytest.approx(1 - rows[2]['samples_per_s'] / sum(rates))
    assert ind['host'] == [r['ranks'][0]['host'] for r in raws]
    # the start barrier: both announced themselves, and the windows overlapped
    barrier = out / f'{LABEL}_n2_independent' / 'start_barrier'
    assert len(list(barrier.glob('ready-*'))) == 2
    windows = [r['ranks'][0]['window'] for r in raws]
    assert max(w[0] for w in windows) < min(w[1] for w in windows)
    assert ind['overlap'] == pytest.approx(summary.window_overlap(windows))
    assert 0 < ind['overlap'] <= 1
    table = (out / 'scaling.md').read_text()
    assert '| windows overlap |' in table
    assert '| samples/s (independent runs, sum) |' in table
    assert '| main thread per run |' in table


def test_window_overlap_and_start_barrier(tmp_path):
    overlap = summary.window_overlap
    assert overlap([[0.0, 10.0], [2.0, 12.0]]) == pytest.approx(0.8)
    assert overlap([[0.0, 10.0], [1.0, 6.0]]) == pytest.approx(1.0)
    assert overlap([[0.0, 4.0], [5.0, 9.0]]) == 0.0  # one after the other
    assert overlap([[0.0, 4.0], []]) is None  # a run without a window
    assert overlap([[1.0, 1.0], [0.0, 4.0]]) is None  # an empty window
    benchmark_timer_hook.wait_for_peers(str(tmp_path / 'one'), 1)  # alone: at once
    with pytest.raises(RuntimeError, match='2 independent runs.*only 1 did'):
        benchmark_timer_hook.wait_for_peers(str(tmp_path / 'two'), 2, timeout_s=0.05)


@pytest.mark.slow
def test_independent_runs_stop_together_when_one_fails():
    """A run that fails stops its peers at once instead of leaving them at the start
    barrier until the time limit."""
    sleeper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
    failing = subprocess.Popen([sys.executable, '-c', 'raise SystemExit(3)'])
    start = time.monotonic()
    launch.wait_together([sleeper, failing], timeout_s=120)
    assert time.monotonic() - start < 60  # at the failure, not at the time limit
    assert failing.returncode == 3
    assert sleeper.returncode is not None and sleeper.returncode != 0  # stopped
    late = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])
    launch.wait_together([late], timeout_s=0.5)  # past the limit: stopped as well
    assert late.returncode is not None


@pytest.mark.slow
def test_bad_arguments_are_clear_errors():
    """Usage errors of the command line, all started at once (each a Python start)."""
    bad = {  # arguments -> what the error says
        ('--nproc', '2', '--independent'): '--independent compares N single-GPU runs',
        ('--nproc', '0,2'): '--nproc must be a comma-separated list of positive ints',
        ('--nnodes', '2'): '--nnodes > 1 needs --master-port',
        ('--repeats', '0'): '--repeats must be >= 1',
        ('--nproc', '2', '--ddp-one'): '--ddp-one runs the 1-process case a second time',
    }
    procs = {args: subprocess.Popen([sys.executable, str(TOOL), str(CONFIG), *args],
                                    cwd=str(REPO), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True) for args in bad}
    for args, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 2 and bad[args] in err, (args, err)
    with pytest.raises(SystemExit, match="stock config 'mmdet3d::nope.py' not found"):
        comparison.resolve_stock('mmdet3d::nope.py')
    args = argparse.Namespace(compare_nproc=2, nproc=[1])
    with pytest.raises(SystemExit, match='--compare-nproc 2 must be one of --nproc'):
        comparison.compare_stock(args, [dict(world_size=1)])


@pytest.mark.multiprocess
@pytest.mark.slow
def test_four_process_gloo_smoke(tmp_path, data_root):
    """The multi-process smoke run: 4 gloo processes (on any core count) train the PointPillars
    synthetic config with its own effective batch 8 (2 x 4 x 1); ~45 s on 2 cores."""
    options = [o for o in small_config_options(data_root) if not o.startswith('scaling.')]
    cmd = [sys.executable, str(TOOL), str(CONFIG), '--devices', 'cpu', '--nproc', '4',
           '--iters', '2', '--warmup', '1', '--no-comm-run', '--out', str(tmp_path),
           '--cfg-options', *options]
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    raw = _raw(tmp_path, 4, 'on')
    assert raw['world_size'] == 4 and [r['rank'] for r in raw['ranks']] == [0, 1, 2, 3]
    assert (raw['per_gpu_batch'], raw['accumulation']) == (2, 1)
    assert all(r['iters'] == 2 and r['samples'] == 4 for r in raw['ranks'])
    log = (tmp_path / f'{LABEL}_n4_comm-on' / 'run.log').read_text()
    assert 'SyncBN (torch)' in log  # distributed = dict(sync_bn='torch') on 4 processes
    row = json.loads((tmp_path / 'scaling.json').read_text())['rows'][0]
    assert row['world_size'] == 4 and row['total_batch'] == 8


STOCK = 'mmdet3d::pointpillars/pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py'
#: the stock model at the narrow widths of small_config_options (the stock run gets the
#: plugin config's data options only, not its model ones): plain mmdet3d, a quarter of
#: the channels, so its two runs take seconds instead of minutes on 2 cores
SMALL_STOCK = '''_base_ = [{base!r}]
model = dict(
    voxel_encoder=dict(feat_channels=[16]), middle_encoder=dict(in_channels=16),
    backbone=dict(in_channels=16, layer_nums=[1, 1, 1], out_channels=[16, 32, 64]),
    neck=dict(in_channels=[16, 32, 64], out_channels=[32, 32, 32]),
    bbox_head=dict(in_channels=96, feat_channels=96))
'''


def small_stock_config(folder: Path) -> str:
    """The stock config, narrowed, under the stock file's name (the row labels)."""
    path = folder / Path(comparison.resolve_stock(STOCK)).name
    path.write_text(SMALL_STOCK.format(base=comparison.resolve_stock(STOCK)))
    return str(path)


@pytest.mark.slow
def test_stock_comparison_at_equal_settings_and_as_shipped(tmp_path, data_root):
    """--compare-stock: stock mmdet3d (no plugin) trains its own model on the plugin
    config's dataset to the plugin run's effective batch (6), first at the plugin run's
    per-GPU batch, accumulation and loader workers (2 x acc 3), then as shipped (its own
    per-GPU batch 6 x acc 1); the equal-settings ratio is the one quoted. The stock
    model is narrowed as the plugin run's is (SMALL_STOCK): plain mmdet3d either way."""
    options = [o for o in small_config_options(data_root) if not o.startswith('scaling.')]
    stock = small_stock_config(tmp_path)
    cmd = [sys.executable, str(TOOL), str(CONFIG), '--devices', 'cpu', '--nproc', '1',
           '--iters', '1', '--warmup', '1', '--no-comm-run', '--out', str(tmp_path),
           '--compare-stock', stock, '--cfg-options', *options, 'scaling.total_batch_size=6']
    proc = subprocess.run(cmd, cwd=str(REPO), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    equal = json.loads((tmp_path / 'stock_equal_n1' / 'result.json').read_text())
    shipped = json.loads((tmp_path / 'stock_shipped_n1' / 'result.json').read_text())
    assert (equal['per_gpu_batch'], equal['accumulation']) == (2, 3)
    assert (shipped['per_gpu_batch'], shipped['accumulation']) == (6, 1)
    assert shipped['ranks'][0]['samples'] == 6  # one measured step of the effective batch
    assert shipped['gpu_monitor'] == {}  # the plugin (and its monitor) was not imported
    for name in ('stock_equal_n1', 'stock_shipped_n1'):
        assert 'mmdet3d_scaling' not in (tmp_path / name / 'run.log').read_text()
    rows = json.loads((tmp_path / 'scaling.json').read_text())['rows']
    plugin, equal_row, shipped_row = rows
    # --threads (default 1) holds in every run, whatever OMP_NUM_THREADS the CPU launch set
    assert [h['intra_op_threads'] for r in rows for h in r['host']] == [1, 1, 1]
    assert (plugin['per_gpu_batch'], plugin['accumulation']) == (2, 3)
    assert equal_row['label'].startswith('stock@equal:pointpillars_hv_secfpn_8xb6')
    assert shipped_row['label'].startswith('stock@shipped:pointpillars_hv_secfpn_8xb6')
    assert equal_row['total_batch'] == shipped_row['total_batch'] == plugin['total_batch'] == 6
    assert plugin['vs_stock'] == pytest.approx(
        plugin['samples_per_s'] / equal_row['samples_per_s'])
    assert plugin['vs_stock_shipped'] == pytest.approx(
        plugin['samples_per_s'] / shipped_row['samples_per_s'])


def test_stock_batch_must_divide_the_effective_batch():
    assert comparison.stock_accumulation(16, 2, 1) == 8
    assert comparison.stock_accumulation(16, 2, 2) == 4
    with pytest.raises(SystemExit, match='effective batch 8 is not a multiple of the '
                       "stock config's per-GPU batch 6 x 1"):
        comparison.stock_accumulation(8, 6, 1)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_warmup_iters_step_times_and_the_ddp_world_of_one(tmp_path, data_root):
    """--warmup-iters counts micro-batches of the process: with accumulation 2 (one
    process, effective batch 4 = 2 x acc 2), 3 iterations round up to 2 warm-up steps;
    every measured step's and micro-batch's time is recorded and summarised, and the
    micro-batch times give the lockstep bound. --ddp-one in the same call (one
    1-process run serves both): the 1-process case again through torchrun as a
    distributed run of one process (gloo here), wrapped in the plugin's DDP wrapper;
    its cost in the table."""
    out = tmp_path / 'warm'
    steps_measured = 4  # 8 micro-batches: enough for the lockstep bound
    run_tool(out, data_root, '--nproc', '1', '--warmup-iters', '3', '--no-comm-run',
             '--iters', str(steps_measured), '--ddp-one')
    raw = _raw(out, 1, 'on')
    assert raw['accumulation'] == 2 and raw['warmup_steps'] == 2
    steps = raw['ranks'][0]['step_seconds']
    iters = raw['ranks'][0]['iter_seconds']
    assert len(steps) == steps_measured and all(s > 0 for s in steps)
    assert len(iters) == 2 * steps_measured and all(s > 0 for s in iters)
    # a step is its two micro-batches (both host clocks, rounded to 10 us)
    assert sum(iters) == pytest.approx(sum(steps), abs=1e-3)
    row = json.loads((out / 'scaling.json').read_text())['rows'][0]
    assert row['step_s_quantiles']['max'] == max(steps)
    assert row['iter_s_quantiles']['max'] == max(iters)
    bound = row['lockstep_bound']
    assert list(bound) == ['2', '4', '8']
    assert 0 < bound['8'] <= bound['4'] <= bound['2'] <= 1
    md = (out / 'scaling.md').read_text()
    assert ' / ' in md.splitlines()[2].split('|')[5]
    assert f"N=2 {bound['2']:.3f}" in md
    log = (out / f'{LABEL}_n1_ddp-one' / 'run.log').read_text()
    assert "launcher: pytorch" in log and 'ScalingDistributedDataParallel' in log
    plain = (out / f'{LABEL}_n1_comm-on' / 'run.log').read_text()
    assert "launcher: none" in plain
    one = row['ddp_one']
    assert one['world_size'] == 1
    assert one['cost'] == pytest.approx(1 - one['samples_per_s'] / row['samples_per_s'])
    assert one['host'][0]['cpus_allowed'] >= 1
    table = (out / 'scaling.md').read_text()
    assert 'DDP world of one' in table and '| main thread (world of one) |' in table


def test_lockstep_bound_arithmetic():
    """E[max of N picks] from the empirical distribution, and the bound built on it."""
    assert summary.expected_max([1.0, 3.0], 1) == pytest.approx(2.0)
    assert summary.expected_max([1.0, 3.0], 2) == pytest.approx(1 * 0.25 + 3 * 0.75)
    assert summary.expected_max([2.0] * 5, 8) == pytest.approx(2.0)
    assert summary.lockstep_bound([1.0] * 7) is None  # too few times to say anything
    even = summary.lockstep_bound([0.5] * 8)
    assert all(v == pytest.approx(1.0) for v in even.values())
    times = [1.0] * 6 + [2.0] * 2  # a quarter of the micro-batches twice as long
    mean = 10 / 8
    assert summary.lockstep_bound(times)['2'] == pytest.approx(
        mean / (1 * 0.75 ** 2 + 2 * (1 - 0.75 ** 2)))


@pytest.mark.slow
def test_repeats_alternate_the_order_and_report_the_median(tmp_path, data_root):
    """--repeats 2: rounds 1,2 then 2,1; the table row is the lower-median run of each
    count and every round's efficiency is its 2-process run against its own 1-process
    run."""
    out = tmp_path / 'rep'
    proc = run_tool(out, data_root, '--nproc', '1,2', '--repeats', '2', '--no-comm-run')
    started = [int(line.split(': ')[1].split(' process')[0]) for line in
               proc.stdout.splitlines() if 'process(es) x 1 node(s)' in line]
    assert started == [1, 2, 2, 1]
    rates = {n: [_throughput(_raw_tagged(out, n, r)) for r in (1, 2)] for n in (1, 2)}
    result = json.loads((out / 'scaling.json').read_text())
    assert result['repeats'] == 2
    one, two = result['rows']
    for row, n in ((one, 1), (two, 2)):
        assert row['repeats']['samples_per_s'] == pytest.approx(rates[n])
        assert row['samples_per_s'] == pytest.approx(min(rates[n]))  # lower median of 2
    expected = [rates[2][r] / (2 * rates[1][r]) for r in (0, 1)]
    assert two['repeats']['efficiency'] == pytest.approx(expected)
    assert two['repeats']['efficiency_median'] == pytest.approx(min(expected))
    assert two['efficiency'] == pytest.approx(min(rates[2]) / (2 * min(rates[1])))
    table = (out / 'scaling.md').read_text()
    assert 'efficiency per round' in table and f'{expected[0]:.2f}' in table


def _raw_tagged(out: Path, n: int, round_number: int) -> dict:
    with open(out / f'{LABEL}_n{n}_comm-on_r{round_number}' / 'result.json') as f:
        return json.load(f)


def test_median_row_and_round_order():
    runs = [dict(samples_per_s=v, step_s=16 / v, comm_step_s=c, world_size=2)
            for v, c in ((10.0, 0.3), (12.0, 0.1), (11.0, 0.2))]
    row = summary.median_row(runs)
    assert row['samples_per_s'] == 11.0 and row['repeats']['samples_per_s'] == [10, 12, 11]
    assert row['comm_step_s'] == 0.2 and row['comm_share'] == pytest.approx(0.2 / (16 / 11))
    assert benchmark.round_order([1, 2, 4], 0) == [1, 2, 4]
    assert benchmark.round_order([1, 2, 4], 1) == [4, 2, 1]
