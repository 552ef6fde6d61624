"""Will it fit my card? The fastest fit's choice for several memory budgets of one config.

The library of ``tools/analysis/fit_table.py``. For each budget it answers what
``scaling.memory_budget=<budget>`` would train with: per-GPU batch, gradient
checkpointing, precision, samples/s and the peaks after warm-up (allocated, reserved).

How it spends little GPU time. One real search, ``FastestFitHook`` with the largest
budget, tries every variant (batch x checkpointing) under the cap
``largest x (1 - margin)``; that budget's row is its choice. Every smaller budget B
(cap ``L = B x (1 - margin)``) is then decided per variant, in the same preference
order, and the search's rule (:func:`~mmdet3d_scaling.batch_size.fastest_fit.choose`)
picks among those that fit:

- **reused**: the trial fitted, its reserved peak is <= L, and the allocator gave no
  memory back and failed no request during it (:class:`CudaReleaseWatch`). The cap
  (``set_per_process_memory_fraction``) only acts when the allocator would reserve past
  it; with no release, the reserved memory only grows within a trial (``empty_cache``
  runs between trials, not in them), so the peak read after the warm-up is the whole
  trial's, and the same trial under L would take the same allocations, in the same
  order, with the same result and speed (timing noise aside, which the search itself
  has and ``min_gain`` absorbs).
- **out**: the trial did not fit the largest budget. Less memory does not make it fit
  (the assumption the searches make anyway, as the batch size search's bisection
  assumes a smaller batch fits when a larger one does).
- **tried**: anything else (reserved peak above L, or a release during the trial):
  the search's own trial (``FastestFitFinder.try_variant``) runs again under L, so
  the answer is the search's by construction. Most of these are out-of-memory trials,
  which stop within the first step.

So each row is what the search would choose under that cap, and only the variants
the larger cap could not decide are trained again. On a modelled device (CPU dry runs
and tests) the peak is a function of the batch: fits with peak <= L are reused, the
rest tried. With ``garbage_collection_threshold`` in ``PYTORCH_CUDA_ALLOC_CONF`` the
allocator frees its cache relative to the cap, so nothing is reused: every variant
that fitted is tried again under each smaller cap.

Calls the fastest fit's entry points and changes none of them: the search runs in
``FastestFitHook`` (turned on by ``scaling.memory_budget`` as in training, options in
its ``custom_hooks`` entry); the retrials use ``FastestFitFinder`` (its
``session()`` and ``try_variant``), ``CheckpointSwitch``, ``LargestSampleBatches`` and
``choose``;
:class:`~.hooks.stop_after_search.StopAfterSearch` ends ``train()`` after
``before_run``, so nothing trains and no weights are loaded.
"""
import copy
import json
import os
import os.path as osp
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.config import Config
from mmengine.model import is_model_wrapper
from mmengine.registry import RUNNERS

from ..batch_size.checkpoint_switch import CheckpointSwitch
from ..batch_size.fastest_fit import FastestFitFinder, FitResult, FitTrial, choose
from ..batch_size.fastest_fit_hook import FastestFitHook
from ..batch_size.memory_probe import (CudaMemoryProbe, MemoryProbe,
                                       ModeledCheckpointingProbe)
from ..batch_size.samples import LargestSampleBatches
from ..batch_size.trial import format_bytes
from ..utils.memory_size import parse_memory_budget
from ..utils.registry_scope import type_name
from .hooks.stop_after_search import SearchDone, StopAfterSearch

GiB = 2**30
MiB = 2**20
HOOK = 'FastestFitHook'
DEFAULT_WORK_DIR = osp.join('work_dirs', 'fit_table')
# allocator counters that move when memory is given back or a request fails
PRESSURE_STATS = ('reserved_bytes.all.freed', 'num_alloc_retries', 'num_ooms')
SEARCH, REUSED, OUT, TRIED = 'search', 'reused', 'out', 'tried'


