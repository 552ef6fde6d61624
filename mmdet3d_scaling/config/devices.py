"""Make a config's device and process-group settings fit the machine it runs on."""
import torch
from mmengine.config import Config
from mmengine.logging import print_log


def configure_devices(cfg: Config) -> None:
    """On a machine without CUDA: gloo instead of NCCL, and CPU-style DDP wrapping.

    mmengine defaults to NCCL and passes ``device_ids=[LOCAL_RANK]`` to DDP, both of
    which fail without a GPU. GPU runs are left as configured.
    """
    if torch.cuda.is_available():
        return
    env_cfg = cfg.setdefault('env_cfg', {})
    dist_cfg = env_cfg.setdefault('dist_cfg', {})
    if dist_cfg.get('backend', 'nccl') == 'nccl':
        dist_cfg['backend'] = 'gloo'
        if cfg.get('launcher', 'none') != 'none':
            print_log('No CUDA device: using the gloo backend instead of NCCL.',
                      logger='current')
    if cfg.get('launcher', 'none') != 'none':
        wrapper = cfg.get('model_wrapper_cfg') or {}
        wrapper = dict(wrapper)
        wrapper.setdefault('type', 'MMDistributedDataParallel')
        wrapper['device_ids'] = None  # CPU modules must not name devices
        cfg.model_wrapper_cfg = wrapper
