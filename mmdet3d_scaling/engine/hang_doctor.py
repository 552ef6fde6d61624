"""Hang doctor: a stuck or lost rank is named within minutes, not after the collective
timeout.

A data-parallel job whose rank stops (a slow or dead-locked step, a dead process, a lost
node) leaves the other ranks waiting in their next collective for the full collective
timeout (the plugin's default: 60 min), and then they fail without saying which rank they
waited for. :class:`HangDoctor` runs one watchdog thread per rank:

- the main thread only records its *progress* (phase and iteration; Python attribute
  stores, no host sync, no collective) through :meth:`HangDoctor.mark`, called by
  :class:`mmdet3d_scaling.hooks.HangDoctorHook`;
- every ``interval_s`` the watchdog publishes a record of its rank in the process
  group's store (which stays reachable while a collective hangs): phase, iteration,
  seconds without progress, the main thread's innermost Python frame, whether that frame
  waits in a collective (``torch/distributed``) or in the backward pass (DDP's gradient
  all-reduce), and the last collective from torch's flight recorder
  (``TORCH_FR_BUFFER_SIZE``; NCCL and, since torch 2.7, gloo);
- a rank fires when it made no progress for ``timeout_s`` (unless a live rank is in an
  exempt phase: rank 0 computing the validation metric while the others wait), when a
  peer's record stopped changing for ``timeout_s`` (a dead process or a lost node), or
  when the store itself is unreachable (node 0, which holds it, is gone);
- the firing rank logs the table of all ranks, names the rank(s) behind (fewest
  collectives issued, else lowest iteration, else not waiting in a collective) and its
  own Python stack, raises an alarm in the store; every other rank's watchdog sees it
  within ``interval_s``, logs its own stack and acknowledges; then every rank ends its
  loader workers, releases the work-dir lock and exits with :data:`EXIT_CODE`.

The main thread cannot be interrupted inside a C++ collective, so the process ends with
``os._exit`` from the watchdog thread, after flushing the logs.
"""
import json
import logging
import multiprocessing
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

#: exit status of a rank stopped by the hang doctor (torchrun reports it per rank)
EXIT_CODE = 75
#: store keys live under this prefix (and torchrun's restart count)
PREFIX = 'mmdet3d_scaling/hang_doctor'
#: flight-recorder entries the doctor asks torch to keep when the user set none
FR_ENTRIES = '16'
FR_ENVS = ('TORCH_FR_BUFFER_SIZE', 'TORCH_NCCL_TRACE_BUFFER_SIZE')
_WAITING = {os.path.join('torch', 'distributed', ''): 'waits in a collective',
            os.path.join('torch', 'autograd', ''): "waits in backward (DDP's gradient "
                                                   'all-reduce)'}
_STORE_FAILURES_TO_FIRE = 2


def _release_shielded_workers() -> None:
    """Train loader workers shielded by PreemptionHook ignore SIGTERM while the main
    process lives: tell them it ends, so that ``terminate()`` ends them."""
    module = sys.modules.get('mmdet3d_scaling.hooks.preemption_hook')
    if module is not None:
        module.release_workers()


def enable_flight_recorder() -> None:
    """Ask torch to record the last collectives (before the process group is created)."""
    if not any(os.environ.get(key) for key in FR_ENVS):
        os.environ[FR_ENVS[0]] = FR_ENTRIES


def last_collective() -> Optional[Dict[str, Any]]:
    """This process's last collective from torch's flight recorder; None without one.

    ``seq`` counts the collectives issued on the default process group: a rank with a
    lower count than the others has not reached the collective they wait in.
    """
    try:
        from torch._C import _distributed_c10d as c10d
        dump = getattr(c10d, '_dump_fr_trace', None) or getattr(c10d, '_dump_nccl_trace')
        entries = pickle.loads(dump(True, False, False)).get('entries') or []
    except Exception:  # no flight recorder in this torch / backend
        return None
    if not entries:
        return None
    last = entries[-1]
    default = [e.get('collective_seq_id', 0) for e in entries
               if tuple(e.get('process_group') or ())[-1:] == ('default_pg',)]
    return dict(op=last.get('profiling_name'), seq=max(default) if default else None,
                group=(last.get('process_group') or ('?',))[-1],
                sizes=last.get('input_sizes'), state=last.get('state'))


def describe_collective(collective: Optional[Dict[str, Any]]) -> str:
    if not collective:
        return 'no flight-recorder entry'
    return (f"#{collective.get('seq')} {collective.get('op')} on {collective.get('group')}"
            f" (inputs {collective.get('sizes')})")


