"""The one mechanism by which the plugin changes upstream code: declared patch records.

Every change the plugin makes to mmdet, mmdet3d, mmengine, mmcv or spconv is a
:class:`Patch`: a record saying what it replaces (``targets``), for which upstream
version, of which kind, and why, with a ``changes`` function that says exactly which
attributes (or mapping items) get which new value. :func:`apply` records the values it
replaces and :func:`revert` puts them back, so a process can always say what is patched
(:func:`applied`) and undo it.

Kinds (the patch *sets*):

- ``fixes``: upstream would crash or be unsafe (checkpoint unpickling, unnamed corrupt
  files, APIs removed by newer numpy). Applied on ``import mmdet3d_scaling``.
- ``cpu``: CPU twins of CUDA-only code paths. Applied on import only where torch has no
  CUDA; on a CUDA machine they are skipped even when selected.
- ``speed``: rewrites that give upstream's results with fewer GPU -> CPU waits or faster
  kernels. Never applied on import: a config selects them with ``patches=['speed']``.

``$MMDET3D_SCALING_SKIP_PATCHES`` (comma-separated patch names) keeps named patches off
whatever selects them: the A/B switch of the benchmarks.

``Patch.upstream`` is checked, not only shown: it lists requirements such as
``'mmdet3d==1.4.0'`` (package and version range, PEP 440), and where an installed
version is outside one of them the patch is not applied and :func:`table` says why.
:func:`scoped` applies a selection for one block (a run) and reverts what it applied.
"""
import contextlib
import importlib
import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import (Any, Callable, Dict, Iterable, Iterator, List, MutableMapping,
                    Optional, Sequence, Tuple, Union)

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

KINDS = ('fixes', 'cpu', 'speed')
SKIP_ENV = 'MMDET3D_SCALING_SKIP_PATCHES'
_MISSING = object()


@dataclass(frozen=True)
class Change:
    """Set ``owner.<key>`` (or ``owner[key]`` when ``owner`` is a mapping) to ``value``."""
    owner: Any
    key: str
    value: Any


@dataclass(frozen=True)
class Patch:
    """A declared change of upstream behaviour.

    Args:
        name: short name used in configs, the skip variable and the docs table.
        kind: one of :data:`KINDS`.
        targets: dotted names of what is replaced (for the table and the snapshot test).
        upstream: the upstream versions the patch was written for, as requirements
            (``'mmdet3d==1.4.0'``, ``('mmcv==2.1.0', 'mmdet3d==1.4.0')``); checked
            against the installed versions before the patch is applied.
        why: one line: the defect or cost it removes.
        changes: returns the :class:`Change` list, built from the current values
            (called at apply time, so a patch may wrap what is bound then).
        needed: whether the patch can apply here (e.g. spconv installed); default yes.
        issue: upstream issue or pull request, if there is one.
        in_set: whether selecting the patch's set selects it; ``False``: only by its
            own name (an opt-in rewrite that is not faster everywhere).
    """
    name: str
    kind: str
    targets: Tuple[str, ...]
    upstream: Union[str, Tuple[str, ...]]
    why: str
    changes: Callable[[], List[Change]] = field(repr=False)
    needed: Callable[[], bool] = field(default=lambda: True, repr=False)
    issue: str = ''
    in_set: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f'patch {self.name}: kind {self.kind!r} is not one of {KINDS}')
        upstream = (self.upstream,) if isinstance(self.upstream, str) else tuple(
            self.upstream)
        for spec in upstream:
            _requirement(self.name, spec)  # a label is an error, at declaration
        object.__setattr__(self, 'upstream', upstream)

    @property
    def requirements(self) -> List[Requirement]:
        """``upstream`` parsed: what the installed versions are checked against."""
        return [_requirement(self.name, spec) for spec in self.upstream]


def _requirement(name: str, spec: Any) -> Requirement:
    """``spec`` as a requirement with a version range, else a ValueError saying so."""
    try:
        requirement = Requirement(spec) if isinstance(spec, str) else None
    except InvalidRequirement:
        requirement = None
    if requirement is None or not requirement.specifier:
        raise ValueError(
            f'patch {name}: upstream {spec!r} is not a package with a version range; '
            "write the versions it was written for, e.g. 'mmdet3d==1.4.0' or "
            "'mmengine>=0.10,<0.11'.")
    return requirement


