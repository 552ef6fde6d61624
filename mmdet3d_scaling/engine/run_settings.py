"""What a prepared config asks of the whole process, applied where the run starts.

``config/`` steps only rewrite the config; process-wide state (torch's fp32 matmul
precision, the checkpoint files allowed to unpickle arbitrary objects, torch's flight
recorder for the hang doctor) is set here, by ``ScalingRunner.from_cfg``, once per run,
before the process group exists.
"""
import torch
from mmengine.config import Config
from mmengine.logging import print_log

from ..config.matmul_precision import check_matmul_precision
from ..config.preparation import trusted_checkpoint_paths
from ..patches.fixes.checkpoint import trust_checkpoints
from ..utils.registry_scope import type_name
from .hang_doctor import enable_flight_recorder


def apply_matmul_precision(cfg: Config) -> None:
    """``float32_matmul_precision``: set torch's (absent: no change)."""
    value = check_matmul_precision(cfg)
    if value is not None and torch.get_float32_matmul_precision() != value:
        torch.set_float32_matmul_precision(value)
        print_log(f'float32 matmul precision: {value!r} (torch.set_float32_matmul_'
                  'precision)', logger='current')


def apply_run_settings(cfg: Config) -> None:
    """Apply every process-wide setting of a prepared config."""
    apply_matmul_precision(cfg)
    trust_checkpoints(trusted_checkpoint_paths(cfg))
    if any(type_name(h.get('type')) == 'HangDoctorHook' for h in cfg.get('custom_hooks') or []
           if isinstance(h, dict)):
        enable_flight_recorder()  # the hang doctor reports each rank's last collectives
