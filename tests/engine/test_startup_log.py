"""Start-up lines once per job: INFO on global rank 0, DEBUG on the other ranks."""
import logging

import pytest
from mmengine.logging import MMLogger, print_log

from mmdet3d_scaling.engine.startup_log import startup_level, startup_lines, startup_rank


@pytest.fixture
def records():
    logger = MMLogger.get_current_instance()
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((record.levelno, record.getMessage()))

    handler = Keep(level=logging.DEBUG)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield seen
    logger.setLevel(old)
    logger.removeHandler(handler)


@pytest.mark.parametrize('env, rank', [({'RANK': '3'}, 3), ({'SLURM_PROCID': '1'}, 1),
                                       ({}, 0)])
def test_startup_rank_from_the_launcher(monkeypatch, env, rank):
    for key in ('RANK', 'SLURM_PROCID', 'OMPI_COMM_WORLD_RANK', 'PMI_RANK'):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert startup_rank() == rank
    assert startup_level() == (logging.INFO if rank == 0 else logging.DEBUG)


def test_other_ranks_log_start_up_lines_at_debug(monkeypatch, records):
    monkeypatch.setenv('RANK', '1')
    with startup_lines():
        print_log('plugin keys: scaling', logger='current')
        print_log('a warning', logger='current', level=logging.WARNING)
    print_log('after start-up', logger='current')
    assert records == [(logging.DEBUG, 'plugin keys: scaling'),
                       (logging.WARNING, 'a warning'), (logging.INFO, 'after start-up')]


def test_rank_0_logs_start_up_lines_at_info(monkeypatch, records):
    monkeypatch.setenv('RANK', '0')
    with startup_lines():
        print_log('plugin keys: scaling', logger='current')
    assert records == [(logging.INFO, 'plugin keys: scaling')]
