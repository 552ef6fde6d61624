"""The work-dir lock when the holder's pid now belongs to another program."""
import json
import logging
import socket
import subprocess
import sys
import time

import pytest
from mmengine.logging import MMLogger

from mmdet3d_scaling.engine.work_dir_lock import (WorkDirLock, _process_start_ticks,
                                                  why_not_running)


def _wait_for_exec(pid: int) -> None:
    """Until the child runs its program (right after fork its command line is empty)."""
    for _ in range(100):
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            if b'sleep' in f.read():
                return
        time.sleep(0.1)


@pytest.mark.slow
def test_a_reused_pid_is_reported_as_reused_and_the_lock_taken_over(tmp_path):
    # a live program holds the pid that the lock names; the lock's start ticks are
    # those of an earlier process (the crashed holder), so the pid was reused
    other = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    try:
        _wait_for_exec(other.pid)
        ticks = _process_start_ticks(other.pid)
        assert ticks is not None
        (tmp_path / '.train.lock').write_text(json.dumps(dict(
            pid=other.pid, host=socket.gethostname(), started=time.time() - 60,
            command='tools/train.py a crashed run', start_ticks=ticks - 100)))
        reason = why_not_running(other.pid, ticks - 100)
        assert reason.startswith(f'process {other.pid} that took it has ended; pid '
                                 f'{other.pid} now belongs to another program (')
        assert 'time.sleep(120)' in reason  # the program that has the pid now
        assert 'not running' not in reason
        logger, seen = MMLogger.get_current_instance(), []
        keep = logging.Handler()
        keep.emit = lambda record: seen.append(record.getMessage())
        logger.addHandler(keep)
        try:
            lock = WorkDirLock(str(tmp_path)).acquire()
        finally:
            logger.removeHandler(keep)
        try:
            assert json.loads((tmp_path / '.train.lock').read_text())['pid'] != other.pid
        finally:
            lock.release()
        log = '\n'.join(seen)
        assert f'taking over the stale lock of pid {other.pid}' in log
        assert 'now belongs to another program' in log
        assert other.poll() is None  # the other program is untouched
    finally:
        other.kill()
        other.wait()


@pytest.mark.slow
def test_the_live_holder_and_a_gone_pid_are_told_apart(tmp_path):
    me = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    try:
        assert why_not_running(me.pid, _process_start_ticks(me.pid)) is None
    finally:
        me.kill()
        me.wait()
    assert why_not_running(me.pid, None) == f'process {me.pid} is not running on this host'


def test_the_sigterm_handler_is_the_locks_only_while_a_lock_is_held(tmp_path):
    """One owner of SIGTERM at a time: the lock's handler goes in with the first lock
    and the one before it comes back with the last (here a callable, then SIG_IGN)."""
    import signal
    from mmdet3d_scaling.engine import work_dir_lock

    def before(signum, frame):
        pass

    saved = signal.signal(signal.SIGTERM, before)
    try:
        for previous in (before, signal.SIG_IGN):
            signal.signal(signal.SIGTERM, previous)
            outer = WorkDirLock(str(tmp_path / 'a')).acquire()
            inner = WorkDirLock(str(tmp_path / 'b')).acquire()
            assert signal.getsignal(signal.SIGTERM) is work_dir_lock._on_sigterm
            inner.release()
            assert signal.getsignal(signal.SIGTERM) is work_dir_lock._on_sigterm
            outer.release()
            assert signal.getsignal(signal.SIGTERM) is previous
    finally:
        signal.signal(signal.SIGTERM, saved)
