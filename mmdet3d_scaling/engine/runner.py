"""``ScalingRunner``: mmengine's Runner with the plugin's config keys honoured.

Select it with ``runner_type = 'ScalingRunner'`` (all configs of this repository do).
It is the plugin's one entry point into mmengine:

- :meth:`ScalingRunner.from_cfg` prepares the config once (legacy keys, ``scaling``
  plan, AMP, distributed settings: :func:`mmdet3d_scaling.config.prepare_config`) and
  prints the patches in effect (and the selected ones not applied, with why);
- the patch sets the config selects (``patches = ['speed']``) and the run's
  process-wide settings (matmul precision, trusted checkpoints: :mod:`.run_settings`)
  are in effect while the runner builds and during each :meth:`train` / :meth:`val` /
  :meth:`test`, and reverted after each: another runner in the process (a notebook, a
  sweep, a test session) gets the process as ``import mmdet3d_scaling`` left it;
- :meth:`train` / :meth:`val` / :meth:`test` first check the data paths of the loaders
  that command reads (:mod:`mmdet3d_scaling.config.preflight`);
- the hooks that change the plan at run time (auto batch size, resume on another GPU
  count) go through its methods (:meth:`apply_plan`, ...), so access to mmengine's
  private Runner state lives in this one class (and the loop length in
  :mod:`.train_length`, the optim wrapper's counters in :mod:`.optim_state`).
"""
import contextlib
import copy
import logging
import os.path as osp
from typing import Any, Dict, Iterator, List, Optional

from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop, Runner
from mmengine.runner.base_loop import BaseLoop
from mmengine.runner.loops import _InfiniteDataloaderIterator
from mmengine.runner.utils import calc_dynamic_intervals

from ..patches import patching
from ..patches.fixes import runner_handoff
from ..patches.fixes.checkpoint import previous_checkpoint
from ..config import plugin_keys, prepare_config
from ..config.preflight import check_data_paths
from ..config.plan_writer import apply_plan, recorded_plan
from ..config.scaling_plan import ScalingPlan, format_plan
from ..config.scaling_recipe import BN_MOMENTUM_MODES
from ..registry import check_replaced_types
from . import batchnorm_momentum as bn
from . import checkpoint_match as match
from .hang_doctor import explain_failure
from .optim_state import (AccumulationRequest, reset_to_initial, scale_lr,
                          set_accumulation)
from ..parallel.cpu_affinity import apply_cpu_affinity
from .run_settings import apply_run_settings, run_settings
from .train_length import set_max_iters
from .startup_log import startup_level, startup_lines
from .work_dir_lock import run_locked


def patch_selection(cfg: Optional[Config]) -> List[str]:
    """``cfg.patches`` (sets or names) as a checked list.

    Raises:
        ValueError: not a list of patch sets or names, or an unknown entry (named).
    """
    selection = (cfg.get('patches') if cfg is not None else None) or []
    if isinstance(selection, str):
        selection = [selection]
    if not isinstance(selection, (list, tuple)):
        raise ValueError(f"patches must be a list of patch sets ({', '.join(patching.KINDS)})"
                         f' or patch names, got {selection!r}')
    patching.resolve(selection)  # an unknown name fails here, before anything is built
    return list(selection)


def patch_table(selection: List[str]) -> str:
    """The start-up table: the patches in effect, then the selected (or default) ones
    that are not, each with why (e.g. an installed version outside its range)."""
    selected = patching.resolve(list(selection) + patching.default_selection())
    skipped = patching.not_applied()
    names = [n for n in patching.PATCHES
             if n in patching.applied() or (n in selected and n in skipped)]
    return patching.table(names) if names else '  none'


