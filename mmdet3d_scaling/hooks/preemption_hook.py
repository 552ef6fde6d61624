"""PreemptionHook: SIGTERM / SIGUSR1 save a checkpoint and end the run with exit code 0.

Clusters stop jobs with SIGTERM (Slurm at the time limit or on preemption, Kubernetes,
torchrun passing its own SIGTERM on) and Slurm's ``--signal=USR1@<seconds>`` warns
ahead of the limit. Without this hook the process dies at once (exit code -15), losing
everything since the last checkpoint. With it the signal only sets a flag; at the next
optimizer-step boundary every rank agrees to stop, rank 0 saves a checkpoint that
records the sample position inside the epoch, and the run ends with exit code 0, ready
for a requeue with ``--resume``.
"""
import atexit
import logging
import math
import multiprocessing
import os
import os.path as osp
import random
import signal
import threading
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import torch
from mmengine.dist import all_reduce, get_comm_device, get_world_size, is_distributed
from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook, Hook
from mmengine.logging import print_log
from mmengine.runner import IterBasedTrainLoop

from mmdet3d.registry import HOOKS

from ..registry import register
from .optimizer_step_param_scheduler_hook import optimizer_stepped

DATA_BATCH = Optional[Union[dict, tuple, list]]
#: checkpoint['meta'][POSITION_KEY]: where in its epoch the checkpoint was taken
POSITION_KEY = 'sample_position'
#: checkpoint['meta'][RNG_KEY]: the main process's random streams at the save
RNG_KEY = 'rng_states'
_UNCATCHABLE = ('SIGKILL', 'SIGSTOP')


class _WorkersIgnore:
    """``worker_init_fn`` wrapper: the worker ignores ``signals`` while its main
    process lives on, then runs ``init``.

    A signal sent to the whole process group must not end the workers (torch's own
    worker handler ends them on SIGTERM, and the main process then fails with
    "DataLoader worker ... is killed by signal"). Once the main process exits, its
    ``atexit`` sets ``exiting`` before multiprocessing terminates daemonic children
    with SIGTERM (the hang doctor sets it too before it ends the workers), and a worker
    then exits with code 0, as torch's own worker does on its parent's SIGTERM: dying
    by the signal instead makes torch's SIGCHLD handler in the main process raise
    "DataLoader worker (pid N) is killed by signal" inside multiprocessing's exit join
    (an ``Exception ignored in atexit callback`` traceback after a clean run). A class
    (not a closure) so that spawned workers can unpickle it.
    """

    def __init__(self, signals: Sequence[int], init: Optional[Any], exiting: Any) -> None:
        self.signals, self.init, self.exiting = list(signals), init, exiting

    def __call__(self, worker_id: int) -> None:
        for signum in self.signals:
            signal.signal(signum, self._on_signal)
        if self.init is not None:
            self.init(worker_id)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.exiting.value:  # the main process ends it: exit 0 as torch's worker does
            os._exit(0)


def rng_states() -> dict:
    """The global random streams of this process: python, numpy, torch (and CUDA's
    of the current device once CUDA is in use)."""
    states = dict(python=random.getstate(), numpy=np.random.get_state(),
                  torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states['cuda'] = torch.cuda.get_rng_state()
    return states


def set_rng_states(states: dict) -> None:
    """Put back what :func:`rng_states` returned."""
    random.setstate(_as_tuple(states['python']))
    np.random.set_state(_as_tuple(states['numpy']))
    torch.set_rng_state(states['torch'])
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states['cuda'])


