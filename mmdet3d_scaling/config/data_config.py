"""The data parts of a config that the data checks share: the real datasets inside
wrappers, and the line that says how to skip the checks.

``preflight`` (paths exist) and ``data_files`` (files are usable) both walk the loaders'
datasets; the walk lives here, below both, so that neither imports the other's module
back (``preflight`` imports ``data_files``, never the reverse).
"""
from typing import Iterator, Optional, Tuple

OPT_OUT = ('To skip this check (for a run that loads no data), set `preflight = '
           'dict(check_data=False)` in the config.')


def leaf_datasets(dataset: Optional[dict], where: str) -> Iterator[Tuple[dict, str]]:
    """Yield ``(dataset cfg, its key path)`` of the real datasets inside wrappers."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('dataset'), dict):  # RepeatDataset, CBGSDataset, ...
        yield from leaf_datasets(dataset['dataset'], f'{where}.dataset')
    elif isinstance(dataset.get('datasets'), (list, tuple)):  # ConcatDataset
        for i, child in enumerate(dataset['datasets']):
            yield from leaf_datasets(child, f'{where}.datasets[{i}]')
    else:
        yield dataset, where
