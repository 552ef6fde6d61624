"""docs/patches.md's patch table is the one the code declares."""
from pathlib import Path

import mmdet3d_scaling  # noqa: F401  (declares every patch)
from mmdet3d_scaling.patches import patching

DOC = Path(__file__).resolve().parents[2] / 'docs' / 'patches.md'
START, END = '<!-- patch-table:start -->', '<!-- patch-table:end -->'


def test_patch_table_in_docs_matches_the_declared_patches():
    text = DOC.read_text(encoding='utf-8')
    assert text.count(START) == 1 and text.count(END) == 1, (
        f'{DOC} must hold the markers {START} and {END} once each')
    documented = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert documented == patching.markdown_table().strip(), (
        f'the patch table in {DOC} differs from the declared patches: run '
        '`python -m mmdet3d_scaling.patches --markdown` and paste its output between '
        f'{START} and {END}')
