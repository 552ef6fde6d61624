"""One training run per work dir: a lock file that a second run is refused by.

Two runs in one work dir overwrite each other's checkpoints, logs and ``last_checkpoint``
without an error. Rank 0 of a training run holds ``WORK_DIR/.train.lock`` (JSON: pid,
host, start time, command, the process's start ticks) from the start of ``train()`` to
its end, released on return, on an exception, on Ctrl-C and on SIGTERM (its SIGTERM
handler is in place while a lock is held, then the previous one again); a heartbeat
thread refreshes the file's modification time every :data:`HEARTBEAT_S` seconds.

Another run that finds the lock:

- held by a live process on this host: refused (:class:`WorkDirLockedError` names the
  holder and what to do);
- held by a process on this host that no longer exists (killed, crashed, or its pid now
  belongs to another program: the recorded start ticks differ; the log says which): the
  lock is stale; it is taken over with a log line;
- held on another host (the liveness of a remote pid cannot be checked): refused unless
  the heartbeat is older than :data:`STALE_AFTER_S` (default 30 minutes, environment
  variable ``MMDET3D_SCALING_LOCK_STALE_S``), then taken over with a log line.

Removing the file by hand is always allowed (after checking that no run uses the dir).
Locks are re-entrant within a process (the CLI takes it before building the runner, the
runner's ``train()`` again); the file is removed when the outermost holder releases it.
"""
import atexit
import json
import os
import os.path as osp
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Dict, Optional

from mmengine.logging import print_log

LOCK_NAME = '.train.lock'
HEARTBEAT_S = 60.0
STALE_ENV = 'MMDET3D_SCALING_LOCK_STALE_S'
STALE_AFTER_S = 30 * 60.0


class WorkDirLockedError(RuntimeError):
    """Another live run holds the work dir."""


def _process_start_ticks(pid: int) -> Optional[int]:
    """Start time of ``pid`` in clock ticks since boot (Linux), to tell pid reuse apart."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            stat = f.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces: split after its ')'
        return int(stat.rsplit(')', 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def pid_alive(pid: int, start_ticks: Optional[int] = None) -> bool:
    """Whether process ``pid`` of this host exists (and, if known, is the same process)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    if start_ticks is not None:
        now = _process_start_ticks(pid)
        if now is not None and now != start_ticks:
            return False  # the pid was reused by another program
    return True


def _command_line(pid: int) -> str:
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            args = f.read().split(b'\0')
    except OSError:
        return '?'
    text = ' '.join(a.decode(errors='replace') for a in args if a)
    return text if len(text) <= 120 else text[:117] + '...'


def why_not_running(pid: int, start_ticks: Optional[int] = None) -> Optional[str]:
    """Why process ``pid`` of this host is not the holder any more; None if it is.

    A pid that exists but started at another time than the one recorded was reused by
    another program after the holder ended: that is said, with the program's command.
    """
    if pid_alive(pid, start_ticks):
        return None
    if pid_alive(pid):  # exists, but not the process that took the lock
        return (f'process {pid} that took it has ended; pid {pid} now belongs to another '
                f'program ({_command_line(pid)}, started at another time than the holder)')
    return f'process {pid} is not running on this host'


def stale_after_s() -> float:
    """Age of a heartbeat after which a lock of another host counts as abandoned."""
    value = os.environ.get(STALE_ENV)
    if value is None:
        return STALE_AFTER_S
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f'{STALE_ENV}={value!r} is not a number of seconds') from None
    if seconds <= 0:
        raise ValueError(f'{STALE_ENV}={value!r} must be a positive number of seconds')
    return seconds


def _describe(holder: Dict[str, Any]) -> str:
    started = holder.get('started')
    when = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started)) \
        if isinstance(started, (int, float)) else '?'
    return (f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started "
            f"{when}, command: {holder.get('command', '?')}")


