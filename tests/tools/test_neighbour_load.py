"""benchmarks/neighbour_load.py on the CPU: the cpu load runs, stops on its time limit or
on SIGTERM with its report line, and bad arguments are clear errors (the GPU loads need
CUDA and run on the GPU machine's pv_rcnn_neighbour stage)."""
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / 'benchmarks' / 'neighbour_load.py'


@pytest.mark.slow
def test_cpu_load_stops_at_its_time_limit():
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), 'cpu', '--seconds', '1',
                           '--procs', '1'], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('[neighbour_load] cpu: ') and '1 spinners' in proc.stdout
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_sigterm_ends_the_load_with_its_report():
    proc = subprocess.Popen([sys.executable, str(SCRIPT), 'cpu', '--seconds', '300',
                             '--procs', '2'], stdout=subprocess.PIPE, text=True)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    seconds = float(out.split('cpu: ')[1].split(' s')[0])
    assert seconds < 60  # stopped by the signal, not by --seconds


@pytest.mark.slow
@pytest.mark.parametrize('args, message', [
    (['cpu', '--seconds', '0'], '--seconds must be > 0'),
    (['cpu', '--procs', '0'], '--procs >= 1'),
    (['disk'], "invalid choice: 'disk'"),
])
def test_bad_arguments_are_errors(args, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
