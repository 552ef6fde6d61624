"""Start-up lines once per job: on global rank 0 at their level, elsewhere at DEBUG.

The plugin's start-up lines (the hand-off, plugin keys, patch table, collective timeout,
plan hints) are printed while the config is prepared, before the process group exists:
mmengine's logger then thinks every process is rank 0 and each rank of ``dist_train.sh
N`` printed them. The rank comes from the launcher's variables instead
(:func:`mmdet3d_scaling.parallel.launcher.launch_rank`).
"""
import contextlib
import logging
import os
from typing import Iterator, Optional

from mmengine.logging import MMLogger


def startup_rank() -> int:
    """Global rank of this process: from the process group, else the launcher's
    variables (torchrun ``RANK``, Slurm ``SLURM_PROCID``, Open MPI), else 0."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    for key in ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK', 'PMI_RANK'):
        value = os.environ.get(key)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def startup_level(level: int = logging.INFO) -> int:
    """``level`` on global rank 0, DEBUG elsewhere."""
    return level if startup_rank() == 0 else min(level, logging.DEBUG)


class _DemoteInfo(logging.Filter):
    """INFO records -> DEBUG (the handlers' levels then decide), warnings untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, 'DEBUG'
        return True


@contextlib.contextmanager
def startup_lines(logger: Optional[logging.Logger] = None) -> Iterator[None]:
    """Inside: INFO lines of ``logger`` (default: mmengine's current logger) count as
    DEBUG on every rank but global rank 0; warnings and errors show everywhere."""
    if startup_rank() == 0:
        yield
        return
    logger = logger or MMLogger.get_current_instance()
    demote = _DemoteInfo()
    logger.addFilter(demote)
    try:
        yield
    finally:
        logger.removeFilter(demote)