# ------------------------------------------------------------------------ the input
def parse_budgets(text: str, where: str = '--budgets') -> List[Tuple[Union[float, str],
                                                                       int]]:
    """``'12,16,24'`` (GiB) or sizes with units (``'1536MiB,3GiB'``) as
    ``(value as scaling.memory_budget takes it, bytes)``, largest last.

    Raises:
        ValueError: naming the item, for an empty list or an item that is not a
            positive size (the message says which forms are accepted).
    """
    items = [item.strip() for item in str(text).split(',') if item.strip()]
    if not items:
        raise ValueError(f'{where}={text!r} names no budget: give GPU memory sizes, '
                         "comma-separated, e.g. --budgets 12,16,24 (GiB) or 1536MiB,3GiB.")
    budgets: Dict[int, Union[float, str]] = {}
    for item in items:
        value = _number(item)
        size = parse_memory_budget(value, f'{where} item {item!r}')
        budgets.setdefault(size, value)  # '24' and '24GiB' are one budget
    return [(value, size) for size, value in sorted(budgets.items())]


def _number(item: str) -> Union[float, str]:
    """A bare number is GiB (as in configs); anything else stays a string."""
    try:
        return float(item)
    except ValueError:
        return item


def table_config(config: str, largest: Union[float, str], hook_options: Dict[str, Any],
                 work_dir: Optional[str] = None,
                 cfg_options: Optional[dict] = None) -> Config:
    """The config as training would see it with ``scaling.memory_budget=largest``,
    reduced to what the search needs (no validation, no loader workers, no cache).

    Raises:
        FileNotFoundError: ``config`` is not a file (the message says what to give).
    """
    if not osp.isfile(config):
        raise FileNotFoundError(
            f'config {config!r} not found: give the path of a config file, e.g. '
            'configs/bevfusion_1gpu.py or configs/pointpillars/'
            'pointpillars_synthetic_kitti.py (relative to where you run the command).')
    cfg = Config.fromfile(config)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.work_dir = work_dir or osp.join(DEFAULT_WORK_DIR,
                                        osp.splitext(osp.basename(config))[0])
    cfg.launcher = 'none'  # one GPU: the question is about one card
    _ask_for_the_fit(cfg, largest)
    cfg.custom_hooks = _with_hook_options(cfg.get('custom_hooks') or [], hook_options)
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader',
                'test_cfg', 'test_evaluator'):
        cfg[key] = None
    # the trial batches are loaded in this process; workers would only start and stop
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.pop('prefetch_factor', None)
    return cfg


def _ask_for_the_fit(cfg: Config, largest: Union[float, str]) -> None:
    """``scaling.memory_budget`` as training gets it; other choosers of the batch off."""
    scaling = dict(cfg.get('scaling') or {})
    if 'total_batch_size' not in scaling:  # the config's own batch on one GPU
        scaling['total_batch_size'] = int(cfg.train_dataloader.batch_size)
    if scaling.get('per_gpu_batch_size') == 'auto':
        scaling['per_gpu_batch_size'] = None
    scaling['memory_budget'] = largest
    cfg.scaling = scaling
    cfg.runner_type = cfg.get('runner_type') or 'ScalingRunner'
    cfg.pop('auto_batch_size', None)
    cfg.custom_hooks = [h for h in cfg.get('custom_hooks') or []
                        if not _is_hook(h, 'AutoBatchSizeHook')]


def _is_hook(entry: Any, name: str) -> bool:
    return isinstance(entry, dict) and isinstance(entry.get('type'), str) and \
        type_name(entry['type']) == name


def _with_hook_options(hooks: list, options: Dict[str, Any]) -> list:
    """The config's FastestFitHook entry (or a new one) with the tool's options and no
    cache: the table measures, it does not reuse an earlier run's choice."""
    options = dict({k: v for k, v in options.items() if v is not None}, use_cache=False)
    hooks = [copy.deepcopy(h) for h in hooks]
    entry = next((h for h in hooks if _is_hook(h, HOOK)), None)
    if entry is None:
        hooks.append(dict(type=HOOK, **options))
    else:
        entry.update(options)
    return hooks


