"""``distributed = dict(...)`` in a config -> model wrapper, process group and seeds.

::

    distributed = dict(
        find_unused_parameters=False,  # True | False | 'auto' (probe one batch, name them)
        static_graph=False,            # DDP static_graph
        gradient_as_bucket_view=False, # True: gradients live in the all-reduce buckets
        bucket_cap_mb=25,              # DDP bucket size, MiB
        broadcast_buffers=False,       # as mmengine's default wrapper
        comm_compression=None,         # None | 'fp16' | 'bf16' gradient all-reduce
        sync_bn=None,                  # None | 'torch' | 'mmcv' | 'naive' | 'allreduce'
        sync_bn_scope=None,            # None (all layers) | ['backbone', ...] submodules
        timeout_minutes=60,            # collective timeout (env_cfg.dist_cfg.timeout)
        detect_anomalous_params=False, # mmengine's per-iteration graph check (debug)
        cpu_affinity=None,             # None (as launched) | 'split': CPUs per local rank
        hang_timeout_s=300,            # hang doctor: seconds without progress; None: off
    )

Only a config with a ``distributed`` key gets the plugin's wrapper
(``ScalingDistributedDataParallel``) and its collective timeout (60 min unless set);
without the key the config keeps mmengine's wrapper and timeout. Single-process runs
keep the bare model (mmengine reverts SyncBN there); the options are still validated so
a typo fails on a laptop, not on the cluster.

``cpu_affinity='split'`` is applied by the ScalingRunner after it is built, before the
loader workers start: each local rank of a host (``LOCAL_RANK`` of ``LOCAL_WORLD_SIZE``,
set by torchrun) keeps a disjoint share of the CPUs it was started with, whole cores and
one NUMA node where that costs no rank a CPU (``parallel/cpu_affinity.py``).

``hang_timeout_s`` (distributed runs): a ``HangDoctorHook`` watches every rank; a rank
without progress, or a peer without heartbeat, for that long stops the job with every
rank's stack and the rank(s) behind named, instead of waiting for the collective timeout
(``engine/hang_doctor.py``). It must be below the collective timeout.
"""
import os
from typing import Any, Dict

import torch
from mmengine.config import Config
from mmengine.logging import print_log

from ..parallel.cpu_affinity import MODES as CPU_AFFINITY_MODES
from ..parallel.ddp_wrapper import COMM_COMPRESSIONS
from ..parallel.sync_bn import IMPLEMENTATIONS, check_scope_format
from ..utils.registry_scope import type_name
from .validators import merge, positive_number

WRAPPER = 'ScalingDistributedDataParallel'
_WRAPPER_TYPES = (None, 'MMDistributedDataParallel', WRAPPER)
DEFAULTS: Dict[str, Any] = dict(
    find_unused_parameters=False, static_graph=False, gradient_as_bucket_view=False,
    bucket_cap_mb=25, broadcast_buffers=False, comm_compression=None, sync_bn=None,
    sync_bn_scope=None, timeout_minutes=60, detect_anomalous_params=False,
    cpu_affinity=None, hang_timeout_s=300)
HANG_DOCTOR = 'HangDoctorHook'
_WRAPPER_KEYS = ('find_unused_parameters', 'static_graph', 'gradient_as_bucket_view',
                 'bucket_cap_mb', 'broadcast_buffers', 'comm_compression', 'sync_bn',
                 'sync_bn_scope', 'detect_anomalous_params')
_BOOL_KEYS = ('static_graph', 'gradient_as_bucket_view', 'broadcast_buffers',
              'detect_anomalous_params')


def validate_options(options: Dict[str, Any]) -> None:
    """Bad keys or values in ``distributed`` -> ValueError naming them."""
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise ValueError(f'unknown key(s) in distributed: {", ".join(unknown)}; known '
                         f'keys: {", ".join(DEFAULTS)}')
    for key in _BOOL_KEYS:
        if key in options and not isinstance(options[key], bool):
            raise ValueError(f'distributed.{key} must be True or False, '
                             f'got {options[key]!r}')
    if options.get('find_unused_parameters', False) not in (True, False, 'auto'):
        raise ValueError("distributed.find_unused_parameters must be True, False or "
                         f"'auto', got {options['find_unused_parameters']!r}")
    if options.get('comm_compression') not in COMM_COMPRESSIONS:
        raise ValueError("distributed.comm_compression must be None, 'fp16' or 'bf16', "
                         f"got {options['comm_compression']!r}")
    if options.get('sync_bn') not in (None,) + IMPLEMENTATIONS:
        raise ValueError(f'distributed.sync_bn must be None or one of {IMPLEMENTATIONS}, '
                         f"got {options['sync_bn']!r}")
    if options.get('cpu_affinity') not in (None,) + CPU_AFFINITY_MODES:
        raise ValueError('distributed.cpu_affinity must be None or one of '
                         f"{CPU_AFFINITY_MODES}, got {options['cpu_affinity']!r}")
    try:
        check_scope_format(options.get('sync_bn_scope'))
    except ValueError as exc:
        raise ValueError(f'distributed.{exc}') from None
    for key in ('bucket_cap_mb', 'timeout_minutes', 'hang_timeout_s'):
        if options.get(key) is not None:
            positive_number(f'distributed.{key}', options[key])


