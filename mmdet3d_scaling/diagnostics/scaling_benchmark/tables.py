"""The markdown tables of ``scaling.md``: the main table (one row per config and process
count) and the side tables of the optional runs (repeats, profile, independent, DDP
world of one), each empty when no row has its figures."""
import math
from typing import Any, Callable, Dict, List, Optional


def _fmt(value: Optional[float], pattern: str) -> str:
    return '-' if value is None or (isinstance(value, float) and math.isnan(value)) \
        else pattern.format(value)


def _table_head(head: str) -> List[str]:
    """A markdown table's header line and separator."""
    return [head, '|' + '---|' * (head.count('|') - 1)]


def _step_quantiles(q: Optional[Dict[str, float]]) -> str:
    return '-' if not q else f"{q['p50']:.3f} / {q['p90']:.3f} s"


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f'{seconds / 3600:.2f} h'
    if seconds >= 60:
        return f'{seconds / 60:.1f} min'
    return f'{seconds:.1f} s'


def markdown_table(result: Dict[str, Any]) -> str:
    """The main table, a row per config and process count, with its notes."""
    head = ('| config | GPUs | batch (GPU x N x acc) | time/step | step p50 / p90 '
            '| time/epoch | samples/s '
            '| speedup | efficiency | data wait | memory/GPU (MiB) | samples/s per rank '
            '(min-max) | comm/step (exposed) | measured on |')
    lines = _table_head(head)
    for row in result['rows']:
        spread = row['spread']
        lines.append(
            f"| {row['label']} | {row['world_size']} | {row['per_gpu_batch']} x "
            f"{row['world_size']} x {row['accumulation']} = {row['total_batch']} "
            f"| {row['step_s']:.3f} s | {_step_quantiles(row.get('step_s_quantiles'))} "
            f"| {_duration(row['epoch_s'])} "
            f"| {row['samples_per_s']:.2f} | {_fmt(row.get('speedup'), '{:.2f}x')} "
            f"| {_fmt(row.get('efficiency'), '{:.2f}')} | {row['data_wait_share']:.1%} "
            f"| {_fmt(row['peak_mem_mb'], '{:.0f}')} "
            f"| {spread['samples_per_s_min']:.2f}-{spread['samples_per_s_max']:.2f} "
            f"| {_fmt(row.get('comm_step_s'), '{:.3f} s')} | {row['device']} |")
    lines.append('')
    lines.append(f"time/epoch: {result['rows'][0]['epoch_samples']} samples an epoch; "
                 'time/step: one optimizer step of the effective batch (mean; p50 / p90: '
                 'median and 90th percentile of single steps, rank 0); comm: step time '
                 'minus the step time of a run with DDP all-reduce replaced by a no-op.')
    bounds = [row for row in result['rows'] if row.get('lockstep_bound')]
    if bounds:
        lines.append('')
        lines.append(
            'Lockstep bound (efficiency if N ranks drew their micro-batch times from the '
            '1-GPU run\'s and waited for the slowest at every micro-batch): '
            + '; '.join(f"{row['label']}: " + ', '.join(
                f'N={n} {eff:.3f}' for n, eff in row['lockstep_bound'].items())
                + f" (micro-batch p50 / p90 {_step_quantiles(row.get('iter_s_quantiles'))})"
                for row in bounds) + '.')
    hosts = [f"{row['world_size']} GPU(s): " + _hosts_text(row.get('host'))
             for row in result['rows'] if any(row.get('host') or [])]
    if hosts:
        lines.append('')
        lines.append('Main thread per rank (CPUs it may use at the start -> at the end / '
                     "torch's intra-op threads / the process's threads): "
                     + '; '.join(hosts) + '.')
    return '\n'.join(lines)


def _hosts_text(hosts: Optional[List[Optional[Dict[str, Any]]]]) -> str:
    """Per rank: CPUs its main thread may use (start -> end) / intra-op threads / threads."""
    return ', '.join(f"{h['cpus_allowed_at_start']}->{h['cpus_allowed']} CPUs / "
                     f"{h['intra_op_threads']} intra-op / {h['process_threads']} threads"
                     for h in hosts or [] if h) or '-'


def _side_table(result: Dict[str, Any], has: Callable[[Dict[str, Any]], Any], head: str,
                line: Callable[[Dict[str, Any]], str], note: str) -> str:
    """A table of the rows for which ``has(row)`` holds, one ``line(row)`` each, with a
    note under it; '' when no row has it."""
    rows = [r for r in result['rows'] if has(r)]
    if not rows:
        return ''
    return '\n'.join(_table_head(head) + [line(r) for r in rows] + ['', note])


def _floats(values: List[float]) -> str:
    return ', '.join(f'{v:.2f}' for v in values)


