"""TrainingWatch: the auto batch size benchmark's check and timing after the search.

Importing this module registers ``TrainingWatch`` in mmdet3d's ``HOOKS`` (the benchmark
builds it from its config); ``import mmdet3d_scaling`` does not import it.
"""
import argparse
import time
from typing import Any, Dict, Optional

from mmengine.hooks import Hook

from mmdet3d.registry import HOOKS

from ...batch_size.auto_batch_size_hook import AutoBatchSizeHook
from ...registry import register
from ...utils import progress
from ...batch_size.memory_probe import ModeledMemoryProbe
from ..batch_size_limits import largest_by_training, largest_fitting, model_and_probe


@register(HOOKS)
class TrainingWatch(Hook):
    """After the search: the no-margin check (printed at once, so a run cut short still
    reports the search and the ratio), then peak memory and time of the training
    iterations (with a progress bar, :mod:`mmdet3d_scaling.utils.progress`).

    Built by ``tools/benchmark_auto_batch_size.py`` next to ``AutoBatchSizeHook``; the
    benchmark calls :meth:`finish` after training and reads ``check``, ``iters``,
    ``seconds`` (s) and ``peak_bytes`` (bytes). Priority ``LOWEST``: its
    ``before_train`` runs after the search (``AutoBatchSizeHook.before_run``) and every
    other hook's set-up.

    Args:
        args (dict): the benchmark's command-line options (``vars`` of its argparse
            namespace): ``probe``, ``capacity_mib``, ``mib_per_sample``,
            ``bytes_per_element``, ``steps_per_trial``, ``max_batch_size``,
            ``verify_steps`` and ``iters`` are read. No defaults.
    """

    priority = 'LOWEST'

    def __init__(self, args: dict) -> None:
        self.args = argparse.Namespace(**args)
        self.probe = None
        self.iters = 0
        self.start = self.seconds = None
        self.peak_bytes: Optional[int] = None
        self.check: Optional[Dict[str, Any]] = None
        self.bar = progress.bar(show=False)

    def before_train(self, runner) -> None:
        """After the search (``before_run``): find the largest batch that fits without
        margin, print the ratio, and start timing the training with a fresh probe."""
        search = next(h for h in runner.hooks if isinstance(h, AutoBatchSizeHook))
        if search.result is not None:
            found = search.result.batch_size
            self.check = largest_fitting(self.args, runner, found)
            bound = self.check['largest']
            if self.args.verify_steps and bound > found:
                self.check.update(largest_by_training(self.args, runner, found, bound))
            progress.echo(
                f'[auto batch size] search {search.result.seconds:.1f} s -> per-GPU '
                f'batch {found}; largest that fits without margin '
                f'{self.check["largest"]}{" (cap)" if self.check["capped"] else ""} '
                f'(2-step trials: {bound}; {self.check["seconds"]:.1f} s); '
                f'found / largest {found / self.check["largest"]:.2f}; now training '
                f'{self.args.iters} iterations')
        _, self.probe = model_and_probe(self.args, runner)
        self.probe.release()
        self.probe.reset()
        self.bar = progress.bar(total=runner.max_iters, desc='training', unit='iter')
        self.start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        """Count the iteration and move the progress bar."""
        self.iters += 1
        self.bar.update(1)

    def finish(self) -> None:
        """Close the bar; record the training's time (s) and peak memory (bytes)."""
        self.bar.close()
        if self.probe is not None and self.start is not None:
            self.seconds = time.perf_counter() - self.start
            self.peak_bytes = self.probe.peak_bytes()
            if isinstance(self.probe, ModeledMemoryProbe):
                self.probe.detach()
