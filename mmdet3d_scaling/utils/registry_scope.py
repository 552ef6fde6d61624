"""Registry type names without their scope: ``'mmdet3d.X'`` and ``'mmdet3d_scaling.X'``
both name ``X`` for the checks that look for one of the plugin's types in a config."""
from typing import Any


def strip_scope(name: str) -> str:
    """``'scope.Name'`` -> ``'Name'`` (a name without a scope is returned as is)."""
    return name.rsplit('.', 1)[-1]


def type_name(value: Any) -> str:
    """The plain type name of a config ``type`` value.

    Args:
        value: a registry name (scoped or not), a class, or anything else a config
            may hold there.

    Returns:
        The name without its scope for a string, ``__name__`` for a class (or
        function), else ``repr(value)`` (which matches no type name, and says what
        was found in an error message).
    """
    if isinstance(value, str):
        return strip_scope(value)
    return getattr(value, '__name__', repr(value))
