"""ResumableSampler: mmengine's DefaultSampler that can resume inside an epoch.

mmengine's ``EpochBasedTrainLoop`` resumed from a checkpoint saved in the middle of an
epoch runs that epoch again from its first batch: the samples already trained on are
seen twice and the run gets longer than planned. This sampler yields exactly the
indices of ``DefaultSampler`` (same shuffle by ``seed + epoch``, same padding and
per-rank shard) and can leave out the first ``k`` indices of one epoch's shard, which
:class:`mmdet3d_scaling.hooks.PreemptionHook` sets from the position stored in the
checkpoint.
"""
from typing import Iterator, Optional, Sized

from mmengine.dataset import DefaultSampler

from mmdet3d.registry import DATA_SAMPLERS

from ..registry import register


@register(DATA_SAMPLERS)
class ResumableSampler(DefaultSampler):
    """``DefaultSampler`` whose epoch can start after its first ``k`` samples.

    Without a skip it is ``DefaultSampler`` index for index. Shards are interleaved
    (rank ``r`` takes positions ``r, r + W, ...`` of the epoch's order), so skipping the
    first ``k`` indices of every rank's shard skips the first ``k * W`` positions of the
    epoch, whatever the rank.

    Args:
        dataset (Sized): the dataset.
        shuffle (bool): shuffle by ``seed + epoch``. Defaults to True.
        seed (int, optional): shuffle seed, the same on every rank; None: a random one
            shared by the ranks. Defaults to None.
        round_up (bool): pad the epoch to a multiple of the world size. Defaults to
            True.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: Optional[int] = None,
                 round_up: bool = True) -> None:
        super().__init__(dataset, shuffle=shuffle, seed=seed, round_up=round_up)
        self._skip_epoch: Optional[int] = None
        self._skip = 0

    def skip_in_epoch(self, epoch: int, samples: int) -> None:
        """Leave out the first ``samples`` indices of this rank's shard in ``epoch``.

        Sets the sampler's epoch to ``epoch`` too (so that ``len()`` is right before
        the loop's ``set_epoch``); any other epoch is complete.

        Args:
            epoch (int): the epoch (0-based, as ``runner.epoch``).
            samples (int): indices of this rank's shard to leave out (>= 0).
        """
        if samples < 0:
            raise ValueError(f'ResumableSampler: samples to skip must be >= 0, got '
                             f'{samples}.')
        self.set_epoch(epoch)
        self._skip_epoch, self._skip = epoch, min(samples, self.num_samples)

    @property
    def skipped(self) -> int:
        """Indices of this rank's shard left out in the current epoch."""
        return self._skip if self.epoch == self._skip_epoch else 0

    def __iter__(self) -> Iterator[int]:
        indices = super().__iter__()
        for _ in range(self.skipped):
            next(indices)
        return indices

    def __len__(self) -> int:
        return self.num_samples - self.skipped
