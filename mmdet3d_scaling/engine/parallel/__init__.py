"""Single-process / distributed model wrapping and process-group setup."""
from .ddp_wrapper import ScalingDistributedDataParallel
from .device_setup import configure_devices
from .distributed_config import configure_distributed
from .sync_bn import convert_sync_bn, norm_layer_counts
from .unused_params import unused_parameter_names

__all__ = ['configure_devices', 'configure_distributed', 'convert_sync_bn',
           'norm_layer_counts', 'unused_parameter_names',
           'ScalingDistributedDataParallel']