# -------------------------------------------------------------------- the GPU probe
def cuda_available() -> bool:
    return torch.cuda.is_available()


class CudaReleaseWatch(CudaMemoryProbe):
    """:class:`~mmdet3d_scaling.batch_size.memory_probe.CudaMemoryProbe` that notes,
    per trial, whether the allocator gave memory back or failed a request.

    A trial runs inside one ``limit()``; ``undisturbed[i]`` is True when the counters of
    :data:`PRESSURE_STATS` did not move between the start of trial ``i``'s limit and
    its ``peak_bytes()`` (None: the trial ended before, out of memory).
    """

    def __init__(self, device: Optional[torch.device] = None):
        super().__init__(device)
        self.undisturbed: List[Optional[bool]] = []
        self.moved: List[Dict[str, int]] = []  # per trial: counters that moved, by how much
        self._start: Optional[tuple] = None

    def _counters(self) -> tuple:
        stats = torch.cuda.memory_stats(self.device)
        return tuple(stats.get(key, 0) for key in PRESSURE_STATS)

    def limit(self, num_bytes: int):
        self._start = self._counters()
        self.undisturbed.append(None)
        self.moved.append({})
        return super().limit(num_bytes)

    def peak_bytes(self) -> int:
        peak = super().peak_bytes()
        if self._start is not None and self.undisturbed[-1] is None:
            now = self._counters()
            self.undisturbed[-1] = now == self._start
            self.moved[-1] = {key: int(b - a) for key, a, b in
                              zip(PRESSURE_STATS, self._start, now) if b != a}
        return peak


def build_probe(model: torch.nn.Module, kind: str,
                modelled: Optional[Dict[str, float]] = None) -> MemoryProbe:
    """``'cuda'``: the GPU, watched; ``'modeled'``: a modelled device (MiB figures in
    ``modelled``: capacity, per sample, per sample with checkpointing, fixed)."""
    if kind == 'cuda':
        if not torch.cuda.is_available():
            raise RuntimeError('fit table: no CUDA device here. Run it on the GPU whose '
                               'memory you ask about, or pass --probe modeled for a dry '
                               'run on a modelled device.')
        return CudaReleaseWatch()
    m = modelled or {}
    fixed = m.get('fixed_mib')
    return ModeledCheckpointingProbe(
        model, capacity_bytes=int(m.get('capacity_mib', 1024) * MiB),
        bytes_per_sample=m.get('mib_per_sample', 16) * MiB,
        checkpointed_bytes_per_sample=None if m.get('checkpointed_mib_per_sample') is None
        else m['checkpointed_mib_per_sample'] * MiB,
        fixed_bytes=None if fixed is None else int(fixed * MiB))


# ---------------------------------------------------------------- deciding a budget
@dataclass
class Decided:
    """One variant under one budget: the trial that decides it and where it is
    from (:data:`SEARCH`, :data:`REUSED`, :data:`OUT` or :data:`TRIED`)."""
    trial: FitTrial
    source: str

    @property
    def speed(self) -> Optional[float]:
        return self.trial.samples_per_s if self.trial.fits else None


@dataclass
class BudgetRow:
    """What the fastest fit would train with in one budget."""
    budget: Union[float, str]
    budget_bytes: int
    fit_bytes: int          # the budget or the card, the smaller (as the search fits)
    limit_bytes: int        # fit_bytes x (1 - margin): what trials may use
    choice: Optional[FitTrial]
    accumulation: Optional[int]
    variants: List[Decided] = field(default_factory=list)

    def counts(self) -> Dict[str, int]:
        found: Dict[str, int] = {}
        for d in self.variants:
            found[d.source] = found.get(d.source, 0) + 1
        return found


