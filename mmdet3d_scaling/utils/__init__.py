"""Small helpers every layer of the package may use.

The bottom layer: modules here import only the standard library, torch and mmengine,
never another part of ``mmdet3d_scaling``, so anything can import them without a cycle
(and the scaling benchmark's worker can load them in a stock run without the plugin).

- :mod:`.cuda_local_memory`: :func:`~.cuda_local_memory.kept_bytes` and
  :func:`~.cuda_local_memory.release`, the device memory the CUDA driver keeps for
  kernels' local memory outside PyTorch.
- :mod:`.device_copy`: :func:`~.device_copy.to_device`, a host tensor to the GPU
  without waiting for its queue, and :class:`~.device_copy.HostCopy`, the other way.
- :mod:`.model`: :func:`~.model.unwrap_model`, the module inside a model wrapper.
- :mod:`.registry_scope`: :func:`~.registry_scope.strip_scope` and
  :func:`~.registry_scope.type_name`, registry type names without their scope.
"""
from .model import unwrap_model
from .registry_scope import strip_scope, type_name

__all__ = ['unwrap_model', 'strip_scope', 'type_name']
