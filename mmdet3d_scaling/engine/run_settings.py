"""What a prepared config asks of the whole process, with one owner: the runner.

``config/`` steps only rewrite the config; process-wide state is set here, by
``ScalingRunner``:

- for the run only (:func:`run_settings`, around the runner's build and each of its
  ``train()`` / ``val()`` / ``test()``, restored afterwards): torch's fp32 matmul
  precision and the checkpoint files allowed to unpickle arbitrary objects, so that a
  second runner in the process (a notebook, a sweep, a test session) starts from the
  process as it was;
- once, before the process group exists (:func:`apply_run_settings`): torch's flight
  recorder for the hang doctor (environment variables NCCL reads at its start).
"""
import contextlib
from typing import Iterable, Iterator

import torch
from mmengine.config import Config
from mmengine.logging import print_log

from ..config.matmul_precision import check_matmul_precision
from ..config.preparation import trusted_checkpoint_paths
from ..patches.fixes import checkpoint
from ..utils.registry_scope import type_name
from .hang_doctor import enable_flight_recorder


@contextlib.contextmanager
def matmul_precision(cfg: Config) -> Iterator[None]:
    """``float32_matmul_precision`` (absent: no change) for the block, then torch's
    setting as it was."""
    value = check_matmul_precision(cfg)
    before = torch.get_float32_matmul_precision()
    if value is not None and before != value:
        torch.set_float32_matmul_precision(value)
        print_log(f'float32 matmul precision: {value!r} (torch.set_float32_matmul_'
                  'precision)', logger='current')
    try:
        yield
    finally:
        if torch.get_float32_matmul_precision() != before:
            torch.set_float32_matmul_precision(before)


@contextlib.contextmanager
def trusted(paths: Iterable[str]) -> Iterator[None]:
    """``paths`` trusted for full unpickling in the block; afterwards the process's list
    is what it was (``--trust-checkpoint`` paths stay)."""
    before = checkpoint.declared_trusted()
    checkpoint.trust_checkpoints(paths)
    try:
        yield
    finally:
        checkpoint.set_declared_trusted(before)


@contextlib.contextmanager
def run_settings(cfg: Config) -> Iterator[None]:
    """The run's process-wide settings for the block, restored afterwards."""
    with matmul_precision(cfg), trusted(trusted_checkpoint_paths(cfg)):
        yield


def apply_run_settings(cfg: Config) -> None:
    """Check the run settings early (bad values fail at the start) and apply the ones
    that must precede the process group."""
    check_matmul_precision(cfg)
    trusted_checkpoint_paths(cfg)
    if any(type_name(h.get('type')) == 'HangDoctorHook' for h in cfg.get('custom_hooks') or []
           if isinstance(h, dict)):
        enable_flight_recorder()  # the hang doctor reports each rank's last collectives
