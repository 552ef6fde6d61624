"""utils is the bottom layer: it imports nothing else of mmdet3d_scaling."""
import ast
from pathlib import Path

import mmdet3d_scaling.utils as utils

PACKAGE = Path(utils.__file__).parent


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or ''
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name


def test_utils_imports_no_other_part_of_the_package():
    found = []
    for path in sorted(PACKAGE.glob('*.py')):
        for level, module in _imports(path):
            if level > 1 or (level == 0 and module.split('.')[0] == 'mmdet3d_scaling'):
                found.append(f'{path.name}: {"." * level}{module}')
    assert not found, found
