"""Figures of measured runs: rank 0's ``result.json`` records -> table rows.

A row per process count: throughput (the slowest rank sets the pace), step and
micro-batch times with their quantiles, data wait, memory, the spread across ranks, the
lockstep bound of a 1-process run, then speedup / efficiency across rows, the median of
repeated runs and the ceiling of independent runs.
"""
from typing import Any, Callable, Dict, List, Optional


def summarise(raw: Dict[str, Any], epoch_samples: Optional[int]) -> Dict[str, Any]:
    """Figures of one run from the per-rank measurements."""
    ranks = raw['ranks']
    seconds = max(r['seconds'] for r in ranks)  # the slowest rank sets the pace
    iters = ranks[0]['iters']
    samples = sum(r['samples'] for r in ranks)
    steps = iters / raw['accumulation']
    rate = samples / seconds
    per_rank_rate = [r['samples'] / r['seconds'] for r in ranks]
    waits = [r['data_wait_s'] / r['seconds'] for r in ranks]
    mems = [r['peak_mem_mb'] for r in ranks if r['peak_mem_mb'] is not None]
    n_epoch = epoch_samples or raw['dataset_len']
    steps_s = ranks[0].get('step_seconds') or []  # ranks in lockstep: rank 0's will do
    iters_s = ranks[0].get('iter_seconds') or []
    return dict(
        world_size=raw['world_size'],
        per_gpu_batch=raw['per_gpu_batch'],
        accumulation=raw['accumulation'],
        total_batch=raw['world_size'] * raw['per_gpu_batch'] * raw['accumulation'],
        step_s=seconds / steps,
        iter_s=seconds / iters,
        samples_per_s=rate,
        epoch_samples=n_epoch,
        epoch_s=n_epoch / rate,
        data_wait_share=max(waits),
        peak_mem_mb=max(mems) if mems else None,
        spread=dict(samples_per_s_min=min(per_rank_rate),
                    samples_per_s_max=max(per_rank_rate),
                    data_wait_share_min=min(waits), data_wait_share_max=max(waits),
                    peak_mem_mb_min=min(mems) if mems else None,
                    peak_mem_mb_max=max(mems) if mems else None),
        step_s_quantiles=_quantiles(steps_s),
        iter_s_quantiles=_quantiles(iters_s),
        lockstep_bound=(lockstep_bound(iters_s) if raw['world_size'] == 1 else None),
        host=[r.get('host') for r in ranks],
        gpu_monitor=raw.get('gpu_monitor', {}),
        device=raw['device'],
        exit_code=raw.get('exit_code', 0),  # non-zero: died while exiting (warned)
    )


def _quantiles(values: List[float]) -> Optional[Dict[str, float]]:
    """Median, 90th percentile and maximum of step times (jitter: p90 / median)."""
    if not values:
        return None
    ordered = sorted(values)
    last = len(ordered) - 1
    return dict(p50=ordered[round(0.5 * last)], p90=ordered[round(0.9 * last)],
                max=ordered[-1])


def expected_max(values: List[float], draws: int) -> float:
    """Expected maximum of ``draws`` independent picks from ``values`` (with
    replacement): the sorted value i of m is the maximum with probability
    (i/m)^draws - ((i-1)/m)^draws."""
    ordered = sorted(values)
    m = len(ordered)
    return sum(v * ((i / m) ** draws - ((i - 1) / m) ** draws)
               for i, v in enumerate(ordered, start=1))


LOCKSTEP_WORLDS = (2, 4, 8)
LOCKSTEP_MIN_ITERS = 8  # fewer micro-batch times say too little about their spread


def lockstep_bound(iter_seconds: List[float]) -> Optional[Dict[str, float]]:
    """Efficiency N ranks would reach if each drew its micro-batch time from one
    process's measured times and all waited for the slowest at every micro-batch
    (DDP's gradient all-reduce): mean / E[max of N]. Only the spread of micro-batch
    times enters; communication and sharing the machine come on top."""
    if len(iter_seconds) < LOCKSTEP_MIN_ITERS:
        return None
    mean = sum(iter_seconds) / len(iter_seconds)
    return {str(n): mean / expected_max(iter_seconds, n) for n in LOCKSTEP_WORLDS}


def add_scaling(rows: List[Dict[str, Any]]) -> None:
    """Speedup and efficiency against the smallest process count measured."""
    base = min(rows, key=lambda r: r['world_size'])
    for row in rows:
        n = row['world_size'] / base['world_size']
        row['speedup'] = row['samples_per_s'] / base['samples_per_s']
        row['efficiency'] = row['speedup'] / n



def _lower_median(values: List[Any], key: Callable[[Any], float] = lambda v: v) -> Any:
    """The median of ``values`` by ``key``; of an even count, the lower of the two."""
    ordered = sorted(values, key=key)
    return ordered[(len(ordered) - 1) // 2]


def median_row(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The run of median samples/s (the lower one of an even count), with every run's
    rate and comm time under ``repeats``."""
    row = dict(_lower_median(runs, key=lambda r: r['samples_per_s']))
    row['repeats'] = dict(samples_per_s=[r['samples_per_s'] for r in runs],
                          step_s=[r['step_s'] for r in runs])
    comm = [r['comm_step_s'] for r in runs if r.get('comm_step_s') is not None]
    if len(runs) > 1 and comm:
        row['comm_step_s'] = _lower_median(comm)
        row['comm_share'] = row['comm_step_s'] / row['step_s']
    return row


def add_round_efficiency(rows: List[Dict[str, Any]]) -> None:
    """Efficiency of each round (its N-GPU run against its own 1-GPU run) and the median
    of those, on rows measured more than once."""
    base = min(rows, key=lambda r: r['world_size'])
    base_rates = base.get('repeats', {}).get('samples_per_s', [])
    if len(base_rates) < 2:
        return
    for row in rows:
        n = row['world_size'] / base['world_size']
        per_round = [rate / (n * one) for rate, one in
                     zip(row['repeats']['samples_per_s'], base_rates)]
        row['repeats']['efficiency'] = per_round
        row['repeats']['efficiency_median'] = _lower_median(per_round)


def summarise_independent(raws: List[Dict[str, Any]], ddp_rate: float,
                          base_rate: float) -> Dict[str, Any]:
    """The ceiling of N independent runs against the N-GPU run and the 1-GPU rate."""
    rates = [r['ranks'][0]['samples'] / r['ranks'][0]['seconds'] for r in raws]
    total = sum(rates)
    return dict(runs=len(rates), samples_per_s=total, samples_per_s_per_run=rates,
                overlap=window_overlap([r['ranks'][0].get('window') for r in raws]),
                host=[r['ranks'][0].get('host') for r in raws],
                ceiling_efficiency=total / (len(rates) * base_rate),
                ddp_cost=1.0 - ddp_rate / total)


def window_overlap(windows: List[Optional[List[float]]]) -> Optional[float]:
    """Share of the shortest measured window during which all runs were measuring
    (1.0: fully at the same time; 0.0: one after another)."""
    if not windows or any(not w or len(w) != 2 for w in windows):
        return None
    shortest = min(w[1] - w[0] for w in windows)
    if shortest <= 0:
        return None
    common = min(w[1] for w in windows) - max(w[0] for w in windows)
    return max(0.0, common) / shortest