def _configure_timeout(cfg: Config, options: Dict[str, Any]) -> None:
    dist_cfg = cfg.setdefault('env_cfg', {}).setdefault('dist_cfg', {})
    configured = dist_cfg.get('timeout')
    if 'timeout_minutes' in options and options['timeout_minutes'] is not None:
        seconds = int(options['timeout_minutes'] * 60)
        if configured is not None and configured != seconds:
            raise ValueError(
                f'conflicting timeouts: distributed.timeout_minutes='
                f"{options['timeout_minutes']} ({seconds} s) and "
                f'env_cfg.dist_cfg.timeout={configured} s. Keep one of them.')
        dist_cfg['timeout'] = seconds
    elif configured is None:
        dist_cfg['timeout'] = DEFAULTS['timeout_minutes'] * 60
        print_log(f"Collective timeout: {DEFAULTS['timeout_minutes']} min (long rank-0 "
                  'evaluations outlast the NCCL default of 10 min); set '
                  'distributed.timeout_minutes to change it.', logger='current')


def _configure_determinism(cfg: Config) -> None:
    """cuBLAS needs this workspace setting before its first call to be deterministic."""
    if (cfg.get('randomness') or {}).get('deterministic') and torch.cuda.is_available():
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')


def _check_compression_backend(cfg: Config, compression: Any) -> None:
    """torch's bf16 hook refuses any backend but NCCL >= 2.10: say so before start."""
    backend = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('backend', 'nccl')
    if compression == 'bf16' and backend != 'nccl':
        raise ValueError(
            f"distributed.comm_compression='bf16' needs the NCCL backend (CUDA, NCCL >= "
            f"2.10), but this run uses {backend!r}; use 'fp16' or None here.")


def _wrapper_cfg(cfg: Config, options: Dict[str, Any]) -> Dict[str, Any]:
    wrapper = dict(cfg.get('model_wrapper_cfg') or {})
    for key in _WRAPPER_KEYS:
        top = cfg.get(key) if key in ('find_unused_parameters', 'sync_bn') else None
        value = merge(f'{key} settings', [(f'distributed.{key}', options.get(key)),
                                          (f'model_wrapper_cfg.{key}', wrapper.get(key)),
                                          (key, top)])
        wrapper[key] = DEFAULTS[key] if value is None else value
    _check_compression_backend(cfg, wrapper['comm_compression'])
    cfg.pop('sync_bn', None)  # the wrapper converts it (mmengine's convert misses cases)
    if wrapper['find_unused_parameters'] == 'auto':
        wrapper['probe_dataloader'] = cfg.get('train_dataloader')
    else:
        wrapper.pop('probe_dataloader', None)
    wrapper['type'] = WRAPPER
    return wrapper


def _configure_hang_doctor(cfg: Config, options: Dict[str, Any]) -> None:
    """``HangDoctorHook`` in ``custom_hooks`` (unless there already), timeout checked;
    the hook gets the collective timeout as an argument (one configured by hand too).

    Without ``hang_timeout_s`` the doctor waits 300 s, or half the collective timeout
    where that is shorter; a value given that is not below it is an error.
    """
    collective = cfg.env_cfg.dist_cfg.get('timeout')
    if 'hang_timeout_s' in options:
        seconds = options['hang_timeout_s']
        if seconds is None:
            return
        if collective is not None and seconds >= collective:
            raise ValueError(
                f'distributed.hang_timeout_s={seconds} s is not below the collective '
                f'timeout ({collective} s, distributed.timeout_minutes / '
                'env_cfg.dist_cfg.timeout): the collective would fail first, without '
                'naming the rank behind. Lower it, or set it to None to turn the hang '
                'doctor off.')
    else:
        seconds = DEFAULTS['hang_timeout_s']
        if collective is not None and seconds >= collective:
            seconds = collective / 2
    hooks = list(cfg.get('custom_hooks') or [])
    by_hand = [h for h in hooks if isinstance(h, dict)
               and type_name(h.get('type')) == HANG_DOCTOR]
    for hook in by_hand:  # its own timeouts stay; the collective one is this config's
        hook['collective_timeout_s'] = collective
    if not by_hand:
        hooks.append(dict(type=HANG_DOCTOR, timeout_s=seconds,
                          collective_timeout_s=collective))
    cfg.custom_hooks = hooks  # the run turns torch's flight recorder on (run_settings)


def configure_distributed(cfg: Config) -> Config:
    """``prepare_config`` step: apply ``cfg.distributed`` (see the module docstring)."""
    options = dict(cfg.get('distributed') or {})
    validate_options(options)
    _configure_determinism(cfg)
    if cfg.get('launcher', 'none') == 'none' or cfg.get('distributed') is None:
        return cfg  # no `distributed` key: mmengine's wrapper and timeout, as configured
    _configure_timeout(cfg, options)
    _configure_hang_doctor(cfg, options)
    kind = (cfg.get('model_wrapper_cfg') or {}).get('type')
    if kind not in _WRAPPER_TYPES:
        if options:
            raise ValueError(
                f'distributed = dict(...) needs the {WRAPPER} model wrapper, but the '
                f'config sets model_wrapper_cfg.type={kind!r}; remove one of them.')
        return cfg
    cfg.model_wrapper_cfg = _wrapper_cfg(cfg, options)
    return cfg
