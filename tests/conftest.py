"""Test tiers (markers registered in pytest.ini, ``--strict-markers``).

Marks are explicit on the tests (``@pytest.mark.slow``, ``multiprocess``, ``cuda``), but
one case is marked here because it is exact by construction: a test parametrized with
the device ``'cuda'`` (``tests/devices.py``'s ``DEVICES`` and its kin) needs a GPU.
"""
import pytest


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        spec = getattr(item, 'callspec', None)
        if spec is not None and 'cuda' in [v for v in spec.params.values()
                                           if isinstance(v, str)]:
            item.add_marker(pytest.mark.cuda)