def classify(trial: FitTrial, limit_bytes: int, undisturbed: bool) -> str:
    """:data:`REUSED`, :data:`OUT` or :data:`TRIED` for a trial of the largest budget's
    search, under the smaller ``limit_bytes`` (the module docstring says why)."""
    if not trial.fits:
        return OUT
    if undisturbed and trial.peak_reserved_bytes is not None and \
            trial.peak_reserved_bytes <= limit_bytes:
        return REUSED
    return TRIED


class Retrials:
    """The search's own trial under a smaller budget, for the variants the largest
    budget's search cannot decide. Trial batches are loaded on first use."""

    def __init__(self, runner, model, switch: CheckpointSwitch, probe: MemoryProbe,
                 settings: Dict[str, Any]):
        self.runner, self.model, self.switch, self.probe = runner, model, switch, probe
        self.settings = settings
        self._batches: Optional[LargestSampleBatches] = None
        self.seconds = 0.0
        self.count = 0

    def run(self, trial: FitTrial, fit_bytes: int) -> FitTrial:
        start = time.perf_counter()
        if self._batches is None:
            loader = self.runner.train_dataloader
            self._batches = LargestSampleBatches(
                loader.dataset, loader.collate_fn,
                num_candidates=self.settings['num_candidates'],
                scan_limit=self.settings['scan_limit'])
        s = self.settings
        finder = FastestFitFinder(
            self.model, self.runner.optim_wrapper, self._batches, self.probe, self.switch,
            [trial.variant], budget_bytes=fit_bytes, margin=s['margin'],
            warmup_steps=s['warmup_steps'], timed_steps=s['timed_steps'],
            min_gain=s['min_gain'])
        try:
            with finder.session():  # the search's trial frame: state restored after
                return finder.try_variant(trial.variant)
        finally:
            self.switch.set(True)  # as built, like after a search
            self.seconds += time.perf_counter() - start
            self.count += 1


def decide_budget(budget: Tuple[Union[float, str], int], search: FitResult,
                  undisturbed: Sequence[bool], capacity: int, total_batch: int,
                  min_gain: float, retrials: Retrials) -> BudgetRow:
    """The fastest fit's choice in one budget from the largest budget's search,
    trying again only what that search cannot decide."""
    value, budget_bytes = budget
    fit_bytes = min(budget_bytes, capacity)
    limit = int(fit_bytes * (1.0 - search.margin))
    decided = []
    for trial, clean in zip(search.trials, undisturbed):
        if fit_bytes >= search.budget_bytes:  # the searched budget (or the card)
            decided.append(Decided(trial, SEARCH))
            continue
        source = classify(trial, limit, clean)
        if source == TRIED:
            trial = retrials.run(trial, fit_bytes)
        decided.append(Decided(trial, source))
    pick = choose([d.speed for d in decided], min_gain)
    choice = None if pick is None else decided[pick].trial
    return BudgetRow(value, budget_bytes, fit_bytes, limit, choice,
                     None if choice is None else total_batch // choice.batch_size,
                     decided)


# ------------------------------------------------------------------------ the run
def search_settings(hook: FastestFitHook, result: FitResult) -> Dict[str, Any]:
    """The search's settings, as the hook ran it (the retrials use the same)."""
    return dict(margin=result.margin, warmup_steps=hook.warmup_steps,
                timed_steps=hook.timed_steps, min_gain=hook.min_gain,
                num_candidates=hook.num_candidates, scan_limit=hook.scan_limit)


