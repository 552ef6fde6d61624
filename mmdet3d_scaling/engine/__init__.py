"""Runner-side machinery: config preparation, launchers, parallel wrappers."""
from .config_preparation import prepare_config
from .launcher import detect_launcher, resolve_launcher

__all__ = ['prepare_config', 'detect_launcher', 'resolve_launcher']