def installed_version(package: str) -> Optional[str]:
    """The installed version of ``package`` (its distribution, else the importable
    module's ``__version__``: spconv ships as spconv-cu120, ...); None when absent."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        pass
    try:
        module = importlib.import_module(package.replace('-', '_'))
    except ImportError:
        return None
    return getattr(module, '__version__', None)


def version_mismatch(patch: Patch) -> Optional[str]:
    """Why ``patch`` does not fit the installed versions (None: it fits)."""
    problems = []
    for requirement in patch.requirements:
        found = installed_version(requirement.name)
        if found is None:
            problems.append(f'{requirement.name} not installed')
            continue
        try:
            fits = requirement.specifier.contains(Version(found), prereleases=True)
        except InvalidVersion:
            fits = False
        if not fits:
            problems.append(f'{requirement.name} {found} installed, written for '
                            f'{requirement.name}{requirement.specifier}')
    return '; '.join(problems) or None


PATCHES: Dict[str, Patch] = {}  # application order: by set (KINDS), then declaration
_applied: Dict[str, List[Tuple[Any, str, Any, Any]]] = {}  # name -> (owner, key, old, new)
_not_applied: Dict[str, str] = {}  # name -> why the last apply() that selected it skipped it


def declare(patch: Patch) -> Patch:
    """Add a record to :data:`PATCHES` (re-declaring the same name replaces it), kept in
    application order: fixes, cpu, speed, each in the order declared."""
    PATCHES[patch.name] = patch
    ordered = sorted(PATCHES.values(), key=lambda p: KINDS.index(p.kind))  # stable
    PATCHES.clear()
    PATCHES.update((p.name, p) for p in ordered)
    return patch


def cuda_available() -> bool:
    import torch
    return torch.cuda.is_available()


def default_selection() -> List[str]:
    """The sets ``import mmdet3d_scaling`` applies: fixes, and cpu without CUDA."""
    return ['fixes'] if cuda_available() else ['fixes', 'cpu']


def resolve(selection: Iterable[str]) -> List[str]:
    """Set names and patch names -> patch names in application order.

    Raises:
        ValueError: naming an unknown entry and listing the valid ones.
    """
    if isinstance(selection, str):
        selection = [selection]
    wanted = set()
    for entry in selection:
        if entry in KINDS:
            wanted.update(n for n, p in PATCHES.items() if p.kind == entry and p.in_set)
        elif entry in PATCHES:
            wanted.add(entry)
        else:
            raise ValueError(
                f'unknown patch or patch set {entry!r}: use one of the sets '
                f'{", ".join(KINDS)} or a patch name: {", ".join(PATCHES)}')
    return [name for name in PATCHES if name in wanted]


def skipped() -> List[str]:
    """Patch names in ``$MMDET3D_SCALING_SKIP_PATCHES``; an unknown name is an error."""
    names = [n.strip() for n in os.environ.get(SKIP_ENV, '').split(',') if n.strip()]
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(f'{SKIP_ENV}={os.environ[SKIP_ENV]!r} names unknown patch(es) '
                         f'{unknown}; known: {", ".join(PATCHES)}')
    return names


def _get(owner: Any, key: str) -> Any:
    """What revert must put back: a class's own entry (absent: inherited again)."""
    if isinstance(owner, MutableMapping):
        return owner.get(key, _MISSING)
    if isinstance(owner, type):
        return owner.__dict__.get(key, _MISSING)
    return getattr(owner, key, _MISSING)


def _current(owner: Any, key: str) -> Any:
    """What a call reaches now (a class's inherited method included)."""
    if isinstance(owner, MutableMapping):
        return owner.get(key)
    return getattr(owner, key, None)


def _set(owner: Any, key: str, value: Any) -> None:
    if isinstance(owner, MutableMapping):
        if value is _MISSING:
            owner.pop(key, None)
        else:
            owner[key] = value
    elif value is _MISSING:
        delattr(owner, key)
    else:
        setattr(owner, key, value)


def _why_not(patch: Patch, named: bool = False) -> Optional[str]:
    """Why ``patch`` does not apply here (None: it does): a ``cpu`` patch selected
    through its set where CUDA is available (named on its own, it applies: its twins
    serve CPU tensors and pass CUDA tensors through), a patch whose library or defect
    is absent (``needed()``), an installed version outside ``upstream``."""
    if patch.kind == 'cpu' and cuda_available() and not named:
        return 'cpu set: CUDA is available'
    if not patch.needed():
        return 'not needed here (its library or the upstream defect is absent)'
    return version_mismatch(patch)


def apply(selection: Iterable[str]) -> List[str]:
    """Apply the selected sets / patches not yet applied; return the names applied now.

    Skipped, with the reason kept for :func:`table`: a ``cpu`` patch selected through
    the ``cpu`` set where CUDA is available, a patch whose ``needed()`` is false (its
    library is absent, the upstream defect is not there), one whose ``upstream``
    versions are not the installed ones, and one named in
    ``$MMDET3D_SCALING_SKIP_PATCHES``.
    """
    if isinstance(selection, str):
        selection = [selection]
    selection = list(selection)
    skip = set(skipped())
    done = []
    for name in resolve(selection):
        patch = PATCHES[name]
        if name in _applied:
            continue
        why = f'in ${SKIP_ENV}' if name in skip else _why_not(patch, name in selection)
        if why is not None:
            _not_applied[name] = why
            continue
        _not_applied.pop(name, None)
        record = []
        for change in patch.changes():
            old = _get(change.owner, change.key)
            if callable(change.value) and not hasattr(change.value, 'original'):
                try:  # fallbacks and equality tests call the replaced (or inherited) one
                    change.value.original = _current(change.owner, change.key)
                except AttributeError:
                    pass
            _set(change.owner, change.key, change.value)
            record.append((change.owner, change.key, old, change.value))
        _applied[name] = record
        done.append(name)
    return done