def measure(runner, budgets: Sequence[Tuple[Union[float, str], int]],
            switch: CheckpointSwitch, probe: MemoryProbe) -> Dict[str, Any]:
    """In ``before_run``, right after the search at the largest budget: every row."""
    hook = next(h for h in runner.hooks if isinstance(h, FastestFitHook))
    search: FitResult = hook.result
    if search is None:
        raise RuntimeError('fit table: FastestFitHook ran no search (no CUDA device '
                           'and no modelled probe?)')
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    settings = search_settings(hook, search)
    watched = getattr(probe, 'undisturbed', None)
    if watched is None:  # a modelled device: its peak does not depend on the cap
        undisturbed = [True] * len(search.trials)
    elif 'garbage_collection_threshold' in os.environ.get('PYTORCH_CUDA_ALLOC_CONF', ''):
        # the allocator then frees cache relative to the cap: every cap runs differently
        undisturbed = [False] * len(search.trials)
    elif len(watched) == len(search.trials):
        undisturbed = [bool(w) for w in watched]
    else:  # trials and limits do not pair up: decide nothing from the search
        undisturbed = [False] * len(search.trials)
    retrials = Retrials(runner, model, switch, probe, settings)
    total = int(runner.cfg.scaling.total_batch_size)
    rows = [decide_budget(b, search, undisturbed, probe.capacity_bytes(), total,
                          settings['min_gain'], retrials) for b in budgets]
    return dict(rows=rows, search=search, settings=settings, retrials=retrials,
                undisturbed=undisturbed,
                moved=getattr(probe, 'moved', [])[:len(search.trials)],
                precision=FastestFitHook._precision(runner.optim_wrapper),
                total_batch=total)


def run(config: str, budgets_text: str, hook_options: Dict[str, Any],
        probe_kind: str = 'cuda', modelled: Optional[Dict[str, float]] = None,
        work_dir: Optional[str] = None,
        cfg_options: Optional[dict] = None) -> Dict[str, Any]:
    """Build the runner, search at the largest budget, decide every budget."""
    start = time.perf_counter()
    budgets = parse_budgets(budgets_text)
    cfg = table_config(config, budgets[-1][0], hook_options, work_dir, cfg_options)
    runner = RUNNERS.build(cfg)
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    switch = CheckpointSwitch(model)  # as configured, before the search changes it
    probe = build_probe(model, probe_kind, modelled)
    fit = next(h for h in runner.hooks if isinstance(h, FastestFitHook))
    fit.probe = probe  # the search and the retrials read the same device
    stop = StopAfterSearch(lambda r: measure(r, budgets, switch, probe))
    runner.register_hook(stop)
    try:
        runner.train()
    except SearchDone:
        pass
    finally:
        if hasattr(probe, 'detach'):
            probe.detach()  # a modelled device's forward hook
    out = stop.result
    out.update(config=config, work_dir=cfg.work_dir, device=out['search'].device_name,
               capacity_bytes=probe.capacity_bytes(), probe=probe_kind,
               seconds=time.perf_counter() - start)
    return out


# ---------------------------------------------------------------------- the output
def _gib(num_bytes: Optional[int]) -> Optional[float]:
    return None if num_bytes is None else num_bytes / GiB


def _budget_label(row: BudgetRow) -> str:
    label = format_bytes(row.budget_bytes)
    return label if row.fit_bytes == row.budget_bytes else f'{label} (card)'


def table(result: Dict[str, Any]) -> str:
    """One line a budget: what it would train with, and how that was decided."""
    search = result['search']
    head = (f"fit table: {result['config']} on {result['device']} "
            f"({format_bytes(result['capacity_bytes'])}), {result['precision']}, total "
            f"batch {result['total_batch']}, {search.margin:.0%} of each budget kept "
            'free; peaks after warm-up')
    cols = ('budget', 'fits in', 'batch', 'acc.', 'checkpointing', 'samples/s',
            'alloc. peak', 'reserved peak', 'decided by')
    lines = [head, ' | '.join(cols)]
    for row in result['rows']:
        c = row.choice
        how = ', '.join(f'{n} {s}' for s, n in row.counts().items())
        cells = [_budget_label(row), format_bytes(row.limit_bytes)] + (
            ['does not fit'] + [''] * 5 if c is None else
            [str(c.batch_size), str(row.accumulation), 'on' if c.checkpointing else 'off',
             f'{c.samples_per_s:.2f}', format_bytes(c.peak_allocated_bytes),
             format_bytes(c.peak_reserved_bytes)]) + [how]
        lines.append(' | '.join(cells))
    retrials = result['retrials']
    lines.append(f"{len(search.trials)} trials in the search at the largest budget "
                 f"({search.seconds:.1f} s), {retrials.count} tried again under a smaller "
                 f"cap ({retrials.seconds:.1f} s); {result['seconds']:.1f} s in all")
    return '\n'.join(lines)


