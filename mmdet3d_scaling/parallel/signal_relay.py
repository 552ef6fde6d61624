"""Run torchrun so that a signal to the launch reaches every rank, and the job exits 0.

torchrun starts each rank in a session of its own (``start_new_session``), so a signal
sent to the launch's process group (Slurm, ``kill -- -PGID``, a terminal) reaches only
torchrun:

- SIGUSR1 (Slurm's ``--signal=USR1@<s>``) has no handler there: torchrun dies (exit
  138) and the ranks, now orphans, keep training and hold the work-dir lock;
- SIGTERM: torchrun passes it on, the ranks save (``PreemptionHook``) and exit 0, but
  torchrun then raises its ``SignalException`` and exits 1 (and kills a rank whose save
  takes longer than its 30 s shutdown wait).

``python -m mmdet3d_scaling.parallel.signal_relay TORCHRUN_ARGS...`` (what
``tools/dist_train.sh`` runs) starts torchrun in a session of its own and relays the
signals it gets: SIGTERM, SIGUSR1 and SIGUSR2 go straight to each rank's process group
(the rank and its loader workers; torchrun itself sees its ranks finish, so its exit
code is theirs: 0 after a preemption save), and SIGINT / SIGHUP / SIGQUIT go to torchrun,
which shuts its ranks down as usual. Before the ranks exist a signal goes to torchrun as
SIGTERM. torchrun gets SIGTERM if the relay itself dies (``PR_SET_PDEATHSIG``), so no
rank outlives the launch. The relay exits with torchrun's exit code.
"""
import ctypes
import os
import signal
import subprocess
import sys
from typing import List, Optional, Sequence

#: signals relayed to the ranks' process groups (what PreemptionHook acts on)
TO_RANKS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
#: signals relayed to torchrun (it shuts its ranks down)
TO_TORCHRUN = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_PR_SET_PDEATHSIG = 1


def rank_pids(torchrun_pid: int) -> List[int]:
    """torchrun's children that lead a session of their own: its ranks (Linux /proc)."""
    pids = []
    try:
        tasks = os.listdir(f'/proc/{torchrun_pid}/task')
    except OSError:
        return []
    for tid in tasks:
        try:
            with open(f'/proc/{torchrun_pid}/task/{tid}/children') as f:
                pids += [int(p) for p in f.read().split()]
        except OSError:
            continue
    ranks = []
    for pid in sorted(set(pids)):
        try:
            if os.getsid(pid) == pid:
                ranks.append(pid)
        except OSError:  # ended meanwhile
            continue
    return ranks


def _die_with_parent() -> None:
    """In torchrun's process before exec: SIGTERM when the relay dies."""
    os.setsid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the relay's own exit paths still end torchrun


class Relay:
    """Holds the torchrun child and passes each signal on (module docstring)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc

    def on_signal(self, signum: int, frame: object) -> None:
        if self.proc.poll() is not None:
            return
        ranks = rank_pids(self.proc.pid) if signum in TO_RANKS else []
        if not ranks:
            to_torchrun = signum if signum in TO_TORCHRUN else signal.SIGTERM
            _send(self.proc.pid, to_torchrun, group=True)
            return
        for pid in ranks:
            _send(pid, signum, group=True)


def _send(pid: int, signum: int, group: bool) -> None:
    try:
        (os.killpg if group else os.kill)(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    proc = subprocess.Popen([sys.executable, '-m', 'torch.distributed.run', *args],
                            preexec_fn=_die_with_parent)
    relay = Relay(proc)
    for signum in TO_RANKS + TO_TORCHRUN:
        signal.signal(signum, relay.on_signal)
    while True:
        try:
            return proc.wait()
        except InterruptedError:  # pragma: no cover (PEP 475 retries wait itself)
            continue


if __name__ == '__main__':
    code = main()
    sys.exit(code if code >= 0 else 128 - code)