@RUNNERS.register_module()
class ScalingRunner(Runner):
    """mmengine ``Runner`` that understands the mmdet3d_scaling config keys.

    Built like any Runner (``RUNNERS.build(cfg)`` with ``runner_type='ScalingRunner'``,
    or ``ScalingRunner.from_cfg(cfg)``); the keys it adds are listed in
    :data:`mmdet3d_scaling.config.PLUGIN_KEYS` and documented in ``docs/configs.md``.
    """

    @classmethod
    def from_cfg(cls, cfg: Config) -> 'ScalingRunner':
        cfg = copy.deepcopy(cfg)
        check_replaced_types(cfg.to_dict())
        found = plugin_keys(cfg)
        selection = patch_selection(cfg)
        # built with the patches it trains with; reverted once built (see in_scope)
        with patching.scoped(selection):
            with startup_lines():  # once per job: global rank 0 (others: DEBUG)
                prepare_config(cfg)
                apply_run_settings(cfg)
                print_log(f"ScalingRunner: plugin keys in this config: "
                          f"{', '.join(found) or 'none'}\npatches in effect (the "
                          "config's own selection only while this runner builds, "
                          "trains, validates or tests):\n"
                          # prepared: a key may select patches (async_logging)
                          f"{patch_table(patch_selection(cfg))}",
                          logger='current')
            with run_settings(cfg):
                return super().from_cfg(cfg)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._patches = patch_selection(self.cfg)  # applied again by each command
        # distributed.cpu_affinity='split': CPUs per local rank, set before the loader
        # workers (built lazily by train()) start and inherit it
        apply_cpu_affinity(self.cfg.get('distributed') or {}, self.logger)
        # per-step BatchNorm momenta as built from the config; a new plan converts again
        # from these (scaling.bn_momentum, engine/batchnorm_momentum.py)
        self._bn_momentum_per_step: Dict[str, float] = {}
        if self._bn_momentum_mode() == 'per_step':
            self._bn_momentum_per_step = bn.record_momenta(self.model)
            self._convert_bn_momentum(recorded_plan(self.cfg))

    def _bn_momentum_mode(self) -> str:
        scaling = self.cfg.get('scaling') or {}
        return scaling.get('bn_momentum', BN_MOMENTUM_MODES[0]) if scaling else 'per_forward'

    def _convert_bn_momentum(self, plan: Optional[ScalingPlan]) -> None:
        if plan is None or not self._bn_momentum_per_step:
            return
        bn.set_momenta(self.model, self._bn_momentum_per_step, plan.accumulation)
        if plan.accumulation > 1:
            self.logger.info(bn.describe(self._bn_momentum_per_step, plan.accumulation))

    # ------------------------------------------------------------------ commands
    @contextlib.contextmanager
    def in_scope(self) -> Iterator[None]:
        """This runner's patches and process-wide settings for one command, reverted
        afterwards (also on an exception), so that they never outlive it. ``train()``,
        ``val()`` and ``test()`` run in it; a tool that drives ``model.train_step``
        itself wraps its steps: ``with runner.in_scope(): ...``."""
        with patching.scoped(self._patches), run_settings(self.cfg):
            yield

    def _preflight(self, *loaders: str) -> None:
        evaluators = [name.replace('dataloader', 'evaluator') for name in loaders
                      if name != 'train_dataloader']
        check_data_paths(self.cfg, loaders=loaders, evaluators=evaluators)

    def train(self):
        loaders = ['train_dataloader']
        if self._val_dataloader is not None and self.cfg.get('val_cfg') is not None:
            loaders.append('val_dataloader')
        self._preflight(*loaders)
        # rank 0 holds WORK_DIR/.train.lock while training: a second live run there is
        # refused (engine/work_dir_lock.py)
        with self.in_scope():
            return run_locked(self._train_explained, self.work_dir, self.rank,
                              self.distributed)

    def _train_explained(self):
        try:
            return super().train()
        except BaseException as exc:  # a lost peer: the hang doctor names it
            explain_failure(self, exc)
            raise

    def val(self) -> Dict[str, Any]:
        self._preflight('val_dataloader')
        with self.in_scope():
            return super().val()

    def test(self) -> Dict[str, Any]:
        self._preflight('test_dataloader')
        with self.in_scope():
            return super().test()

    # ------------------------------------------ checkpoint matching (resume_strict)
    # --resume and evaluation refuse a checkpoint that does not fit the model unless
    # resume_strict=False; load_from for training (fine-tuning) loads leniently and logs
    # a summary. See engine/checkpoint_match.py and docs/scaling_guide.md.
    _checkpoint_purpose = None  # set by load_or_resume for the load it starts

    def load_or_resume(self) -> None:
        """mmengine's ``load_or_resume`` with the checkpoint checked against the model:
        resume (``--resume``) and evaluation (``val()``/``test()`` with ``load_from``)
        refuse a mismatch unless ``resume_strict=False``; fine-tuning logs a summary."""
        if self._has_loaded or (not self._resume and self._load_from is None):
            return super().load_or_resume()
        if self._resume and self._load_from is None and not self._auto_resume_target():
            # mmengine would log "Auto resumed from the latest checkpoint None."
            self._resume = False
            try:
                return super().load_or_resume()
            finally:
                self._resume = True
        self._checkpoint_purpose = ('resume' if self._resume else
                                    'finetune' if self.train_loop_built else 'evaluate')
        try:
            super().load_or_resume()
        finally:
            self._checkpoint_purpose = None

    def _auto_resume_target(self) -> Optional[str]:
        """What ``--resume`` without a path loads: ``work_dir/last_checkpoint``'s file.
        Without that pointer: a warning that training starts from iteration 0 when the
        folder holds no checkpoint, an error naming the newest one when it does."""
        from mmengine.runner.checkpoint import find_latest_checkpoint
        target = find_latest_checkpoint(self.work_dir)
        if target is not None:
            return target
        newest = previous_checkpoint(osp.join(self.work_dir, 'last_checkpoint'))
        if newest is not None:
            raise FileNotFoundError(
                f'--resume: {self.work_dir} has no last_checkpoint file (the pointer '
                f'--resume without a path follows) but holds the checkpoint {newest}: '
                f'resume it with `--resume {newest}`, or use another --work-dir to start '
                'from iteration 0.')
        self.logger.warning(
            f'--resume: no checkpoint found in {self.work_dir} (no last_checkpoint file, '
            'no *.pth): training starts from iteration 0.')
        return None

    def load_checkpoint(self, filename: str, map_location: Any = 'cpu',
                        strict: bool = False,
                        revise_keys: list = [(r'^module.', '')]) -> dict:  # noqa: B006
        """``Runner.load_checkpoint``, comparing the weights with the model first when
        called from :meth:`load_or_resume` (direct calls behave as in mmengine)."""
        purpose = self._checkpoint_purpose
        if purpose is None:
            return super().load_checkpoint(filename, map_location, strict, revise_keys)
        from mmengine.runner.checkpoint import _load_checkpoint, _load_checkpoint_to_model
        strict_keys = match.strict_setting(self.cfg)
        checkpoint = _load_checkpoint(filename, map_location=map_location)
        report = match.compare(self.model, match.checkpoint_weights(checkpoint,
                                                                    revise_keys))
        model_name = type(match.bare_model(self.model)).__name__
        if purpose == 'finetune' or report.matches:
            if purpose == 'finetune':
                self.logger.log(logging.INFO if report.matches else logging.WARNING,
                                match.summary(report, filename))
        elif strict_keys:
            raise RuntimeError(match.refusal(report, filename, purpose, model_name))
        else:
            self.logger.warning(f'{match.STRICT_KEY}=False: loading {filename!r} into '
                                f'{model_name} anyway: {report.counts()}.')
        self.call_hook('after_load_checkpoint', checkpoint=checkpoint)
        checkpoint = _load_checkpoint_to_model(match.bare_model(self.model), checkpoint,
                                               strict, revise_keys=revise_keys)
        self._has_loaded = True
        self.logger.info(f'Load checkpoint from {filename}')
        return checkpoint
    # ------------------------------------------------- end checkpoint matching

    # --------------------------------------------------- changing the plan at run time
    @property
    def train_loop_built(self) -> bool:
        """Whether ``train()`` built the train loop (``before_run`` of val/test: no)."""
        return isinstance(self._train_loop, BaseLoop)

    @property
    def scaling_plan(self) -> Optional[ScalingPlan]:
        """The scaling recipe's plan this runner trains with (None without
        ``scaling``); :meth:`apply_plan` changes it."""
        return recorded_plan(self.cfg)

    def apply_plan(self, plan: ScalingPlan, reason: str) -> None:
        """Train with ``plan`` from now on (before any step ran).

        The scaling recipe writes the plan into a copy of the config (batch,
        accumulation, LR, iteration counts as optimizer steps); the parts of the runner
        built from those values are replaced or updated: dataloader, loop length and
        validation schedule, accumulation, LR, checkpoint interval, schedulers.
        """
        old = recorded_plan(self.cfg)
        cfg = apply_plan(copy.deepcopy(self.cfg), plan)
        if plan.per_gpu_batch != self.train_dataloader.batch_size:
            self._rebuild_train_dataloader(plan.per_gpu_batch)
        self._update_train_loop(cfg.get('train_cfg') or {})
        for hook in self.hooks:  # a hook's window request is checked against the
            if isinstance(hook, AccumulationRequest):  # configured wrapper, not the plan
                hook.request_accumulation(self.optim_wrapper)
        set_accumulation(self.optim_wrapper, plan.accumulation)
        lr_ratio = plan.lr_scale / (old.lr_scale if old is not None else 1.0)
        if lr_ratio != 1:
            scale_lr(self.optim_wrapper, lr_ratio)
        self._update_checkpoint_interval(cfg)
        if self.param_schedulers is not None and cfg.get('param_scheduler') is not None:
            reset_to_initial(self.optim_wrapper)
            self.param_schedulers = self.build_param_scheduler(
                copy.deepcopy(cfg.param_scheduler))
        self.cfg = cfg  # checkpoints record the config in use
        self.logger.info(f'{reason}:\n' + format_plan(plan))
        self._convert_bn_momentum(plan)

    def restart_train_workers(self) -> None:
        """Build the train dataloader again (same settings, same sample order and the
        current ``worker_init_fn``), so that its workers start now: iteration-based
        loops start them when the loop is built, before any hook ran (PreemptionHook
        changes how workers treat signals)."""
        loader = self.train_dataloader
        if getattr(loader, 'num_workers', 0):
            self._rebuild_train_dataloader(loader.batch_size, loader.worker_init_fn)

    def _rebuild_train_dataloader(self, batch_size: int,
                                  worker_init_fn: Optional[Any] = None) -> None:
        loop = self.train_loop
        loader_cfg = self._train_dataloader
        if not isinstance(loader_cfg, dict):
            raise TypeError('a new per-GPU batch needs train_dataloader as a config dict '
                            f'to rebuild it, got a built {type(loader_cfg).__name__}.')
        loader_cfg = copy.copy(loader_cfg)
        dataset = loop.dataloader.dataset
        if loader_cfg.get('num_batch_per_epoch') is not None:
            dataset = getattr(dataset, '_dataset', dataset)  # it is sliced again
        loader_cfg['dataset'] = dataset  # built once; only the loader changes
        loader_cfg['batch_size'] = batch_size
        diff_rank_seed = self._randomness_cfg.get('diff_rank_seed', False)
        loop.dataloader = self.build_dataloader(
            loader_cfg, seed=self.seed, diff_rank_seed=diff_rank_seed)
        if worker_init_fn is not None:  # before the iterator below starts the workers
            loop.dataloader.worker_init_fn = worker_init_fn
        if isinstance(loop, IterBasedTrainLoop):
            loop.dataloader_iterator = _InfiniteDataloaderIterator(loop.dataloader)

    def _update_train_loop(self, train_cfg: dict) -> None:
        """Loop length and validation schedule for the new batch / accumulation."""
        loop = self.train_loop
        if isinstance(loop, EpochBasedTrainLoop):
            set_max_iters(loop, loop.max_epochs * len(loop.dataloader))
        elif isinstance(loop, IterBasedTrainLoop):
            set_max_iters(loop, int(train_cfg.get('max_iters', loop.max_iters)))
        else:
            raise TypeError(f'a new scaling plan needs EpochBasedTrainLoop or '
                            f'IterBasedTrainLoop, not {type(loop).__name__}.')
        loop.val_begin = train_cfg.get('val_begin', loop.val_begin)
        loop.val_interval = train_cfg.get('val_interval', loop.val_interval)
        loop.dynamic_milestones, loop.dynamic_intervals = calc_dynamic_intervals(
            loop.val_interval, train_cfg.get('dynamic_intervals'))

    def _update_checkpoint_interval(self, cfg: Config) -> None:
        """An iteration-based checkpoint ``interval`` and ``save_begin`` count optimizer
        steps in the recipe: checkpoints land on accumulation-window ends."""
        ckpt = (cfg.get('default_hooks') or {}).get('checkpoint')
        if not isinstance(ckpt, dict):
            return
        for hook in self.hooks:
            if isinstance(hook, CheckpointHook):
                for key in ('interval', 'save_begin'):
                    if key in ckpt:
                        setattr(hook, key, ckpt[key])


def hand_off(cfg: Config) -> Optional[ScalingRunner]:
    """The ``runner_handoff`` fix's builder: a ScalingRunner for a config that uses
    plugin keys (saying which), None for a stock config (upstream builds it)."""
    found = plugin_keys(cfg)
    if not found:
        return None
    print_log(f"mmdet3d_scaling: the config uses {', '.join(found)}: built by "
              "ScalingRunner (runner_type='ScalingRunner' selects it explicitly).",
              logger='current', level=startup_level())
    return ScalingRunner.from_cfg(cfg)


runner_handoff.plugin_runner = hand_off  # Runner.from_cfg of a config with plugin keys


def require_scaling_runner(runner: Any, who: str) -> ScalingRunner:
    """``runner`` if it is a ScalingRunner, else a TypeError that says how to get one."""
    if not isinstance(runner, ScalingRunner):
        raise TypeError(f"{who} changes the scaling plan at run time, which needs "
                        f"runner_type='ScalingRunner' (got {type(runner).__name__}); "
                        "add it to the config.")
    return runner
