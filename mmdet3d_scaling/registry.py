"""Registration into mmdet3d's registries that tolerates re-imports and upstream twins.

mmdet3d's ``projects/`` modules (BEVFusion, ...) register some of the type names this
package provides. mmengine raises ``KeyError`` when a name is registered twice, so a
plain ``@MODELS.register_module()`` would crash whichever of the two is imported second.
Policy: upstream's own class keeps the name when both are present, whatever the import
order; ours steps aside with a log message. Re-importing this package (reload, a second
``custom_imports``) re-registers our own classes silently.
"""
from typing import Callable, Optional, Type

from mmengine.logging import print_log
from mmengine.registry import Registry

_OURS = 'mmdet3d_scaling'


def _is_ours(obj: object) -> bool:
    return getattr(obj, '__module__', '').split('.')[0] == _OURS


def _install_upstream_precedence(registry: Registry) -> None:
    """Let a later upstream registration replace a name that we registered first."""
    if getattr(registry, '_mmdet3d_scaling_guard', False):
        return
    original = registry._register_module

    def register(module, module_name=None, force=False):
        names = [module_name] if isinstance(module_name, str) else (
            module_name or [module.__name__])
        replaces_ours = any(_is_ours(registry._module_dict.get(n)) for n in names)
        if replaces_ours and not _is_ours(module):
            print_log(
                f'{registry.name}: upstream {module.__module__}.{module.__name__} '
                f'replaces mmdet3d_scaling\'s class of the same name.',
                logger='current')
            force = True
        return original(module=module, module_name=module_name, force=force)

    registry._register_module = register
    registry._mmdet3d_scaling_guard = True


def register(registry: Registry, name: Optional[str] = None) -> Callable[[Type], Type]:
    """Class decorator: register into ``registry`` unless upstream already owns the name.

    Args:
        registry: an mmdet3d registry, e.g. ``mmdet3d.registry.MODELS``.
        name: the type name in configs; defaults to the class name.
    """

    def decorator(cls: Type) -> Type:
        _install_upstream_precedence(registry)
        key = name or cls.__name__
        existing = registry._module_dict.get(key)
        if existing is not None and not _is_ours(existing):
            print_log(
                f'{registry.name}: keeping upstream {existing.__module__}.{key}; '
                f'mmdet3d_scaling\'s {cls.__module__}.{key} is not registered.',
                logger='current')
            return cls
        registry.register_module(name=key, module=cls, force=existing is not None)
        return cls

    return decorator
