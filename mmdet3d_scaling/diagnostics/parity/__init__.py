"""Does the recipe reproduce? One config, several arrangements of one effective batch.

The ``scaling`` recipe promises that one config keeps its recipe (effective batch, LR,
schedule in optimizer steps) on 1..N processes. This module checks it end to end: it
trains the config in several *arrangements* of the same effective batch ``T = B x K``,
each with several seeds, through the repository's ``tools/train.py`` (``torchrun`` via
``tools/dist_train.sh`` for several processes) and evaluates every run with
``tools/test.py``:

- ``1proc_bB_accK``: 1 process, micro-batch B, K accumulation steps (the reference);
- ``1proc_bT``: 1 process, batch T at once, no accumulation;
- ``Nproc_bB_acc{K/N}``: N processes (gloo on a CPU, NCCL on GPUs), micro-batch B,
  K/N accumulation steps;
- ``stock`` (optional): the config as written, without ``scaling`` overrides.

Every recipe arrangement keeps ``scaling.total_batch_size = T`` and sets
``scaling.per_gpu_batch_size`` / ``max_per_gpu_batch_size``; the recipe derives the
accumulation and converts LR and iteration counts. The result is one JSON (every run's
overrides, seed, metrics, loss per optimizer step, wall time, and the per-arrangement
mean / std / min / max) and a loss-curve overlay PNG.

One module a job: :mod:`.plan` (arrangements), :mod:`.overrides` (config rewrites as
``--cfg-options``), :mod:`.launch` (one run's subprocesses and record), :mod:`.logs`
(checkpoint, metrics and loss curve read back), :mod:`.summary` (seed statistics, the
table), :mod:`.plots` (the loss PNG) and :mod:`.benchmark` (prepare, run, report).
The command line is :mod:`mmdet3d_scaling.diagnostics.parity_cli`.

Loss curves are read from mmengine's ``vis_data/scalars.json`` with the logger set to
every loop iteration; a point is the mean loss over one optimizer step's micro-batches
*of rank 0* (mmengine logs rank 0's losses only), so an N-process curve averages 1/N of
each step's samples and is noisier, not biased.
"""
from .benchmark import (Benchmark, dry_run_lines, prepare, run_benchmark,
                        write_report)
from .errors import ParityError
from .launch import RESULT_FILE, ROOT, RunSpec, build_runs, execute, finished_record
from .logs import (KITTI_CLASSES, headline_metrics, last_checkpoint, loss_per_step,
                   read_test_metrics)
from .overrides import (COMMON_OVERRIDES, STEP_FIELDS, data_root_overrides,
                        format_options, schedule_overrides)
from .plan import Arrangement, config_total_batch, plan_arrangements, select
from .plots import plot_losses
from .summary import (TABLE_METRICS, describe, markdown_table, summarise,
                      table_metrics)

__all__ = [
    'Arrangement', 'Benchmark', 'COMMON_OVERRIDES', 'KITTI_CLASSES', 'ParityError',
    'RESULT_FILE', 'ROOT', 'RunSpec', 'STEP_FIELDS', 'TABLE_METRICS', 'build_runs',
    'config_total_batch', 'data_root_overrides', 'describe', 'dry_run_lines', 'execute',
    'finished_record', 'format_options', 'headline_metrics', 'last_checkpoint',
    'loss_per_step', 'markdown_table', 'plan_arrangements', 'plot_losses', 'prepare',
    'read_test_metrics', 'run_benchmark', 'schedule_overrides', 'select', 'summarise',
    'table_metrics', 'write_report'
]