def revert(selection: Iterable[str]) -> List[str]:
    """Undo applied patches (latest first); return the names reverted.

    Raises:
        RuntimeError: when something else has since replaced a patched value (revert
            that first), so that no later change is silently undone.
    """
    names = [n for n in resolve(selection) if n in _applied]
    for name in reversed(names):
        for owner, key, old, new in reversed(_applied[name]):
            if _get(owner, key) is not new:
                raise RuntimeError(
                    f'cannot revert patch {name}: {key} of {owner!r} was replaced after '
                    'it; revert the later patch first.')
            _set(owner, key, old)
        del _applied[name]
    return names


def applied() -> List[str]:
    """Names of the patches in effect, in application order."""
    return list(_applied)


def outside_range() -> Dict[str, str]:
    """The patches :func:`apply` skipped because an installed version is outside their
    ``upstream`` range (or a package is missing): name -> why."""
    return {name: why for name, why in not_applied().items()
            if version_mismatch(PATCHES[name]) == why}


def warn_outside_range() -> None:
    """One warning naming the patches skipped for their versions (import time: stock
    tools print no start-up table)."""
    skipped = outside_range()
    if skipped:
        import warnings
        warnings.warn('mmdet3d_scaling: patches not applied, the installed versions are '
                      'not the ones they were written for (upstream code runs unchanged): '
                      + '; '.join(f'{n}: {why}' for n, why in skipped.items()),
                      stacklevel=2)


def not_applied() -> Dict[str, str]:
    """Patch name -> why the last :func:`apply` that selected it did not apply it."""
    return {name: _not_applied[name] for name in PATCHES if name in _not_applied}


@contextlib.contextmanager
def scoped(selection: Iterable[str]) -> Iterator[List[str]]:
    """Apply ``selection`` for the block, then revert what this call applied (patches
    already in effect, e.g. the import-time sets or an enclosing scope's, stay).

    Yields:
        the names applied on entry.
    """
    done = apply(selection)
    try:
        yield done
    finally:
        revert(done)


def original(name: str, key: str) -> Any:
    """The upstream value a patch replaced at ``key`` (for fallbacks and tests)."""
    for _, k, old, _ in _applied.get(name, ()):
        if k == key:
            return old
    raise KeyError(f'patch {name} is not applied or does not change {key!r}')


def _state(name: str) -> str:
    if name in _applied:
        return 'applied'
    return f'NOT APPLIED: {_not_applied[name]}' if name in _not_applied else 'off'


def table(names: Sequence[str] = ()) -> str:
    """A text table of patches (all declared when ``names`` is empty); the state of a
    selected patch that was not applied says why (e.g. the installed version)."""
    rows = [PATCHES[n] for n in (names or PATCHES)]
    head = ('patch', 'kind', 'upstream', 'state', 'why')
    body = [(p.name, p.kind, ', '.join(p.upstream), _state(p.name), p.why) for p in rows]
    widths = [max(len(r[i]) for r in [head] + body) for i in range(4)]
    lines = ['  '.join(c.ljust(w) for c, w in zip(r[:4], widths)) + '  ' + r[4]
             for r in [head] + body]
    return '\n'.join(lines)


def resolve_owner(path: str) -> Any:
    """``'package.module:Class.attr'`` -> that object (``'package.module'``: the module)."""
    import importlib
    module, _, attrs = path.partition(':')
    obj = importlib.import_module(module)
    for attr in filter(None, attrs.split('.')):
        obj = getattr(obj, attr)
    return obj


def method_patch(name: str, kind: str, owner: str, key: str, replacement: Callable,
                 upstream: Union[str, Tuple[str, ...]], why: str,
                 issue: str = '') -> Patch:
    """A patch that replaces one method of an upstream class.

    ``replacement.original`` is the upstream method from declaration on, so patches can
    fall back to it and tests can compare with it whether or not the patch is applied.
    """
    cls = resolve_owner(owner)
    replacement.original = getattr(cls, key)
    return Patch(name=name, kind=kind, targets=(f"{owner.replace(':', '.')}.{key}",),
                 upstream=upstream, why=why, issue=issue,
                 changes=lambda: [Change(cls, key, replacement)])


def markdown_table() -> str:
    """Every declared patch as the markdown table of ``docs/patches.md``."""
    rows = ['| patch | kind | default | replaces | upstream | why | upstream issue |',
            '|---|---|---|---|---|---|---|']
    default = {'fixes': 'on import', 'cpu': 'on import without CUDA',
               'speed': "off (config: `patches=['speed']`)"}
    opt_in = "off (config: `patches=['{}']` only)"
    for p in PATCHES.values():
        targets = '<br>'.join(f'`{t}`' for t in p.targets)
        when = default[p.kind] if p.in_set else opt_in.format(p.name)
        rows.append(f'| `{p.name}` | {p.kind} | {when} | {targets} | '
                    f'{"<br>".join(f"`{u}`" for u in p.upstream)} | {p.why} | '
                    f'{p.issue or "-"} |')
    return '\n'.join(rows)