def main_thread_where() -> Tuple[str, bool, str]:
    """``(innermost frame, waits for peers?, how)`` of the main thread."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return '?', False, 'not running'
    where = f'{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}'
    for part, how in _WAITING.items():
        if part in frame.f_code.co_filename:
            return where, True, how
    return where, False, 'busy'


def main_thread_stack() -> str:
    frame = sys._current_frames().get(threading.main_thread().ident)
    return ''.join(traceback.format_stack(frame)) if frame is not None else '  (ended)\n'


def ranks_behind(records: Dict[int, Dict[str, Any]]) -> Tuple[List[int], str]:
    """The ranks the others wait for, and the evidence."""
    seqs = {r: (rec.get('collective') or {}).get('seq') for r, rec in records.items()}
    if seqs and None not in seqs.values() and len(set(seqs.values())) > 1:
        low, high = min(seqs.values()), max(seqs.values())
        return (sorted(r for r, s in seqs.items() if s == low),
                f'fewest collectives issued: #{low}, the others up to #{high}')
    iters = {r: rec.get('iteration', 0) for r, rec in records.items()}
    if len(set(iters.values())) > 1:
        low = min(iters.values())
        return sorted(r for r, i in iters.items() if i == low), f'lowest iteration ({low})'
    busy = sorted(r for r, rec in records.items() if not rec.get('waiting'))
    if busy and len(busy) < len(records):
        return busy, 'not waiting in a collective while the others are'
    return [], ('no rank is behind by these measures: every rank waits in a collective '
                '(ranks calling different collectives?) or every rank is busy')


class HangDoctor:
    """The watchdog of one rank (see the module docstring).

    Args:
        timeout_s (float): seconds without progress (or without a peer's heartbeat)
            after which the job stops.
        interval_s (float): seconds between two publications of this rank's record
            and two looks at the others'.
        rank (int): global rank of this process.
        world_size (int): number of ranks.
        store: the process group's store (``torch.distributed.Store``).
        logger (logging.Logger): where the reports go (at ERROR level: every rank's
            console shows them).
        collective_timeout_s (float, optional): the collective timeout, for the report.
        exit_fn (callable): ends the process; ``os._exit`` by default.
    """

    def __init__(self, timeout_s: float, interval_s: float, rank: int, world_size: int,
                 store: Any, logger: logging.Logger,
                 collective_timeout_s: Optional[float] = None,
                 exit_fn: Callable[[int], Any] = os._exit):
        self.timeout_s, self.interval_s = float(timeout_s), float(interval_s)
        self.rank, self.world_size, self.store, self.logger = rank, world_size, store, logger
        self.collective_timeout_s = collective_timeout_s
        self._exit_fn = exit_fn
        self._prefix = f"{PREFIX}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self.phase, self.iteration, self.exempt = 'starting', 0, False
        self._progress = 0
        self._beat = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._peers: Dict[int, Tuple[Any, float]] = {}  # rank -> (beat, when it changed)
        self._store_failures = 0

    # ------------------------------------------------------------ main thread
    def mark(self, phase: str, iteration: int, exempt: bool = False) -> None:
        """Record progress: ``phase`` began (cheap: no I/O, no sync)."""
        self.phase, self.iteration, self.exempt = phase, iteration, exempt
        self._progress += 1

    def start(self) -> None:
        """Start the watchdog thread (idempotent)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name='hang-doctor', daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the watchdog thread and wait for it."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval_s + 30)
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ------------------------------------------------------------ store records
    def _key(self, *parts: Any) -> str:
        return '/'.join((self._prefix,) + tuple(str(p) for p in parts))

    def _record(self, idle_s: float) -> Dict[str, Any]:
        where, waiting, how = main_thread_where()
        self._beat += 1
        return dict(rank=self.rank, host=socket.gethostname(), pid=os.getpid(),
                    beat=self._beat, phase=self.phase, iteration=self.iteration,
                    exempt=self.exempt, idle_s=round(idle_s, 1), where=where,
                    waiting=waiting, how=how, collective=last_collective())

    def _get(self, key: str) -> Optional[str]:
        if not self.store.check([key]):
            return None
        return self.store.get(key).decode()

    def read_records(self) -> Dict[int, Dict[str, Any]]:
        """Every rank's last published record (ranks that never published: absent)."""
        records = {}
        for rank in range(self.world_size):
            text = self._get(self._key('rank', rank))
            if text is not None:
                records[rank] = json.loads(text)
        return records

    def _lost_peers(self, records: Dict[int, Dict[str, Any]], now: float) -> List[int]:
        """Peers whose record did not change for ``timeout_s`` (or never came)."""
        lost = []
        for rank in range(self.world_size):
            if rank == self.rank:
                continue
            beat = records.get(rank, {}).get('beat')
            seen, since = self._peers.get(rank, (None, now))
            if beat != seen or rank not in self._peers:
                self._peers[rank] = (beat, now if beat != seen else since)
            elif now - since > self.timeout_s:
                lost.append(rank)
        return lost

    # ------------------------------------------------------------ watchdog
    def _run(self) -> None:
        seen_progress, since = self._progress, time.monotonic()
        while True:
            now = time.monotonic()
            if self._progress != seen_progress:
                seen_progress, since = self._progress, now
            try:
                self.store.set(self._key('rank', self.rank),
                               json.dumps(self._record(now - since)))
                alarm = self._get(self._key('alarm'))
                records = self.read_records()
                self._store_failures = 0
            except Exception as exc:  # the store's host (node 0) is gone
                self._store_failures += 1
                if self._store_failures >= _STORE_FAILURES_TO_FIRE \
                        and not self._stop.is_set():
                    self._fire(f'the job\'s store is unreachable ({exc}): node 0, which '
                               'holds it, or its torchrun agent is gone', {}, [])
                alarm, records = None, None
            if records is not None and not self._stop.is_set():
                since = self._check(alarm, records, now, since)
            if self._stop.wait(self.interval_s):
                return

    def _check(self, alarm: Optional[str], records: Dict[int, Dict[str, Any]],
               now: float, since: float) -> float:
        """Fire or answer if due; returns when this rank's idle time counts from."""
        if alarm is not None and json.loads(alarm).get('rank') != self.rank:
            self._answer(json.loads(alarm))
        lost = self._lost_peers(records, now)
        if lost:
            self._fire(f'rank(s) {_ranks(lost)} sent no heartbeat for more than '
                       f'{self.timeout_s:.0f} s: process dead or frozen, or node lost',
                       records, lost)
        if self.exempt or any(rec.get('exempt') for rec in records.values()):
            return now  # waiting for rank 0's metric is no hang; count from its end
        if now - since > self.timeout_s:
            self._fire(f'no progress on rank {self.rank} for {now - since:.0f} s '
                       f"in phase '{self.phase}'", records, [])
        return since

    # ------------------------------------------------------------ reports and exit
    def report(self, reason: str, records: Dict[int, Dict[str, Any]],
               lost: List[int]) -> str:
        """The diagnosis: reason, rank(s) behind, every rank's record, this stack."""
        behind, why = (lost, 'no heartbeat') if lost else ranks_behind(records)
        limit = (f'distributed.hang_timeout_s={self.timeout_s:g}')
        timeout = (f', long before the collective timeout '
                   f'({self.collective_timeout_s / 60:g} min)'
                   if self.collective_timeout_s else '')
        lines = [f'hang doctor (rank {self.rank}): {reason} (limit {limit}); the job '
                 f'stops{timeout}.']
        if behind:
            named = '; '.join(_describe(r, records.get(r)) for r in behind)
            lines.append(f'rank(s) behind: {_ranks(behind)} ({why}): {named}')
        else:
            lines.append(f'rank(s) behind: none identified ({why})')
        lines.append('ranks:')
        lines += [f'  {_describe(r, records.get(r))}' for r in range(self.world_size)]
        lines.append(f'last collective of rank {self.rank}: '
                     f'{describe_collective(last_collective())}')
        lines.append(f'Python stack of rank {self.rank} (main thread):\n'
                     + main_thread_stack().rstrip())
        return '\n'.join(lines)

    def _fire(self, reason: str, records: Dict[int, Dict[str, Any]],
              lost: List[int]) -> None:
        self.logger.error(self.report(reason, records, lost))
        alarm = json.dumps(dict(rank=self.rank, reason=reason))
        try:
            if self._get(self._key('alarm')) is None:
                self.store.set(self._key('alarm'), alarm)
            self._await_answers(records, lost)
        except Exception:
            pass  # no store: nobody to tell
        self._end(f'hang doctor: rank {self.rank}: {reason}')

    def _await_answers(self, records: Dict[int, Dict[str, Any]], lost: List[int]) -> None:
        """Give the other ranks' watchdogs time to log their stacks before we exit
        (torchrun then stops the ranks of this node)."""
        waiting = [r for r in range(self.world_size) if r != self.rank and r not in lost]
        deadline = time.monotonic() + 2 * self.interval_s + 2
        while waiting and time.monotonic() < deadline:
            waiting = [r for r in waiting if not self.store.check([self._key('ack', r)])]
            time.sleep(0.2)

    def _answer(self, alarm: Dict[str, Any]) -> None:
        reason = f"rank {alarm.get('rank')} reported: {alarm.get('reason')}"
        where, _, how = main_thread_where()
        self.logger.error(
            f'hang doctor (rank {self.rank}): the job stops; {reason}.\n'
            f"this rank: phase '{self.phase}', iteration {self.iteration}, {how} at "
            f'{where}; last collective {describe_collective(last_collective())}\n'
            f'Python stack of rank {self.rank} (main thread):\n'
            + main_thread_stack().rstrip())
        try:
            self.store.set(self._key('ack', self.rank), '1')
        except Exception:
            pass
        self._end(f'hang doctor: rank {self.rank} stopped: {reason}')

    def _end(self, message: str) -> None:
        """Loader workers ended, work-dir lock released, logs flushed; then exit."""
        from .work_dir_lock import release_all
        _release_shielded_workers()
        children = multiprocessing.active_children()
        for child in children:
            child.terminate()
        for child in children:  # a worker that outlives the exit would hold its memory
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
        release_all()
        print(f'{message}. Exit code {EXIT_CODE} (see the report above in the log).',
              file=sys.stderr, flush=True)
        for handler in self.logger.handlers:
            handler.flush()
        sys.stdout.flush()
        self._exit_fn(EXIT_CODE)

    # ------------------------------------------------------------ a failed main thread
    def explain(self, exc: BaseException) -> Optional[str]:
        """After the main thread failed in a collective: which peers are gone?

        A dead peer makes gloo fail at once ("Connection closed by peer"); this waits up
        to two intervals for the peers' records and names the ones that stopped, or says
        that the store is gone.
        """
        self.stop()
        try:
            first = self.read_records()
            time.sleep(2 * self.interval_s + 1)
            second = self.read_records()
        except Exception as err:
            return (f'hang doctor (rank {self.rank}): the job\'s store is unreachable '
                    f'({err}): node 0, which holds it, or its torchrun agent is gone.')
        gone = [r for r in range(self.world_size) if r != self.rank
                and (r not in second or first.get(r, {}).get('beat')
                     == second[r].get('beat'))]
        if not gone:
            return None
        return (f'hang doctor (rank {self.rank}): rank(s) {_ranks(gone)} stopped sending '
                f'heartbeats (process dead or node lost); last heard: '
                + '; '.join(_describe(r, second.get(r) or first.get(r)) for r in gone))


_COLLECTIVE_FAILURE = ('gloo', 'nccl', 'connection', 'peer', 'timed out', 'store')


def explain_failure(runner: Any, exc: BaseException) -> None:
    """The main thread of ``runner`` failed: stop the watchdog; if a collective failed,
    add the doctor's view of the peers to ``exc`` (a note in its traceback) and log it.
    """
    import torch.distributed as dist
    for hook in getattr(runner, 'hooks', []):
        doctor = getattr(hook, 'doctor', None)
        if not isinstance(doctor, HangDoctor):
            continue
        hook.doctor = None
        collective = isinstance(exc, getattr(dist, 'DistError', ())) or any(
            word in str(exc).lower() for word in _COLLECTIVE_FAILURE)
        if not collective:
            doctor.stop()
            continue
        try:
            note = doctor.explain(exc)
        except Exception:  # never hide the original error
            note = None
        if note:
            runner.logger.error(note)
            if hasattr(exc, 'add_note'):  # Python >= 3.11
                exc.add_note(note)


def _ranks(ranks: List[int]) -> str:
    return ', '.join(str(r) for r in ranks)


def _describe(rank: int, record: Optional[Dict[str, Any]]) -> str:
    if record is None:
        return f'rank {rank}: never reported'
    return (f"rank {rank} (host {record.get('host')}, pid {record.get('pid')}): "
            f"phase '{record.get('phase')}', iteration {record.get('iteration')}, "
            f"{record.get('idle_s')} s without progress, {record.get('how')} at "
            f"{record.get('where')}, last collective "
            f"{describe_collective(record.get('collective'))}")