def _as_tuple(value: Any) -> Any:
    """random / numpy want tuples back (a checkpoint round trip may give lists)."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of sample ``index`` in ``epoch`` (0-based) of a run seeded ``seed``."""
    return int(np.random.SeedSequence([seed % 2**32, epoch, index]).generate_state(1)[0])


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class _SeededSamples:
    """``dataset.__getitems__`` (torch's map-style fetcher calls it with a batch's
    indices): each sample's pipeline runs with python's, numpy's and torch's global
    streams seeded by :func:`sample_seed`, so its augmentation depends on (seed, epoch,
    index) alone, not on which process made it or what it made before. In the main
    process (``num_workers=0``) the streams are put back after each sample."""

    def __init__(self, dataset: Any, seed: int, epoch: Any, restore: bool) -> None:
        self.dataset, self.seed, self.epoch, self.restore = dataset, seed, epoch, restore

    def __call__(self, indices: Sequence[int]) -> List[Any]:
        out = []
        for index in indices:
            saved = rng_states() if self.restore else None
            _seed_all(sample_seed(self.seed, self.epoch.value, int(index)))
            try:
                out.append(self.dataset[index])
            finally:
                if saved is not None:
                    set_rng_states(saved)
        return out


class _WorkersSeedSamples:
    """``worker_init_fn`` wrapper: the worker's copy of the dataset makes its samples
    through :class:`_SeededSamples`, then ``init`` runs (picklable for spawn)."""

    def __init__(self, seed: int, epoch: Any, init: Optional[Any]) -> None:
        self.seed, self.epoch, self.init = seed, epoch, init

    def __call__(self, worker_id: int) -> None:
        if self.init is not None:
            self.init(worker_id)
        dataset = torch.utils.data.get_worker_info().dataset
        dataset.__getitems__ = _SeededSamples(dataset, self.seed, self.epoch, False)


_EXITING: Any = None  # set at the main process's exit, read by the loader workers


def _exiting_flag() -> Any:
    global _EXITING
    if _EXITING is None:
        _EXITING = multiprocessing.Value('b', 0, lock=False)
        atexit.register(_set_exiting)  # runs before multiprocessing's own (LIFO)
    return _EXITING


def _set_exiting() -> None:
    if _EXITING is not None:
        _EXITING.value = 1


def release_workers() -> None:
    """Let shielded loader workers end on the next SIGTERM (before terminating them)."""
    _set_exiting()


class Preempted(SystemExit):
    """The run stopped on a signal after saving a checkpoint (exit code 0)."""


def train_sampler(dataloader: Any) -> Any:
    """The index sampler of a train dataloader (inside its batch sampler if any)."""
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    sampler = getattr(batch_sampler, 'sampler', None)
    return sampler if sampler is not None else getattr(dataloader, 'sampler', None)


