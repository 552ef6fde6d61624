"""Registration of the plugin's classes into mmdet3d's registries.

Every class is registered twice, with mmengine's public registry API only:

- in a child registry of scope ``mmdet3d_scaling`` (mmengine's scope mechanism), so
  ``type='mmdet3d_scaling.BEVFusion'`` always means this package's class;
- under its plain name in mmdet3d's registry, when the name is free, so configs written
  for mmdet3d (``type='BEVFusion'``) use it too.

mmdet3d's ``projects/`` (BEVFusion, ...) register some of the same names. If such a
project was imported first, it keeps the plain name and ours stays reachable by its
scoped name; :func:`check_replaced_types` then turns a config that passes our-only
options to upstream's class into an error that says so (instead of a ``TypeError`` deep
inside a constructor). If the project is imported after this package, mmengine refuses
the duplicate name with a ``KeyError`` naming both modules: import the project first.
"""
import inspect
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple, Type

from mmengine.logging import print_log
from mmengine.registry import Registry

SCOPE = 'mmdet3d_scaling'
_OURS: Dict[int, Tuple[Registry, Dict[str, Type]]] = {}  # id(registry) -> (it, names)


def _is_ours(obj: object) -> bool:
    return getattr(obj, '__module__', '').split('.')[0] == SCOPE


def scoped(parent: Registry) -> Registry:
    """The ``mmdet3d_scaling`` child of ``parent`` (created on first use)."""
    child = parent.children.get(SCOPE)
    if child is None:
        child = Registry(parent.name, parent=parent, scope=SCOPE)
    return child


def register(registry: Registry, name: Optional[str] = None) -> Callable[[Type], Type]:
    """Class decorator: register into ``registry`` (plain name if free) and its scope.

    Args:
        registry: an mmdet3d registry, e.g. ``mmdet3d.registry.MODELS``.
        name: the type name in configs; defaults to the class name.
    """

    def decorator(cls: Type) -> Type:
        key = name or cls.__name__
        scoped(registry).register_module(name=key, module=cls, force=True)
        _OURS.setdefault(id(registry), (registry, {}))[1][key] = cls
        existing = registry.module_dict.get(key)
        if existing is None or _is_ours(existing):  # free, or our own re-import
            registry.register_module(name=key, module=cls, force=existing is not None)
        else:
            print_log(f'{registry.name}: {key!r} is {existing.__module__}.{key} '
                      f"(registered first); mmdet3d_scaling's class is "
                      f"type='{SCOPE}.{key}'.", logger='current')
        return cls

    return decorator


def our_type_names() -> Set[str]:
    """Every type name this package registers (in any registry)."""
    return {key for _, names in _OURS.values() for key in names}


def _type_dicts(node: Any, where: str) -> Iterator[Tuple[str, dict]]:
    if isinstance(node, dict):
        if isinstance(node.get('type'), str):
            yield where, node
        for key, value in node.items():
            yield from _type_dicts(value, f'{where}.{key}' if where else str(key))
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            yield from _type_dicts(value, f'{where}[{i}]')


def _rejected_options(cls: Type, options: dict) -> List[str]:
    """Options that ``cls(**options)`` would refuse (none if it takes ``**kwargs``)."""
    params = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    names = {p.name for p in params}
    return sorted(k for k in options if k not in names and k not in ('type', '_scope_'))


def check_replaced_types(cfg: dict) -> None:
    """Fail clearly when a config gives our-only options to a class upstream replaced.

    Raises:
        TypeError: naming the config path, the upstream class, the options it does not
            take and the scoped type name that selects this package's class.
    """
    problems = []
    for where, node in _type_dicts(cfg, ''):
        name = node['type']
        for registry, names in _OURS.values():
            if name not in names:
                continue
            upstream = registry.module_dict.get(name)
            if upstream is None or _is_ours(upstream):
                continue
            rejected = _rejected_options(upstream, node)
            if rejected:
                problems.append(
                    f"{where}: type '{name}' is {upstream.__module__}.{name}, registered "
                    f"before mmdet3d_scaling, and it takes no {', '.join(rejected)} "
                    f"(options of mmdet3d_scaling's class). Use type='{SCOPE}.{name}', "
                    'or leave that project out of custom_imports.')
    if problems:
        raise TypeError('config types replaced by an upstream project:\n  - '
                        + '\n  - '.join(problems))