def _trial_dict(trial: FitTrial) -> Dict[str, Any]:
    data = asdict(trial)
    data.update(peak_allocated_gib=_gib(trial.peak_allocated_bytes),
                peak_reserved_gib=_gib(trial.peak_reserved_bytes))
    return data


def to_json(result: Dict[str, Any]) -> Dict[str, Any]:
    """The data file: the rows, every variant per budget, the search, settings."""
    rows = []
    for row in result['rows']:
        rows.append(dict(
            budget=row.budget, budget_bytes=row.budget_bytes,
            budget_gib=_gib(row.budget_bytes), fit_bytes=row.fit_bytes,
            limit_bytes=row.limit_bytes, limit_gib=_gib(row.limit_bytes),
            choice=None if row.choice is None else dict(
                _trial_dict(row.choice), accumulation=row.accumulation,
                precision=result['precision']),
            variants=[dict(_trial_dict(d.trial), source=d.source)
                          for d in row.variants]))
    retrials = result['retrials']
    return dict(
        config=result['config'], device=result['device'], probe=result['probe'],
        capacity_bytes=result['capacity_bytes'],
        capacity_gib=_gib(result['capacity_bytes']), precision=result['precision'],
        total_batch_size=result['total_batch'], settings=result['settings'],
        torch=torch.__version__, budgets=rows, search=result['search'].to_dict(),
        # per search trial: whether smaller budgets may reuse it, and why not
        search_undisturbed=result['undisturbed'], search_counters_moved=result['moved'],
        retrials=retrials.count, retrial_seconds=retrials.seconds,
        seconds=result['seconds'])


def default_out(work_dir: str) -> str:
    return osp.join(work_dir, 'fit_table.json')


def write_json(data: Dict[str, Any], out: str) -> None:
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    with open(out, 'w') as f:
        json.dump(data, f, indent=1)


MARKDOWN_HEAD = ('| config | budget | batch x acc. | checkpointing | precision | samples/s '
                 '| peak allocated / reserved | data |\n|---|---|---|---|---|---|---|---|')


def markdown_rows(data: Dict[str, Any], link: str) -> List[str]:
    """The docs table's rows of one data file (:func:`to_json`'s dict): one a budget."""
    rows = []
    for row in data['budgets']:
        c = row['choice']
        cells = ([f"`{data['config']}`", f"{row['budget_gib']:g} GiB"]
                 + (['does not fit'] + [''] * 4 if c is None else [
                     f"{c['batch_size']} x {c['accumulation']}",
                     'on' if c['checkpointing'] else 'off', c['precision'],
                     f"{c['samples_per_s']:.2f}",
                     f"{c['peak_allocated_gib']:.2f} / {c['peak_reserved_gib']:.2f} GiB"])
                 + [f'[json]({link})'])
        rows.append('| ' + ' | '.join(cells) + ' |')
    return rows


def markdown_table(files: Sequence[str], docs_dir: str) -> str:
    """The fit table of docs/auto_batch_size.md from its data files, in the given order
    (links relative to ``docs_dir``)."""
    lines = [MARKDOWN_HEAD]
    for path in files:
        with open(path) as f:
            data = json.load(f)
        lines += markdown_rows(data, osp.relpath(path, docs_dir).replace(os.sep, '/'))
    return '\n'.join(lines)