@register(HOOKS)
class PreemptionHook(Hook):
    """On SIGTERM / SIGUSR1: checkpoint at the next optimizer step, then exit 0.

    - **When**: the signal handler only sets a flag. After the next iteration that ends
      with an optimizer step (with gradient accumulation: the end of a window, so the
      checkpoint holds no half-accumulated gradients), after every other hook of that
      iteration (priority ``LOWEST``), the hook saves ``iter_<N>.pth`` into the
      CheckpointHook's folder (the work dir by default), points
      ``<work_dir>/last_checkpoint`` at it (what ``--resume`` without a path loads),
      logs ``PreemptionHook: SIGTERM received: saved <path> ...`` and raises
      :class:`Preempted` (a ``SystemExit`` with code 0). A signal arriving during
      validation is acted on at the first optimizer step after it. A second identical
      signal before the boundary is handled by the handler that was there before (by
      default: the process ends at once).
    - **All ranks agree**: in distributed runs the flag is all-reduced (max) at each
      optimizer step (one scalar collective per step), so every rank stops after the
      same iteration even when only some of them got the signal.
    - **Exact resume**: every checkpoint saved while training (this hook's and
      CheckpointHook's) records in ``meta['sample_position']`` the samples of the
      current epoch already trained. Resuming an epoch-based loop with a sampler that
      can skip (:class:`mmdet3d_scaling.datasets.ResumableSampler`, which ScalingRunner
      puts in place of ``DefaultSampler`` when this hook is configured) continues the
      epoch after those samples, where mmengine would run the whole epoch again. An
      iteration-based loop needs nothing: mmengine's loop fast-forwards its dataloader
      by the resumed iteration count. A different world size or batch size at resume
      skips the same number of samples of the epoch (rounded up to whole samples per
      rank, with a warning when it does not divide).
    - **Random streams** (epoch-based loops, ``seed_samples``): checkpoints record the
      main process's python / numpy / torch (/ CUDA) random states, restored when a
      run resumes; each training sample's pipeline runs with those global streams
      seeded by (seed, epoch, sample index), in the loader workers or the main
      process, so a sample's augmentation is the same whichever worker makes it after
      a resume; the train loader draws its workers' base seed from its own generator,
      not the main process's torch stream. Transforms that keep state from sample to
      sample (ObjectSample's database sampler walks a shuffled list) are not restored.
    - Train dataloader workers ignore these signals (torch's own workers die on
      SIGTERM, which then fails the main process), so a signal sent to the whole
      process group (Slurm, ``kill -- -PGID``) reaches only the main process's
      handler. An iteration-based loop started its workers before the hook ran;
      ScalingRunner starts them again (once, at the start of training).

    Args:
        signals (Sequence[str]): names of the signals that request a stop. Defaults to
            ``('SIGTERM', 'SIGUSR1')``.
        seed_samples (bool): in epoch-based loops, seed each training sample's
            pipeline by (seed, epoch, index) for an exact resume. Defaults to True.
    """

    priority = 'LOWEST'  # the checkpoint sees every other hook's after_train_iter

    def __init__(self, signals: Sequence[str] = ('SIGTERM', 'SIGUSR1'),
                 seed_samples: bool = True) -> None:
        if not isinstance(seed_samples, bool):
            raise ValueError(f'PreemptionHook: seed_samples must be True or False, got '
                             f'{seed_samples!r}.')
        self.seed_samples = seed_samples
        self._epoch_value: Any = None
        self._pending_rng: Optional[dict] = None
        if isinstance(signals, str):
            signals = [signals]
        self.signals = []
        for name in signals:
            number = getattr(signal, str(name), None)
            if not isinstance(number, signal.Signals) or name in _UNCATCHABLE:
                raise ValueError(
                    f'PreemptionHook: {name!r} is not a signal a process can catch; use '
                    "names such as 'SIGTERM', 'SIGUSR1', 'SIGUSR2'.")
            self.signals.append(number)
        self._received: Optional[int] = None
        self._previous: Dict[int, Any] = {}
        self._pending: Optional[dict] = None
        self._epoch_first_iter = 0

    # ----------------------------------------------------------------- signals
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._received == signum:  # asked twice: do what was there before
            previous = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            else:
                signal.raise_signal(signum)
            return
        self._received = signum  # no logging here: a handler may interrupt the logger

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            print_log('PreemptionHook: training does not run in the main thread, where '
                      'Python delivers signals; preemption saves are off.',
                      logger='current', level=logging.WARNING)
            return
        for signum in self.signals:
            if signum not in self._previous:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def _restore(self) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    # ------------------------------------------------------------------- hooks
    def before_run(self, runner) -> None:
        """Install the signal handlers before a training run loads its checkpoint
        (ScalingRunner; mmengine's Runner: at ``before_train``). ``val()`` / ``test()``
        keep the usual signal behaviour."""
        if getattr(runner, 'train_loop_built', False):
            self._install()
            self._shield_workers(runner)

    def _shield_workers(self, runner) -> None:
        """Loader workers ignore the signals (torch's workers die on SIGTERM, and the
        main process then fails with "DataLoader worker ... is killed by signal")."""
        loader = runner.train_loop.dataloader
        if not getattr(loader, 'num_workers', 0) or not self._previous \
                or isinstance(loader.worker_init_fn, _WorkersIgnore):
            return
        loader.worker_init_fn = _WorkersIgnore(self.signals, loader.worker_init_fn,
                                               _exiting_flag())
        if isinstance(runner.train_loop, IterBasedTrainLoop):
            # its workers started with the loop, before this hook: start them again
            if hasattr(runner, 'restart_train_workers'):
                runner.restart_train_workers()
            else:
                print_log('PreemptionHook: the train loader\'s workers started before '
                          'this hook (mmengine Runner, iteration-based loop): a signal '
                          'sent to the whole process group ends them and the run; '
                          "runner_type='ScalingRunner' restarts them.",
                          logger='current', level=logging.WARNING)

    def before_train(self, runner) -> None:
        """Continue a resumed epoch where it stopped, with its random streams."""
        self._install()  # a no-op when before_run installed them
        self._shield_workers(runner)
        self._seed_samples(runner)
        self._continue_epoch(runner)
        pending, self._pending_rng = self._pending_rng, None
        if pending is not None and self._epoch_value is not None and runner.iter > 0 \
                and (pending['epoch'], pending['iter']) == (runner.epoch, runner.iter):
            # a resume (load_from starts at 0) of an epoch loop with seeded samples; an
            # iteration loop replays its batches after before_train (mmengine), so
            # states put back here would be used up by the replay
            set_rng_states(pending['states'])

    def _seed_samples(self, runner) -> None:
        """Epoch-based loops: samples seeded by (seed, epoch, index) (class docstring)."""
        loader = runner.train_loop.dataloader
        if not self.seed_samples or isinstance(runner.train_loop, IterBasedTrainLoop) \
                or not isinstance(loader, torch.utils.data.DataLoader) \
                or self._epoch_value is not None:
            return
        seed = int(runner.seed or 0)
        self._epoch_value = multiprocessing.Value('q', runner.epoch, lock=False)
        val_loop = getattr(runner, '_val_loop', None)
        for each in (loader, getattr(val_loop, 'dataloader', None)):
            # workers' base seeds off the main torch stream (iter() draws one)
            if isinstance(each, torch.utils.data.DataLoader) and each.generator is None:
                each.generator = torch.Generator().manual_seed(seed)
        if getattr(loader, 'num_workers', 0):
            loader.worker_init_fn = _WorkersSeedSamples(seed, self._epoch_value,
                                                        loader.worker_init_fn)
        else:
            dataset = loader.dataset
            dataset.__getitems__ = _SeededSamples(dataset, seed, self._epoch_value, True)

    def before_train_epoch(self, runner) -> None:
        """Remember the iteration at which this epoch began."""
        if self._epoch_value is not None:
            self._epoch_value.value = runner.epoch  # before the epoch's workers start
        self._epoch_first_iter = runner.iter - self._skipped_batches(runner)

    def after_train(self, runner) -> None:
        """Put the previous signal handlers back."""
        if self._received is not None:
            print_log(f'PreemptionHook: {signal.Signals(self._received).name} arrived '
                      'at the end of the run; it finished normally.', logger='current')
        self._restore()

    def after_run(self, runner) -> None:
        """Put the previous signal handlers back (if after_train did not)."""
        self._restore()

    def after_train_iter(self, runner, batch_idx: int, data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """At an optimizer step: stop if a signal arrived on any rank."""
        if not optimizer_stepped(runner):
            return
        signum = self._agreed_signal()
        if signum is None:
            return
        last = isinstance(runner.train_loop, IterBasedTrainLoop) \
            and runner.iter + 1 >= runner.max_iters
        if last:
            return  # the run ends with this iteration anyway (after_train logs it)
        path = self._save(runner)
        name = signal.Signals(signum).name
        position = self._position(runner, runner.epoch, runner.iter + 1)
        print_log(
            f'PreemptionHook: {name} received: saved {path} at iteration '
            f'{runner.iter + 1} (epoch {runner.epoch + 1}, {position["samples"]} samples '
            'into it); exiting with code 0. Resume with tools/train.py CONFIG --resume.',
            logger='current')
        self._restore()
        raise Preempted(0)

    def _agreed_signal(self) -> Optional[int]:
        local = self._received or 0
        if is_distributed():
            flag = torch.tensor([local], dtype=torch.int64, device=get_comm_device())
            all_reduce(flag, op='max')
            local = int(flag.item())
        if local:
            self._received = self._received or local
        return local or None

    def _save(self, runner) -> str:
        hook = next((h for h in runner.hooks if isinstance(h, CheckpointHook)), None)
        out_dir = getattr(hook, 'out_dir', None) or runner.work_dir
        filename = f'iter_{runner.iter + 1}.pth'
        path = osp.join(out_dir, filename)
        if runner.message_hub.get_info('last_ckpt') == path:
            return path  # CheckpointHook saved this very iteration already
        runner.save_checkpoint(out_dir, filename, by_epoch=False, save_optimizer=True,
                               save_param_scheduler=True,
                               backend_args=getattr(hook, 'backend_args', None))
        runner.message_hub.update_info('last_ckpt', path)
        if is_main_process():
            with open(osp.join(runner.work_dir, 'last_checkpoint'), 'w') as f:
                f.write(path)
        return path

    # ---------------------------------------------------------- sample position
    def _position(self, runner, epoch: int, next_iter: int) -> dict:
        """Samples of ``epoch`` (all ranks) trained before iteration ``next_iter``."""
        batch_size = runner.train_dataloader.batch_size or 1
        world = get_world_size()
        iter_based = isinstance(runner.train_loop, IterBasedTrainLoop)
        batches = next_iter if iter_based else next_iter - self._epoch_first_iter
        return dict(loop='iter' if iter_based else 'epoch', epoch=epoch, iter=next_iter,
                    batches=batches, batch_size=batch_size, world_size=world,
                    samples=batches * batch_size * world)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Record the sample position inside the epoch in ``checkpoint['meta']``."""
        meta = checkpoint.setdefault('meta', {})
        if not getattr(runner, 'train_loop_built', True):
            return  # ScalingRunner outside train(): no train loader built
        epoch, next_iter = meta.get('epoch', runner.epoch), meta.get('iter', runner.iter)
        if epoch == runner.epoch + 1:  # saved at the end of an epoch: the next one
            meta[POSITION_KEY] = dict(self._position(runner, epoch, next_iter),
                                      batches=0, samples=0)
        else:
            meta[POSITION_KEY] = self._position(runner, epoch, next_iter)
        meta[RNG_KEY] = dict(epoch=epoch, iter=next_iter, states=rng_states())

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep the checkpoint's sample position and random states for
        :meth:`before_train`."""
        meta = checkpoint.get('meta') or {}
        self._pending = meta.get(POSITION_KEY)
        self._pending_rng = meta.get(RNG_KEY)

    def _continue_epoch(self, runner) -> None:
        pending, self._pending = self._pending, None
        if (not pending or pending.get('loop') != 'epoch' or not pending.get('samples')
                or isinstance(runner.train_loop, IterBasedTrainLoop)
                or (pending['epoch'], pending['iter']) != (runner.epoch, runner.iter)):
            return  # nothing to skip, or loaded as weights (load_from)
        sampler = train_sampler(runner.train_dataloader)
        samples, world = pending['samples'], get_world_size()
        if not hasattr(sampler, 'skip_in_epoch'):
            print_log(
                f'PreemptionHook: the checkpoint was saved {pending["batches"]} batches '
                f'into epoch {runner.epoch + 1}, but the train sampler '
                f'({type(sampler).__name__}) cannot skip them, so this epoch runs from '
                'its first batch again. Use train_dataloader.sampler='
                "dict(type='ResumableSampler', shuffle=...) for an exact resume.",
                logger='current', level=logging.WARNING)
            return
        per_rank = math.ceil(samples / world)
        if per_rank * world != samples:
            print_log(
                f'PreemptionHook: {samples} samples of epoch {runner.epoch + 1} were '
                f'trained on {pending["world_size"]} process(es); on {world} each skips '
                f'{per_rank}, so {per_rank * world - samples} sample(s) of the epoch are '
                'left out.', logger='current', level=logging.WARNING)
        sampler.skip_in_epoch(runner.epoch, per_rank)
        print_log(
            f'PreemptionHook: resuming epoch {runner.epoch + 1} after its first '
            f'{samples} samples ({pending["batches"]} batches of the checkpoint\'s run).',
            logger='current')

    @staticmethod
    def _skipped_batches(runner) -> int:
        sampler = train_sampler(runner.train_dataloader)
        skipped = getattr(sampler, 'skipped', 0)
        batch_size = runner.train_dataloader.batch_size or 1
        return math.ceil(skipped / batch_size) if skipped else 0
