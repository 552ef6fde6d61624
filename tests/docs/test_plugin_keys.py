"""The plugin-key tables of docs/scaling_guide.md and its zh_cn twin list exactly
``PLUGIN_KEYS``, in order: a key added to the code without docs (or a doc row for a key
the code no longer reads) fails here."""
from pathlib import Path

import pytest

from mmdet3d_scaling.config import PLUGIN_KEYS

DOCS = Path(__file__).resolve().parents[2] / 'docs'
START, END = '<!-- plugin-keys:start -->', '<!-- plugin-keys:end -->'


def documented_keys(text: str) -> list:
    assert text.count(START) == 1 and text.count(END) == 1, f'markers {START} / {END}'
    block = text.split(START, 1)[1].split(END, 1)[0].strip().splitlines()[2:]
    return [line.strip('|').split('|')[0].strip().strip('`') for line in block]


@pytest.mark.parametrize('page', ['scaling_guide.md', 'zh_cn/scaling_guide.md'])
def test_the_key_column_is_plugin_keys(page):
    assert documented_keys((DOCS / page).read_text(encoding='utf-8')) == list(PLUGIN_KEYS)


def test_a_missing_key_fails():
    text = (DOCS / 'scaling_guide.md').read_text(encoding='utf-8')
    lines = [line for line in text.splitlines() if not line.startswith('| `preflight`')]
    assert documented_keys('\n'.join(lines)) != list(PLUGIN_KEYS)
