"""The largest batch that fits with no margin: the auto batch size benchmark's yardstick.

After the search, the benchmark (:mod:`mmdet3d_scaling.diagnostics.batch_size_benchmark`, through
:class:`~mmdet3d_scaling.diagnostics.hooks.training_watch.TrainingWatch`) finds the largest
batch that fits without the search's safety margin (:func:`largest_fitting`, an upper
bound) and confirms it by training on random batches (:func:`largest_by_training`).
``args`` is the benchmark's command line (``--probe``, ``--capacity-mib``, ...).
"""
import time
from typing import Any, Dict, Tuple

from ..batch_size.memory_probe import CudaMemoryProbe, ModeledMemoryProbe
from ..batch_size.samples import LargestSampleBatches, RandomSampleBatches
from ..batch_size.search import BatchSizeFinder
from ..utils.model import unwrap_model

MiB = 2**20


def _modeled(args, model, optim_wrapper=None) -> ModeledMemoryProbe:
    optimizers = [] if optim_wrapper is None else [optim_wrapper.optimizer]
    return ModeledMemoryProbe(model, capacity_bytes=int(args.capacity_mib * MiB),
                              bytes_per_sample=args.mib_per_sample * MiB,
                              bytes_per_element=args.bytes_per_element,
                              optimizers=optimizers)


def model_and_probe(args, runner) -> Tuple[Any, Any]:
    """The unwrapped model and a fresh memory probe of the kind ``--probe`` asks for."""
    model = unwrap_model(runner.model)
    probe = _modeled(args, model, runner.optim_wrapper) if args.probe == 'modeled' \
        else CudaMemoryProbe()
    return model, probe


def largest_fitting(args, runner, found: int) -> Dict[str, Any]:
    """The largest batch that really fits (no margin), growing from ``found``."""
    model, probe = model_and_probe(args, runner)
    loader = runner.train_dataloader
    finder = BatchSizeFinder(
        model, runner.optim_wrapper, LargestSampleBatches(loader.dataset,
                                                          loader.collate_fn),
        probe, margin=0.0, steps_per_trial=args.steps_per_trial,
        init_batch_size=min(found, args.max_batch_size),
        max_batch_size=args.max_batch_size, progress_desc='no-margin bound')
    try:
        result = finder.search()
    finally:
        if isinstance(probe, ModeledMemoryProbe):
            probe.detach()
    return dict(largest=result.batch_size, largest_2step=result.batch_size,
                seconds=result.seconds, capped=result.hit_upper_bound,
                trials=[t.__dict__ for t in result.trials])


def largest_by_training(args, runner, found: int, bound: int) -> Dict[str, Any]:
    """The largest batch in ``[found, bound]`` that trains ``--verify-steps`` steps on
    random batches without running out of memory (``found`` is taken to fit: the
    training after the search tests it)."""
    model, probe = model_and_probe(args, runner)
    loader = runner.train_dataloader
    batches = RandomSampleBatches(loader.dataset, loader.collate_fn,
                                  num_workers=loader.num_workers)
    finder = BatchSizeFinder(model, runner.optim_wrapper, batches, probe, margin=0.0,
                             steps_per_trial=args.verify_steps, max_batch_size=bound,
                             new_batch_each_step=True,
                             progress_desc='confirming by training')
    start = time.perf_counter()
    try:
        largest = finder.largest_up_to(bound, known_good=found)
    finally:
        batches.close()
        if isinstance(probe, ModeledMemoryProbe):
            probe.detach()
    return dict(largest=largest, verify_seconds=time.perf_counter() - start,
                verify_trials=[t.__dict__ for t in finder.trials])