class WorkDirLock:
    """The lock file of one work dir (see the module docstring).

    Args:
        work_dir (str): the run's work dir (created if missing).
        command (str, optional): what to record as the holder's command;
            ``sys.argv`` by default.
    """

    def __init__(self, work_dir: str, command: Optional[str] = None):
        self.work_dir = osp.abspath(work_dir)
        self.path = osp.join(self.work_dir, LOCK_NAME)
        self.command = command if command is not None else ' '.join(sys.argv)
        self._depth = 0
        self._delegate: Optional['WorkDirLock'] = None  # this process's holder object
        self._stop = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ reading
    def read(self) -> Optional[Dict[str, Any]]:
        """The holder recorded in the file, ``None`` if there is no lock file."""
        try:
            with open(self.path) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        try:
            holder = json.loads(text)
        except ValueError:
            holder = None
        if not isinstance(holder, dict):  # half written or foreign: only age can tell
            holder = dict(pid=None, host='?', command=f'unreadable lock file {text[:80]!r}')
        return holder

    def _age(self) -> float:
        try:
            return time.time() - os.stat(self.path).st_mtime
        except FileNotFoundError:
            return 0.0

    def _ours(self, holder: Dict[str, Any]) -> bool:
        return holder.get('host') == socket.gethostname() and holder.get('pid') == os.getpid()

    def why_stale(self, holder: Dict[str, Any]) -> Optional[str]:
        """Why ``holder`` no longer holds the dir, ``None`` while it does."""
        pid = holder.get('pid')
        if holder.get('host') == socket.gethostname() and isinstance(pid, int):
            return why_not_running(pid, holder.get('start_ticks'))
        age, limit = self._age(), stale_after_s()
        if age > limit:
            return (f'its heartbeat is {age / 60:.0f} min old (limit {limit / 60:.0f} min, '
                    f'{STALE_ENV})')
        return None

    # ------------------------------------------------------------------ taking
    def _record(self) -> str:
        return json.dumps(dict(pid=os.getpid(), host=socket.gethostname(),
                               started=time.time(), command=self.command,
                               start_ticks=_process_start_ticks(os.getpid())))

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, 'w') as f:
            f.write(self._record())
        return True

    def _take_over(self, holder: Dict[str, Any], reason: str) -> bool:
        """Replace a stale lock; under a guard so two takers cannot both win."""
        import fcntl
        with open(self.path + '.guard', 'a') as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            try:
                if self.read() != holder:  # someone else changed it meanwhile
                    return False
                tmp = f'{self.path}.{socket.gethostname()}.{os.getpid()}'
                with open(tmp, 'w') as f:
                    f.write(self._record())
                os.replace(tmp, self.path)
            finally:
                fcntl.flock(guard, fcntl.LOCK_UN)
        print_log(f'work dir lock {self.path}: taking over the stale lock of '
                  f'{_describe(holder)} ({reason}).', logger='current')
        return True

    def refusal(self, holder: Dict[str, Any]) -> str:
        """The message that names the holder and how to proceed."""
        remote = holder.get('host') != socket.gethostname()
        return (f'work dir {self.work_dir} is in use by another training run '
                f'({_describe(holder)}); lock file {self.path}. Two runs in one work dir '
                'overwrite each other\'s checkpoints and logs. Use another --work-dir, wait '
                'for that run to end, or stop it'
                + (f'; on another host its lock counts as abandoned after '
                   f'{stale_after_s() / 60:.0f} min without a heartbeat ({STALE_ENV})'
                   if remote else '')
                + f'. If no run uses this dir any more, delete {self.path} and start '
                'again.' + _duplicate_launch_hint())

    def acquire(self) -> 'WorkDirLock':
        """Take the lock or raise :class:`WorkDirLockedError`; re-entrant in a process."""
        if self._depth:
            self._depth += 1
            return self
        held = _HELD.get(self.path)
        if held is not None and held is not self:  # this process holds it already
            self._delegate = held.acquire()
            return self
        os.makedirs(self.work_dir, exist_ok=True)
        for _ in range(10):  # a holder may release or take over between our steps
            if self._create():
                break
            holder = self.read()
            if holder is None:
                continue
            if self._ours(holder):  # another WorkDirLock object of this process
                break
            reason = self.why_stale(holder)
            if reason is None:
                raise WorkDirLockedError(self.refusal(holder))
            if self._take_over(holder, reason):
                break
        else:
            raise WorkDirLockedError(f'could not take the lock {self.path}: it keeps '
                                     'changing (several runs starting at once?)')
        self._depth = 1
        _HELD[self.path] = self
        _install_signal_handler()
        self._start_heartbeat()
        return self

    def _start_heartbeat(self) -> None:
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(HEARTBEAT_S):
                try:
                    os.utime(self.path)
                except OSError:
                    return
        self._heartbeat = threading.Thread(target=beat, name='work-dir-lock', daemon=True)
        self._heartbeat.start()

    def release(self) -> None:
        """Give the lock back (the file goes when the outermost holder releases)."""
        if self._delegate is not None:
            delegate, self._delegate = self._delegate, None
            delegate.release()
            return
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth:
            return
        self._stop.set()
        _HELD.pop(self.path, None)
        if not _HELD:
            _restore_signal_handler()
        holder = self.read()
        if holder is not None and self._ours(holder):  # never remove another run's lock
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> 'WorkDirLock':
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _duplicate_launch_hint() -> str:
    """A second holder inside a multi-process launch is a launcher mistake, not a user's."""
    from ..parallel.launcher import found_launch
    found = found_launch()
    if found is None:
        return ''
    return (f' This process runs under {found[1]}: if the runner was built with launcher '
            f"'none', pass --launcher {found[0]} so that the processes train as one job.")


