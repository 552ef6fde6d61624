"""Test tiers (markers registered in pytest.ini, ``--strict-markers``).

Marks are explicit on the tests (``@pytest.mark.slow``, ``multiprocess``, ``cuda``), but
one case is marked here because it is exact by construction: a test parametrized with
the device ``'cuda'`` (``tests/devices.py``'s ``DEVICES`` and its kin) needs a GPU.

Under pytest-xdist (``bash tools/run_tests.sh`` runs 2 workers) each worker computes
with one intra-op thread, so that the workers do not oversubscribe the cores.
"""
import os

import pytest
import torch

from tests.devices import release_cuda_local_memory

if os.environ.get('PYTEST_XDIST_WORKER'):
    torch.set_num_threads(1)

_THREADS = torch.get_num_threads()
_CPUS = os.sched_getaffinity(0) if hasattr(os, 'sched_getaffinity') else None


@pytest.fixture(autouse=True)
def _restore_threads_and_cpus():
    """Each test starts with this process's intra-op threads and CPU set: a runner built
    in process (its CPU share, the benchmark timer) may change them, and a later test of
    the same process (an xdist worker runs many modules) would compute otherwise."""
    yield
    if torch.get_num_threads() != _THREADS:
        torch.set_num_threads(_THREADS)
    if _CPUS is not None and os.sched_getaffinity(0) != _CPUS:
        os.sched_setaffinity(0, _CPUS)


@pytest.fixture(autouse=True)
def _release_cuda_memory():
    """After a test that used the GPU, this worker gives back the local memory the
    driver kept and the allocator's cache, so that the other workers and their
    subprocesses on the same card find it (``tests.devices.release_cuda_local_memory``)."""
    yield
    if torch.cuda.is_initialized():
        release_cuda_local_memory()


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        spec = getattr(item, 'callspec', None)
        if spec is not None and 'cuda' in [v for v in spec.params.values()
                                           if isinstance(v, str)]:
            item.add_marker(pytest.mark.cuda)
