"""Processes and devices: launcher detection, DDP wrapping, SyncBN, CPU affinity.

Below ``config`` (whose ``distributed`` step validates against these choices) and
``engine``; imports nothing above ``patches``.
"""
from .launcher import detect_launcher, resolve_launcher
from .ddp_wrapper import ScalingDistributedDataParallel
from .sync_bn import convert_sync_bn, norm_layer_counts
from .unused_params import unused_parameter_names

__all__ = ['detect_launcher', 'resolve_launcher', 'convert_sync_bn', 'norm_layer_counts', 'unused_parameter_names',
           'ScalingDistributedDataParallel']
