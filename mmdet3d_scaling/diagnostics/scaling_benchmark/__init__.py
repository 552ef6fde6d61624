"""Scaling benchmark: train a config for a fixed number of steps on 1..N GPUs, measure.

The library behind ``tools/benchmark_scaling.py`` (the command line: its ``--help``).

For each process count the tool starts a fresh training run (``torchrun`` for N > 1, a
plain process for 1) with the config's real data pipeline and the same effective batch
(the config's ``scaling`` key re-plans per-GPU batch and accumulation for every N),
trains ``--warmup`` + ``--iters`` optimizer steps and measures the last ``--iters``:

- time per optimizer step (= one effective batch) and per loop iteration (micro-batch),
- samples/s (all ranks), speedup and scaling efficiency = throughput_N / (N x throughput_1),
- data-wait share (time between iterations spent waiting for the loader, worst rank),
- peak memory per GPU (max over ranks) and the spread across ranks (samples/s, memory,
  data wait; the tool's own per-rank figures plus GPUMonitorHook's cross-rank min/max
  from the run's JSON log),
- micro-batch times (p50 / p90) and, from a 1-process run's, the lockstep bound: the
  efficiency N ranks would reach if each drew its micro-batch time from that run's and
  all waited for the slowest at every micro-batch (mean / E[max of N draws]),
- exposed gradient communication: for N > 1 a second run with DDP's all-reduce replaced
  by a no-op comm hook; comm time per step = step time (with) - step time (without).

Outputs under ``--out``: ``scaling.json`` (everything), ``scaling.md`` (a table like the
ones users publish) and ``scaling.png`` (samples/s and efficiency against N).

Profile mode (``--profile-steps K``): one more run per process count, K optimizer steps
under ``torch.profiler`` (after the same warm-up), summarised per rank and iteration:
host synchronisations (the CPU waiting for the GPU), time in collectives (NCCL kernels,
gloo / c10d calls), GPU kernel time against wall time, and the top operators. A second
table in ``scaling.md``; ``--profile-traces`` also writes a Chrome trace per rank.

Independent mode (``--independent``): for each N > 1, N single-GPU runs of the same
config at the same time, one GPU each, with no process group: no gradient all-reduce,
no SyncBN, no lockstep, only the shared host (CPU cores, memory bandwidth, PCIe, the
driver). Their summed samples/s is the ceiling the N-GPU run could reach on this
machine; ``ceiling efficiency`` = that sum / (N x the 1-GPU rate) and ``DDP cost`` =
1 - (N-GPU rate / that sum) separate what sharing the machine costs from what
distributed training costs (third table in ``scaling.md``).

DDP world of one (``--ddp-one``): the 1-process case once more through torchrun as a
distributed run of one process (process group, DDP wrapper, SyncBN conversion): what
the distributed code path costs by itself. With ``--independent`` it splits the N-GPU
run's loss into that cost, what sharing the machine costs, and the rest (waiting for
the other ranks).

Repeats (``--repeats R``): the timed runs of every process count R times, in rounds
whose order alternates (1,2 / 2,1 / ...), because a shared machine's speed drifts by
several per cent between runs a minute apart. The main table shows each count's median
run; a second table lists every round's samples/s and its efficiency against the same
round's 1-GPU run. Profile, independent and stock runs are made once, after the rounds.

Comparison mode (``--compare-stock STOCK_CONFIG``): the same model through stock mmdet3d
(its own config, the plugin not imported) against the plugin config, same dataset and
pipeline (taken from the plugin config, ``--cfg-options`` applied) and the same effective
batch, at ``--compare-nproc`` GPUs. The stock run keeps its own per-GPU batch
(``train_dataloader.batch_size``) and reaches the plugin run's effective batch with
mmengine's ``accumulative_counts``; everything else (loader, precision, cudnn) is the
stock config's.

Modules: :mod:`.benchmark` (the runs a benchmark makes, start to end), :mod:`.launch`
(starting a run's processes, reading their result), :mod:`.worker` (the training
process, run as a script; its timing hooks are in :mod:`mmdet3d_scaling.diagnostics.hooks`), :mod:`.summary` (records -> table rows),
:mod:`.comparison` (the stock mmdet3d run), :mod:`.tables` and :mod:`.outputs`
(``scaling.md`` / ``scaling.json`` / ``scaling.png``).
"""
from .benchmark import RESULT_VERSION, run_benchmark
from .outputs import load_rows, plot, write_outputs

__all__ = ['RESULT_VERSION', 'run_benchmark', 'load_rows', 'plot', 'write_outputs']
