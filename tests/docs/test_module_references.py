"""Every ``:mod:`` reference in the package's docstrings names a module that exists
(a module that moved leaves no stale name behind, as diagnostics/__init__ once did)."""
import ast
import importlib.util
import re
from pathlib import Path

import mmdet3d_scaling

ROOT = Path(mmdet3d_scaling.__file__).resolve().parent
MOD = re.compile(r':mod:`~?([\w.]+)`')


def _package(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix('').parts
    return '.'.join(parts[:-1]) if parts[-1] == '__init__' else '.'.join(parts[:-1])


def _resolve(name: str, package: str) -> str:
    if not name.startswith('.'):
        return name
    dots = len(name) - len(name.lstrip('.'))
    base = package.split('.')[:len(package.split('.')) - dots + 1]
    return '.'.join(base + [name.lstrip('.')])


def stale_references(root: Path = ROOT) -> list:
    found = []
    for path in sorted(root.rglob('*.py')):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding='utf-8'))) or ''
        for name in MOD.findall(doc):
            target = _resolve(name, _package(path))
            if target.split('.')[0] == 'mmdet3d_scaling' and \
                    importlib.util.find_spec(target) is None:
                found.append(f'{path.relative_to(root)}: {name} ({target})')
    return found


def test_module_references_in_docstrings_exist():
    assert stale_references() == []
