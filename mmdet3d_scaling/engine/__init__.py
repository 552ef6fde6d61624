"""Runner-side machinery: the ScalingRunner, launchers, command lines, DDP wrapping.

``runner`` (ScalingRunner) and ``cli`` are imported by the package itself after
``config``, which needs ``launcher`` from here: keep this module light.
"""
from .launcher import detect_launcher, resolve_launcher

__all__ = ['detect_launcher', 'resolve_launcher']
