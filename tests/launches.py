"""A launch (torchrun, dist_train.sh) as a test sees it: output as it comes, its process
tree, a node kill, and a check that nothing of it is left running.

torchrun starts each worker in a session of its own, so a launch's processes are found
by parent links (``/proc/PID/stat``), sampled while it runs.
"""
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_env(**extra) -> dict:
    """This environment without any launcher's variables; CPU ranks; ``extra``."""
    drop = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'PORT',
            'NNODES', 'NODE_RANK')
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(('SLURM_', 'OMPI_', 'PMI_', 'TORCHELASTIC'))}
    env.update(OMP_NUM_THREADS='1', PYTHONPATH=REPO, PYTHON=sys.executable,
               CUDA_VISIBLE_DEVICES='')
    env.update(extra)
    return env


def _stat(pid: int) -> Optional[List[str]]:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...)."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> Dict[int, str]:
    """``{pid: start ticks}`` of the live processes below ``root`` (and root)."""
    parents = {}
    for name in os.listdir('/proc'):
        if name.isdigit():
            fields = _stat(int(name))
            if fields is not None and fields[0] != 'Z':
                parents[int(name)] = (int(fields[1]), fields[19])
    found, frontier = {}, [root]
    while frontier:
        pid = frontier.pop()
        if pid in parents:
            found[pid] = parents[pid][1]
        frontier += [p for p, (ppid, _) in parents.items() if ppid == pid]
    return found


def alive(pid: int, ticks: str) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != 'Z' and fields[19] == ticks


class Launch:
    """``args`` started in a session of its own, output collected, tree sampled."""

    def __init__(self, args: Sequence[str], cwd, env: dict):
        self.proc = subprocess.Popen(list(args), cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: List[str] = []
        self.tree: Dict[int, str] = {}
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._sample, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def _sample(self) -> None:
        while self.proc.poll() is None:
            self.tree.update(descendants(self.proc.pid))
            time.sleep(0.5)

    @property
    def log(self) -> str:
        return ''.join(self.lines)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        """Until ``text`` is in the output (fails if the launch ends first)."""
        deadline = time.monotonic() + timeout
        while text not in self.log:
            assert self.proc.poll() is None, self.log[-4000:]
            assert time.monotonic() < deadline, f'no {text!r} in:\n{self.log[-4000:]}'
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL to the launcher and every process below it (a node dies)."""
        for pid in descendants(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def finish(self, timeout: float = 300) -> str:
        """Wait for the end; assert that no process of the launch is left (any left
        after a grace period are killed, so the test leaves nothing behind)."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            left = self._left_after(30.0)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
            for thread in self._threads:
                thread.join(timeout=10)
        assert left == [], f'processes of the launch left running: {left}'
        return self.log

    def _left_after(self, grace_s: float) -> List[int]:
        deadline = time.monotonic() + grace_s
        while True:
            left = [pid for pid, ticks in self.tree.items() if alive(pid, ticks)]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)