def _repeats_line(row: Dict[str, Any]) -> str:
    rep = row['repeats']
    rates, effs = rep['samples_per_s'], rep.get('efficiency')
    return (f"| {row['label']} | {row['world_size']} | {_floats(rates)} "
            f"| {row['samples_per_s']:.2f} ({min(rates):.2f}-{max(rates):.2f}) "
            f"| {_floats(effs) if effs else '-'} "
            f"| {_fmt(rep.get('efficiency_median'), '{:.2f}')} "
            f"| {_fmt(row.get('efficiency'), '{:.2f}')} |")


def repeats_table(result: Dict[str, Any]) -> str:
    """Every round's samples/s and efficiency, when the runs were repeated."""
    return _side_table(
        result, lambda r: len(r.get('repeats', {}).get('samples_per_s', [])) > 1,
        '| config | GPUs | samples/s per round | median (min-max) | efficiency per round '
        '| median of rounds | efficiency of medians |', _repeats_line,
        f"{result.get('repeats', 1)} rounds, process counts in alternating order (1,2 then "
        '2,1 ...); the main table shows the median run of each count; efficiency per '
        "round: that round's N-GPU run against its own 1-GPU run.")


def independent_table(result: Dict[str, Any]) -> str:
    """N-GPU runs against N independent single-GPU runs on the same machine."""
    def line(row: Dict[str, Any]) -> str:
        ind = row['independent']
        return (f"| {row['label']} | {row['world_size']} | {row['samples_per_s']:.2f} "
                f"| {ind['samples_per_s']:.2f} | {_floats(ind['samples_per_s_per_run'])} "
                f"| {_fmt(ind.get('overlap'), '{:.0%}')} "
                f"| {_fmt(row.get('efficiency'), '{:.2f}')} "
                f"| {ind['ceiling_efficiency']:.2f} | {ind['ddp_cost']:.1%} "
                f"| {_hosts_text(ind.get('host'))} |")
    return _side_table(
        result, lambda r: r.get('independent'),
        '| config | GPUs | samples/s (distributed) | samples/s (independent runs, sum) '
        '| per run | windows overlap | efficiency | ceiling efficiency | DDP cost '
        '| main thread per run |', line,
        'independent runs: one single-GPU run per GPU at the same time, no process group, '
        'their measured windows started together (a file barrier after the warm-up); '
        'windows overlap: share of the shortest window all runs were measuring; '
        'ceiling efficiency: their sum / (N x the 1-GPU rate), what sharing the machine '
        'leaves; DDP cost: 1 - distributed / independent sum.')


def ddp_one_table(result: Dict[str, Any]) -> str:
    """The 1-process run against the same process as a DDP world of one."""
    def line(row: Dict[str, Any]) -> str:
        one = row['ddp_one']
        return (f"| {row['label']} | {row['samples_per_s']:.2f} "
                f"| {one['samples_per_s']:.2f} | {one['cost']:.1%} "
                f"| {_hosts_text(one.get('host'))} |")
    return _side_table(
        result, lambda r: r.get('ddp_one'),
        '| config | samples/s (1 process) | samples/s (DDP world of one) '
        '| distributed code path cost | main thread (world of one) |', line,
        'DDP world of one: the 1-GPU run started through torchrun with a process group, '
        'the DDP wrapper and SyncBN as configured; cost: 1 - its samples/s / the plain '
        '1-process samples/s.')


def profile_table(result: Dict[str, Any]) -> str:
    """Per-iteration profile figures of the rows that have them (worst rank)."""
    rows = [r for r in result['rows'] if r.get('profile')]
    if not rows:
        return ''
    head = ('| config | GPUs | wall ms / iter | GPU kernel ms / iter | collective kernels '
            'ms / iter | collective CPU ms / iter | host syncs / iter |')
    lines = _table_head(head)
    for row in rows:
        prof = row['profile']

        def worst(key: str) -> float:
            return max(p[key] for p in prof)
        lines.append(
            f"| {row['label']} | {row['world_size']} | {worst('wall_ms_per_iter'):.1f} "
            f"| {worst('device_kernel_ms_per_iter'):.1f} "
            f"| {worst('comm_kernel_ms_per_iter'):.1f} "
            f"| {worst('comm_cpu_ms_per_iter'):.1f} "
            f"| {worst('host_syncs_per_iter'):.1f} |")
    lines.append('')
    lines.append('Profiled runs (torch.profiler, slower than the timed runs above); worst '
                 'rank per column; iteration = one micro-batch. Top operators per rank: '
                 'scaling.json, rows[].profile.')
    for row in rows:
        sites = (row['profile'][0].get('sync_sites') or [])[:5]
        if sites:
            lines.append('')
            lines.append(f"Host waits and copies by call site, {row['world_size']} GPU(s), "
                         'rank 0 (calls / iteration):')
            lines += [f"- {site['calls_per_iter']:.1f} x `{site['op']}` from "
                      f"`{site['site']}`" for site in sites]
    return '\n'.join(lines)
