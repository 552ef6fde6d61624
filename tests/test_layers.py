"""The package's layers only look down: no module imports a module of a higher layer.

The order is the table in docs/architecture.md ("Layers"); this test reads every module's
imports (module level and inside functions, absolute and relative) and fails on an
upward edge, naming the file, the line and both layers; and no two modules import each
other (inside a layer too).
"""
import ast
from pathlib import Path
from typing import Iterator, List, Optional, Tuple

import pytest

PACKAGE = 'mmdet3d_scaling'
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
DOC = ROOT.parent / 'docs' / 'architecture.md'

#: bottom to top; a layer may import its own and lower layers only
LAYERS: List[Tuple[str, ...]] = [
    ('version', 'utils', 'registry'),
    ('ops',),
    ('datasets',),
    ('models',),
    ('patches',),
    ('parallel',),
    ('config',),
    ('engine',),
    ('batch_size',),
    ('monitoring',),
    ('hooks',),
    ('diagnostics',),
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}
#: the package's own __init__ / __main__ assemble every layer
TOP = ('__init__', '__main__')


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix('').parts
    return '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)


def _imported(path: Path, root: Path = ROOT) -> Iterator[Tuple[int, str]]:
    """(line, absolute module name) for every import of this package in ``path``."""
    module = _module_name(path, root)
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')[:len(package.split('.')) - node.level + 1]
                target = '.'.join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ''
            if target == PACKAGE:  # `from mmdet3d_scaling import x`: x is the layer
                for alias in node.names:
                    yield node.lineno, f'{PACKAGE}.{alias.name}'
            elif node.level and not node.module:  # `from .. import x`
                for alias in node.names:
                    yield node.lineno, f'{target}.{alias.name}'
            else:
                yield node.lineno, target


def _layer(module: str) -> Optional[str]:
    parts = module.split('.')
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return parts[1]


def upward_edges(root: Path = ROOT) -> List[str]:
    """Every import from a lower layer into a higher one, as readable lines."""
    edges = []
    for path in sorted(root.rglob('*.py')):
        rel = path.relative_to(root)
        if len(rel.parts) == 1 and rel.stem in TOP:
            continue
        own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if own not in RANK:
            edges.append(f'{rel}: its folder {own!r} has no layer: add it to LAYERS and '
                         'docs/architecture.md')
            continue
        for line, target in _imported(path, root):
            layer = _layer(target)
            if layer is None or layer in TOP:
                continue
            if layer not in RANK:
                edges.append(f'{rel}:{line} imports {target}, which has no layer')
            elif RANK[layer] > RANK[own]:
                edges.append(f'{rel}:{line} ({own}) imports {target} ({layer}, a higher '
                             'layer)')
    return edges


def test_no_module_imports_a_higher_layer():
    edges = upward_edges()
    assert not edges, 'upward imports:\n' + '\n'.join(edges)


def test_the_check_sees_an_upward_import(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / 'config').mkdir(parents=True)
    (pkg / 'config' / 'step.py').write_text('def f():\n    from ..engine import runner\n')
    (pkg / 'engine').mkdir()
    (pkg / 'engine' / 'runner.py').write_text('from ..config import step\n')
    edges = upward_edges(pkg)
    assert len(edges) == 1 and 'config/step.py:2' in edges[0] and 'engine' in edges[0]


@pytest.mark.parametrize('layer', [n for names in LAYERS for n in names])
def test_architecture_doc_lists_the_layer(layer):
    assert f'`{layer}' in DOC.read_text(encoding='utf-8'), (
        f'docs/architecture.md does not name the layer {layer!r}')


def mutual_imports(root: Path = ROOT) -> List[str]:
    """Pairs of modules (not packages' ``__init__``) that import each other, at module
    level or inside functions: a loop a reader has to follow back and forth."""
    edges = set()
    packages = {_module_name(p, root) for p in root.rglob('__init__.py')}
    for path in sorted(root.rglob('*.py')):
        source = _module_name(path, root)
        for _, target in _imported(path, root):
            if source not in packages and target not in packages and target != source:
                edges.add((source, target))
    return sorted(f'{a} <-> {b}' for a, b in edges if (b, a) in edges and a < b)


def test_no_two_modules_import_each_other():
    assert mutual_imports() == []
