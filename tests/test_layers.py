"""The package's layers only look down: no module imports a module of a higher layer.

The layers and their floors are the table in docs/architecture.md ("Package layout");
this test reads every module's imports (module level and inside functions, absolute and
relative), fails on an upward edge, naming the file, the line and both layers, and fails
when the table's floors are not the ones the imports make (a layer's floor: one above
the highest floor it imports); and no two modules import each other (inside a layer too).
"""
import ast
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

PACKAGE = 'mmdet3d_scaling'
ROOT = Path(__file__).resolve().parents[1] / PACKAGE
DOC = ROOT.parent / 'docs' / 'architecture.md'
START, END = '<!-- layers:start -->', '<!-- layers:end -->'


def documented_floors(text: str) -> Dict[str, int]:
    """Layer -> floor, from the marked table of docs/architecture.md."""
    assert text.count(START) == 1 and text.count(END) == 1, f'{DOC}: {START} / {END}'
    floors = {}
    for line in text.split(START, 1)[1].split(END, 1)[0].strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip('|').split('|')]
        for layer in re.findall(r'`(\w+)`', cells[1]):
            floors[layer] = int(cells[0])
    return floors


#: layer -> floor; a layer may import lower floors only
RANK: Dict[str, int] = documented_floors(DOC.read_text(encoding='utf-8'))
LAYERS: List[Tuple[str, ...]] = [
    tuple(n for n, f in RANK.items() if f == floor) for floor in sorted(set(RANK.values()))]
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
            elif layer != own and RANK[layer] >= RANK[own]:
                edges.append(f'{rel}:{line} ({own}, floor {RANK[own]}) imports {target} '
                             f'({layer}, floor {RANK[layer]})')
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


def layer_imports(root: Path = ROOT) -> Dict[str, Set[str]]:
    """Layer -> the other layers its modules import."""
    deps: Dict[str, Set[str]] = defaultdict(set)
    for path in sorted(root.rglob('*.py')):
        rel = path.relative_to(root)
        own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        if own in TOP:
            continue
        deps[own]  # a layer that imports nothing is floor 0
        for _, target in _imported(path, root):
            layer = _layer(target)
            if layer is not None and layer not in TOP and layer != own:
                deps[own].add(layer)
    return deps


def measured_floors(root: Path = ROOT) -> Dict[str, int]:
    """Layer -> one above the highest floor it imports (0: it imports none).

    Raises:
        AssertionError: layers that import each other (no floor exists), named.
    """
    deps, floors = layer_imports(root), {}

    def floor(layer: str, path: Tuple[str, ...] = ()) -> int:
        assert layer not in path, f'layers import each other: {" -> ".join(path + (layer,))}'
        if layer not in floors:
            below = [floor(d, path + (layer,)) for d in deps.get(layer, ())]
            floors[layer] = 1 + max(below) if below else 0
        return floors[layer]

    for layer in deps:
        floor(layer)
    return floors


def test_the_documented_floors_are_the_measured_ones():
    measured = measured_floors()
    wrong = {layer: (RANK.get(layer), floor) for layer, floor in measured.items()
             if RANK.get(layer) != floor}
    assert not wrong, (
        'docs/architecture.md layer table: (documented floor, measured floor) '
        f'{wrong}; move the rows to the measured floors')
    assert sorted(RANK) == sorted(measured), 'layers in the table but not in the package'


def test_the_floor_check_sees_a_layer_that_moved(tmp_path):
    pkg = tmp_path / PACKAGE
    for layer, source in (('ops', ''), ('utils', 'from ..ops import x\n')):
        (pkg / layer).mkdir(parents=True)
        (pkg / layer / 'm.py').write_text(source)
    assert measured_floors(pkg) == {'ops': 0, 'utils': 1}
