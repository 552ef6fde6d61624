"""Distributed model wrapping: the DDP wrapper and the SyncBN conversions it uses."""
from .ddp_wrapper import ScalingDistributedDataParallel
from .sync_bn import convert_sync_bn, norm_layer_counts
from .unused_params import unused_parameter_names

__all__ = ['convert_sync_bn', 'norm_layer_counts', 'unused_parameter_names',
           'ScalingDistributedDataParallel']
