"""Single-process / distributed model wrapping and process-group setup."""
from .device_setup import configure_devices

__all__ = ['configure_devices']
