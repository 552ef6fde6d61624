"""Progress bars of the long-running tools (mmdet3d_scaling.utils.progress).

The policy on real streams: a pseudo-terminal (``pty``) gets a bar, a pipe / file does
not, nor does a terminal under ``--no-progress`` / ``MMDET3D_SCALING_NO_PROGRESS=1`` or a
rank > 0. Then each tool as a user runs it, stderr on a pseudo-terminal and stdout on a
pipe: the bar is on stderr, and stdout is the same as with ``--no-progress`` (which draws
nothing on the terminal).
"""
import argparse
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import List, Tuple

import pytest

from mmdet3d_scaling.utils import progress
from mmdet3d_scaling.diagnostics.scaling_benchmark import tracking
from tests.auto_batch_size_common import write_dataset, write_demo_config

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / 'tools'


@pytest.fixture(autouse=True)
def _policy_reset(monkeypatch):
    monkeypatch.setattr(progress, '_disabled', False)
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    monkeypatch.delenv('RANK', raising=False)


def openpty() -> Tuple[int, int]:
    """A pseudo-terminal of 40 x 120 characters (a fresh one has 0 x 0)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack('HHHH', 40, 120, 0, 0))
    return master, slave


def _drain(fd: int) -> str:
    chunks = []
    while select.select([fd], [], [], 0.2)[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    return b''.join(chunks).decode(errors='replace')


def _bar_on(stream, **kwargs) -> None:
    with progress.bar(total=4, desc='steps', stream=stream, **kwargs) as b:
        for _ in range(4):
            b.update(1)


def test_terminal_gets_a_bar_with_eta():
    master, slave = openpty()
    with open(slave, 'w', closefd=True) as tty:
        assert progress.enabled(tty)
        _bar_on(tty)
        tty.flush()
        text = _drain(master)
    os.close(master)
    assert 'steps' in text and '4/4' in text and '100%' in text
    assert '<' in text  # tqdm's "elapsed<remaining" (the ETA)


def test_pipe_and_file_get_nothing(tmp_path):
    read, write = os.pipe()
    with open(write, 'w') as pipe:
        assert not progress.enabled(pipe)
        _bar_on(pipe)
    with open(read) as f:
        assert f.read() == ''
    with open(tmp_path / 'log', 'w') as log:
        _bar_on(log)
    assert (tmp_path / 'log').read_text() == ''


@pytest.mark.parametrize('how', ['flag', 'env', 'rank', 'show'])
def test_terminal_stays_quiet_when_asked(how, monkeypatch):
    kwargs = {}
    if how == 'flag':
        parser = argparse.ArgumentParser()
        progress.add_argument(parser)
        progress.configure(parser.parse_args(['--no-progress']))
    elif how == 'env':
        monkeypatch.setenv(progress.ENV_VAR, '1')
    elif how == 'rank':
        monkeypatch.setenv('RANK', '1')
    else:
        kwargs['show'] = False
    master, slave = openpty()
    with open(slave, 'w') as tty:
        assert progress.enabled(tty) == (how == 'show')
        _bar_on(tty, **kwargs)
        tty.flush()
        text = _drain(master)
    os.close(master)
    assert text == ''


def test_bad_environment_value_is_an_error(monkeypatch):
    monkeypatch.setenv(progress.ENV_VAR, 'yes')
    with pytest.raises(ValueError, match=r"MMDET3D_SCALING_NO_PROGRESS='yes'.*set it to 1"):
        progress.enabled()


def test_echo_prints_the_same_text(capsys):
    progress.echo('a', 1)
    assert capsys.readouterr().out == 'a 1\n'


def test_benchmark_plan_counts_every_run():
    args = argparse.Namespace(nproc=[1, 2, 4], nnodes=1, node_rank=0, comm_run=True,
                              repeats=2, profile_steps=1, independent=True,
                              ddp_one=True, compare_stock='x.py',
                              compare_stock_at='shipped')
    # (1 + 2 + 2) x 2 rounds, 3 profile, 2 independent, 1 DDP-one, 1 stock
    assert tracking.planned_runs(args) == 17
    args.compare_stock_at = 'both'  # stock at equal settings, then as shipped
    assert tracking.planned_runs(args) == 18
    args.comm_run, args.repeats, args.profile_steps = False, 1, 0
    args.independent = args.ddp_one = False
    args.compare_stock = None
    assert tracking.planned_runs(args) == 3
    args.nnodes, args.nproc, args.comm_run = 2, [1], True  # 2 processes over 2 nodes
    assert tracking.planned_runs(args) == 2


def test_progress_file_is_read_whole_or_not_at_all(tmp_path):
    path = tmp_path / 'progress.json'
    assert tracking.read_progress(str(path)) is None
    path.write_text('{"done": 3')  # never left so by the worker (rename), but be safe
    assert tracking.read_progress(str(path)) is None
    path.write_text(json.dumps(dict(done=3, total=9)))
    assert tracking.read_progress(str(path)) == (3, 9)


# ------------------------------------------------------------- the tools, as users run them
def run_on_terminal(cmd: List[str], timeout: float = 900) -> Tuple[int, str, str]:
    """Run ``cmd`` with stderr on a pseudo-terminal, stdout on a pipe: (rc, out, tty)."""
    master, slave = openpty()
    proc = subprocess.Popen(cmd, cwd=str(REPO), stdout=subprocess.PIPE, stderr=slave,
                            stdin=subprocess.DEVNULL)
    os.close(slave)
    out_chunks, tty_chunks = [], []
    fds = {proc.stdout.fileno(): out_chunks, master: tty_chunks}
    while fds:
        ready, _, _ = select.select(list(fds), [], [], timeout)
        if not ready:
            proc.kill()
            raise TimeoutError(f'{cmd} ran past {timeout} s')
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # the terminal's other end closed (Linux: EIO)
                data = b''
            if data:
                fds[fd].append(data)
            else:
                del fds[fd]
    proc.wait()
    os.close(master)
    return (proc.returncode, b''.join(out_chunks).decode(),
            b''.join(tty_chunks).decode(errors='replace'))


def _same_but_figures(a: str, b: str) -> bool:
    """Equal text once times, rates and paths of the two runs are masked."""
    def mask(text: str) -> str:
        return re.sub(r'\d+(\.\d+)?', '#', re.sub(r'/\S*/(run_a|run_b)', '<dir>', text))
    return mask(a) == mask(b)


@pytest.fixture(scope='module')
def demo_config(tmp_path_factory) -> str:
    return write_demo_config(str(tmp_path_factory.mktemp('progress_demo')))


@pytest.mark.slow
def test_count_host_reads_bar_and_unchanged_output(demo_config, tmp_path):
    def run(name: str, *extra: str) -> Tuple[str, str]:
        rc, out, tty = run_on_terminal(
            [sys.executable, str(TOOLS / 'analysis' / 'count_host_reads.py'), demo_config,
             '--steps', '2', '--warmup', '1', '--work-dir', str(tmp_path / name),
             '--out', str(tmp_path / name / 'r.json'), *extra, '--cfg-options',
             'randomness.seed=0', 'train_dataloader.batch_size=2'])
        assert rc == 0, out[-3000:] + tty[-3000:]
        return out, tty
    out_bar, tty_bar = run('run_a')
    out_quiet, tty_quiet = run('run_b', '--no-progress')
    assert 'census steps' in tty_bar and '3/3' in tty_bar
    assert 'census steps' not in tty_quiet and '3/3' not in tty_quiet
    assert 'census steps' not in out_bar  # the bar never reaches stdout
    assert _same_but_figures(out_bar, out_quiet), (out_bar, out_quiet)


@pytest.mark.slow
def test_auto_batch_size_bar_and_unchanged_output(demo_config, tmp_path):
    def run(name: str, *extra: str) -> Tuple[str, str]:
        rc, out, tty = run_on_terminal(
            [sys.executable, str(TOOLS / 'benchmark_auto_batch_size.py'), demo_config,
             '--probe', 'modeled', '--capacity-mib', '44', '--mib-per-sample', '8',
             '--iters', '2', '--verify-steps', '2', '--max-batch-size', '16',
             '--work-dir', str(tmp_path / name), '--out', str(tmp_path / name / 'r.json'),
             *extra])
        assert rc == 0, out[-3000:] + tty[-3000:]
        return out, tty
    out_bar, tty_bar = run('run_a')
    out_quiet, tty_quiet = run('run_b', '--no-progress')
    # the search's trials, its phases and batch, and the training after it
    assert 'batch size search' in tty_bar and 'bisecting' in tty_bar
    assert re.search(r'batch=\d+', tty_bar) and 'training' in tty_bar
    assert 'batch size search' not in tty_quiet and 'training' not in tty_quiet
    assert 'batch size search' not in out_bar
    assert _same_but_figures(out_bar, out_quiet), (out_bar, out_quiet)


@pytest.mark.slow
def test_benchmark_scaling_bars_and_unchanged_output(tmp_path_factory, tmp_path):
    from tests.tools.test_benchmark_scaling import CONFIG, small_config_options
    data_root = write_dataset(str(tmp_path_factory.mktemp('progress_kitti')),
                              train_frames=8)

    def run(name: str, *extra: str) -> Tuple[str, str]:
        rc, out, tty = run_on_terminal(
            [sys.executable, str(TOOLS / 'benchmark_scaling.py'), str(CONFIG),
             '--devices', 'cpu', '--nproc', '1', '--iters', '2', '--warmup', '1',
             '--out', str(tmp_path / name), *extra,
             '--cfg-options', *small_config_options(data_root)])
        assert rc == 0, out[-3000:] + tty[-3000:]
        return out, tty
    out_bar, tty_bar = run('run_a')
    out_quiet, tty_quiet = run('run_b', '--no-progress')
    # one run planned (1 process: no comm-off twin); the iterations of the run
    assert 'benchmark runs' in tty_bar and '1/1' in tty_bar
    assert 'n1 comm-on' in tty_bar and re.search(r'\d+/\d+ \[', tty_bar)
    assert 'benchmark runs' not in tty_quiet and 'n1 comm-on' not in tty_quiet
    assert 'benchmark runs' not in out_bar
    assert _same_but_figures(out_bar, out_quiet), (out_bar, out_quiet)
    # the workers left their last progress: every micro-batch of the run
    done = tracking.read_progress(str(next((tmp_path / 'run_a').glob('*_n1_comm-on'))
                                      / 'progress.json'))
    assert done is not None and done[0] == done[1]