# ---------------------------------------------------------------- process exit paths
_HELD: Dict[str, WorkDirLock] = {}
_previous_sigterm: Any = None  # a callable to chain to, else None (default action)
_sigterm_before: Any = None  # exactly what was installed before ours (SIG_IGN too)


def release_all() -> None:
    """Release every lock this process holds (exit, SIGTERM)."""
    for lock in list(_HELD.values()):
        lock._depth = 1
        lock.release()


def _on_sigterm(signum: int, frame: Any) -> None:
    previous = _previous_sigterm  # read first: the last release restores the handler
    release_all()
    if callable(previous):
        previous(signum, frame)
        return
    # the default action (end the process), now that the lock file is gone
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_signal_handler() -> None:
    """SIGTERM (torchrun stopping a failed job, ``kill``, Slurm) releases the lock first.

    Ctrl-C needs no handler: KeyboardInterrupt unwinds through ``release`` in ``finally``.
    Only the main thread may set handlers; elsewhere a stale lock is taken over later.
    """
    global _previous_sigterm, _sigterm_before
    if threading.current_thread() is not threading.main_thread():
        return
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return
    _sigterm_before = current
    _previous_sigterm = current if current not in (signal.SIG_DFL, signal.SIG_IGN,
                                                   None) else None
    signal.signal(signal.SIGTERM, _on_sigterm)


def _restore_signal_handler() -> None:
    """The last lock is gone: SIGTERM goes back to the handler before the first one.

    Each owner of SIGTERM (this lock, then ``PreemptionHook`` inside training) installs
    its handler when it starts and puts the previous one back when it ends, in the
    reverse order; a handler installed after ours is not touched (its owner restores)."""
    global _previous_sigterm, _sigterm_before
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        before = _sigterm_before
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)
        _previous_sigterm = _sigterm_before = None


atexit.register(release_all)


def locked_work_dir(work_dir: str, rank: int = 0,
                    command: Optional[str] = None) -> Optional[WorkDirLock]:
    """Take the lock of ``work_dir`` on rank 0 (other ranks: ``None``)."""
    if rank != 0:
        return None
    return WorkDirLock(work_dir, command).acquire()


def run_locked(fn: Callable[[], Any], work_dir: str, rank: int,
               distributed: bool) -> Any:
    """``fn()`` with ``work_dir`` held by rank 0; in a process group every rank learns
    of a refusal (so none waits for a rank 0 that stopped).

    Args:
        fn (callable): the training.
        work_dir (str): the run's work dir.
        rank (int): global rank of this process.
        distributed (bool): whether a process group exists (the refusal is broadcast).
    """
    lock, refusal = None, None
    if rank == 0:
        try:
            lock = WorkDirLock(work_dir).acquire()
        except WorkDirLockedError as err:
            refusal = str(err)
    if distributed:
        from mmengine.dist import broadcast_object_list
        message = [refusal]
        broadcast_object_list(message, src=0)
        refusal = message[0]
    if refusal is not None:
        raise WorkDirLockedError(refusal)
    try:
        return fn()
    finally:
        if lock is not None:
            lock.release()
