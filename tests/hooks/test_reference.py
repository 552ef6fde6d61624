"""docs/hooks.md and docs/zh_cn/hooks.md list each hook's options with the defaults of
its signature, in signature order (hooks/reference.py generates the tables)."""
import inspect
from pathlib import Path

import pytest
from mmengine.hooks import Hook

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling import batch_size, hooks
from mmdet3d_scaling.hooks import reference

DOCS = Path(__file__).resolve().parents[2] / 'docs'
PAGES = {'en': DOCS / 'hooks.md', 'zh_cn': DOCS / 'zh_cn' / 'hooks.md'}


@pytest.mark.parametrize('lang', sorted(PAGES))
@pytest.mark.parametrize('hook', reference.DOCUMENTED, ids=lambda h: h.__name__)
def test_documented_options_and_defaults_are_the_signatures(hook, lang):
    page = PAGES[lang]
    documented = reference.documented_rows(page.read_text(encoding='utf-8'), hook)
    assert documented == reference.rows(hook), (
        f'{page}: the {hook.__name__} table differs from its signature; run `python -m '
        f'mmdet3d_scaling.hooks.reference {hook.__name__} --lang {lang}` and take its '
        'option and default columns')


@pytest.mark.parametrize('package', [hooks, batch_size], ids=lambda p: p.__name__)
def test_every_hook_with_options_is_documented(package):
    with_options = [cls for _, cls in inspect.getmembers(package, inspect.isclass)
                    if issubclass(cls, Hook) and cls.__module__.startswith(package.__name__)
                    and reference.rows(cls) and cls is not batch_size.BatchSizeSearchHook]
    missing = [c.__name__ for c in with_options if c not in reference.DOCUMENTED]
    assert missing == [], f'add {missing} to hooks/reference.py DOCUMENTED and the docs'


def test_a_drifted_default_fails_and_a_missing_table_is_named():
    text = PAGES['en'].read_text(encoding='utf-8')
    drifted = text.replace('| `margin` | `0.1` | share of device memory', '| `margin` | '
                           '`0.2` | share of device memory', 1)
    assert reference.documented_rows(drifted, batch_size.AutoBatchSizeHook) != \
        reference.rows(batch_size.AutoBatchSizeHook)
    with pytest.raises(ValueError, match=r'0 tables marked <!-- hook-options:'
                                         r'AutoBatchSizeHook -->.*python -m'):
        reference.documented_rows(text.replace('hook-options:AutoBatchSizeHook', 'x'),
                                  batch_size.AutoBatchSizeHook)


def test_the_generated_table_matches_its_own_check():
    for hook in reference.DOCUMENTED:
        table = reference.markdown_table(hook)
        assert reference.documented_rows(table, hook) == reference.rows(hook)
