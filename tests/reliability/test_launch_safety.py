"""No silent duplicate or hung launches: real processes, real torchrun, real files.

- torchrun without ``--launcher``: stops with the environment and the flag, no checkpoint;
- ``--launcher pytorch`` without torchrun: a named error, in seconds;
- ``--launcher auto`` inside an sbatch batch step (no srun step): one process, no wait;
- two ``tools/dist_train.sh`` at once: both train (torchrun's own rendezvous port);
- bad ``dist_train.sh`` / ``dist_test.sh`` / ``slurm_train.sh`` arguments: named errors;
- one run per work dir: a live holder refuses, a stale lock is taken over, SIGTERM and
  Ctrl-C release it, a lock on another host counts until its heartbeat is old;
- an http(s) checkpoint on two "nodes" without a shared cache: each node downloads.

The training runs use the toy regressor (tests/toy.py) through ScalingRunner: seconds a
run, most of it the import of the stack.
"""
import functools
import http.server
import json
import os
import os.path as osp
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TRAIN = osp.join(REPO, 'tools', 'train.py')
DIST_TRAIN = osp.join(REPO, 'tools', 'dist_train.sh')

TOY_CONFIG = '''
custom_imports = dict(imports=['mmdet3d_scaling', 'tests.toy'], allow_failed_imports=False)
runner_type = 'ScalingRunner'
model = dict(type='ToyRegressor')
train_dataloader = dict(
    dataset=dict(type='ToyDataset', length=16), batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
train_cfg = dict(by_epoch=False, max_iters=2)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
log_level = 'INFO'
'''


@pytest.fixture(scope='module')
def config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp('cfg') / 'toy_train.py'
    path.write_text(TOY_CONFIG)
    return str(path)


def _env(**extra) -> dict:
    """This environment without any launcher's variables, plus ``extra``."""
    drop = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'PORT',
            'NNODES', 'NODE_RANK', 'OMPI_COMM_WORLD_SIZE', 'PMI_SIZE')
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(('SLURM_', 'OMPI_', 'PMI_', 'TORCHELASTIC'))}
    env.update(OMP_NUM_THREADS='1', PYTHONPATH=REPO, PYTHON=sys.executable,
               CUDA_VISIBLE_DEVICES='')  # CPU processes (gloo) on any machine
    env.update(extra)
    return env


def _run(args, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env or _env(), capture_output=True,
                          text=True, timeout=timeout)


def _checkpoints(work_dir) -> list:
    return sorted(f for f in os.listdir(work_dir) if f.endswith('.pth')) \
        if osp.isdir(work_dir) else []


# ------------------------------------------------------------------------ launchers
@pytest.mark.multiprocess
@pytest.mark.slow
def test_torchrun_without_launcher_stops(config, tmp_path):
    work = tmp_path / 'work'
    proc = _run([sys.executable, '-m', 'torch.distributed.run', '--standalone',
                 '--nproc_per_node=2', TRAIN, config, '--work-dir', str(work)],
                cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-3000:]
    assert 'LaunchEnvironmentError' in log and 'runs under torchrun' in log
    assert "--launcher is 'none'" in log
    assert '--launcher pytorch (or --launcher auto)' in log
    assert _checkpoints(work) == []


@pytest.mark.slow
def test_launcher_pytorch_without_torchrun_is_a_named_error(config, tmp_path):
    start = time.monotonic()
    proc = _run([sys.executable, TRAIN, config, '--launcher', 'pytorch', '--work-dir',
                 str(tmp_path / 'work')], cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert 'LaunchEnvironmentError' in proc.stderr
    assert ('--launcher pytorch needs the variable(s) RANK, WORLD_SIZE, LOCAL_RANK, '
            'MASTER_ADDR, MASTER_PORT') in proc.stderr
    assert 'torchrun --nproc_per_node=N' in proc.stderr
    assert 'KeyError' not in proc.stderr
    assert time.monotonic() - start < 60  # no rendezvous wait


@pytest.mark.slow
def test_launcher_auto_in_an_sbatch_batch_step_trains_alone(config, tmp_path):
    # The batch script of `sbatch --ntasks=8`: SLURM_* of the job, but no srun step.
    env = _env(SLURM_JOB_ID='4242', SLURM_NTASKS='8', SLURM_PROCID='0',
               SLURM_NODELIST='node[01-02]', SLURM_JOB_NAME='train')
    work = tmp_path / 'work'
    proc = _run([sys.executable, TRAIN, config, '--launcher', 'auto', '--work-dir',
                 str(work)], cwd=tmp_path, env=env, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _checkpoints(work) == ['iter_2.pth']
    assert 'Distributed training is not used' in proc.stdout + proc.stderr


@pytest.mark.slow
def test_two_dist_train_at_once_both_train(config, tmp_path):
    # Each takes its own free port in torchrun's rendezvous: no check-then-release race.
    procs = [subprocess.Popen(['bash', DIST_TRAIN, config, '2', '--work-dir',
                               str(tmp_path / f'run{i}')], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for i, (proc, log) in enumerate(zip(procs, logs)):
        assert proc.returncode == 0, log[-3000:]
        assert 'EADDRINUSE' not in log and 'address already in use' not in log
        assert _checkpoints(tmp_path / f'run{i}') == ['iter_2.pth']
        assert 'Distributed training is not used' not in log  # really 2 processes


@pytest.mark.slow
@pytest.mark.parametrize('script, args, env, message', [
    ('dist_train.sh', [], {}, 'missing CONFIG'),
    ('dist_train.sh', ['CFG'], {}, 'missing GPUS'),
    ('dist_train.sh', ['nope.py', '2'], {}, "config file 'nope.py' does not exist"),
    ('dist_train.sh', ['CFG', 'two'], {}, "GPUS must be a positive integer, got 'two'"),
    ('dist_train.sh', ['CFG', '0'], {}, "GPUS must be a positive integer, got '0'"),
    ('dist_train.sh', ['--gpus', '2', 'CFG'], {}, "unknown option '--gpus'"),
    ('dist_train.sh', ['CFG', '2'], {'NNODES': '2'}, 'NNODES=2 needs MASTER_ADDR'),
    ('dist_train.sh', ['CFG', '2'], {'NNODES': '2', 'NODE_RANK': '2', 'MASTER_ADDR': 'h'},
     'NODE_RANK must be an integer from 0 to NNODES-1=1'),
    ('dist_train.sh', ['CFG', '2'], {'PORT': 'x'}, "PORT must be a positive integer"),
    ('dist_test.sh', ['CFG', 'nope.pth', '2'], {}, "checkpoint file 'nope.pth' does not"),
    ('dist_test.sh', ['CFG'], {}, 'missing CHECKPOINT'),
    ('slurm_train.sh', ['p', 'job'], {}, 'missing CONFIG'),
    ('slurm_train.sh', ['p', 'job', 'CFG', 'w'], {'GPUS': '-1'},
     "GPUS must be a positive integer, got '-1'"),
])
def test_bad_script_arguments_are_named(config, tmp_path, script, args, env, message):
    args = [config if a == 'CFG' else a for a in args]
    proc = _run(['bash', osp.join(REPO, 'tools', script), *args], cwd=tmp_path,
                env=_env(**env), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert f'usage: bash tools/{script}' in proc.stderr or 'usage: [GPUS' in proc.stderr
    assert 'torch.distributed' not in proc.stderr  # stopped before torchrun


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA to count GPUs')
def test_more_gpus_than_visible_is_named(config, tmp_path):
    visible = torch.cuda.device_count()
    env = _env()
    env.pop('CUDA_VISIBLE_DEVICES')
    proc = _run(['bash', DIST_TRAIN, config, str(visible + 1)], cwd=tmp_path, env=env,
                timeout=60)
    assert proc.returncode == 2
    assert f'GPUS={visible + 1} but only {visible} CUDA device(s) are visible' in proc.stderr


# ------------------------------------------------------------------- work-dir lock
# Python keeps SIGINT ignored when it starts that way (a job that a non-interactive shell
# put in the background), so the holder restores Ctrl-C's handler to test it anywhere.
HOLDER = r'''
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from mmdet3d_scaling.engine.work_dir_lock import WorkDirLock
with WorkDirLock(sys.argv[1], command='holder for a test'):
    print('held', flush=True)
    time.sleep(600)
'''


def _start_holder(work_dir) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, '-c', HOLDER, str(work_dir)], env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == 'held', proc.stderr.read()
    return proc


def _lock(work_dir) -> dict:
    with open(osp.join(work_dir, '.train.lock')) as f:
        return json.load(f)


@pytest.mark.slow
def test_second_run_in_a_held_work_dir_is_refused(config, tmp_path):
    work = tmp_path / 'work'
    holder = _start_holder(work)
    try:
        proc = _run([sys.executable, TRAIN, config, '--work-dir', str(work)], cwd=tmp_path)
        assert proc.returncode != 0
        assert 'WorkDirLockedError' in proc.stderr
        assert (f'is in use by another training run (pid {holder.pid} on host '
                f'{socket.gethostname()}') in proc.stderr
        assert 'command: holder for a test' in proc.stderr
        assert 'Use another --work-dir' in proc.stderr and 'delete' in proc.stderr
        assert _checkpoints(work) == []
        assert not any(f.endswith('.py') for f in os.listdir(work))  # no config dump
        assert _lock(work)['pid'] == holder.pid  # the holder's lock is untouched
    finally:
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=60)
    # SIGTERM released the lock before the process ended
    assert not osp.exists(work / '.train.lock')
    assert holder.returncode == -signal.SIGTERM


@pytest.mark.slow
def test_ctrl_c_releases_the_lock(tmp_path):
    holder = _start_holder(tmp_path)
    holder.send_signal(signal.SIGINT)
    holder.wait(timeout=60)
    assert not osp.exists(tmp_path / '.train.lock')


@pytest.mark.slow
def test_stale_lock_is_taken_over(config, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    dead = subprocess.Popen([sys.executable, '-c', 'pass'])
    dead.wait()
    (work / '.train.lock').write_text(json.dumps(dict(
        pid=dead.pid, host=socket.gethostname(), started=time.time() - 60,
        command='a crashed run')))
    proc = _run([sys.executable, TRAIN, config, '--work-dir', str(work)], cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert f'taking over the stale lock of pid {dead.pid}' in log
    assert f'process {dead.pid} is not running on this host' in log
    assert _checkpoints(work) == ['iter_2.pth']
    assert not osp.exists(work / '.train.lock')  # released at the end


@pytest.mark.slow
def test_runner_train_takes_the_lock(tmp_path):
    """ScalingRunner.train() itself (the route of mmdet3d's stock tools/train.py)."""
    import mmdet3d_scaling  # noqa: F401
    from mmdet3d_scaling.engine.runner import ScalingRunner
    from mmdet3d_scaling.engine.work_dir_lock import WorkDirLockedError
    from tests.toy import toy_runner_cfg
    from mmengine.config import Config
    holder = _start_holder(tmp_path)
    try:
        cfg = Config(toy_runner_cfg(tmp_path, max_iters=2))
        runner = ScalingRunner.from_cfg(cfg)
        with pytest.raises(WorkDirLockedError, match=f'pid {holder.pid} on host'):
            runner.train()
        assert _checkpoints(tmp_path) == []
    finally:
        holder.kill()  # SIGKILL: no handler runs, the lock file stays (stale)
        holder.wait(timeout=60)
    assert _lock(tmp_path)['pid'] == holder.pid
    runner = ScalingRunner.from_cfg(Config(toy_runner_cfg(tmp_path, max_iters=2)))
    runner.train()  # the stale lock is taken over
    assert _checkpoints(tmp_path) == ['iter_2.pth']
    assert not osp.exists(tmp_path / '.train.lock')


def test_lock_of_another_host_counts_until_its_heartbeat_is_old(tmp_path, monkeypatch):
    from mmdet3d_scaling.engine.work_dir_lock import (STALE_ENV, WorkDirLock,
                                                      WorkDirLockedError)
    path = tmp_path / '.train.lock'
    path.write_text(json.dumps(dict(pid=1234, host='gpu-node-17', started=time.time(),
                                    command='train.py on node 17')))
    with pytest.raises(WorkDirLockedError) as err:
        WorkDirLock(str(tmp_path)).acquire()
    assert 'pid 1234 on host gpu-node-17' in str(err.value)
    assert f'abandoned after 30 min without a heartbeat ({STALE_ENV})' in str(err.value)
    old = time.time() - 31 * 60
    os.utime(path, (old, old))
    lock = WorkDirLock(str(tmp_path)).acquire()
    assert _lock(tmp_path)['pid'] == os.getpid()
    lock.release()
    assert not path.exists()
    monkeypatch.setenv(STALE_ENV, 'soon')
    with pytest.raises(ValueError, match=f"{STALE_ENV}='soon' is not a number"):
        WorkDirLock(str(tmp_path)).why_stale(dict(host='elsewhere'))


def test_lock_is_reentrant_in_one_process(tmp_path):
    from mmdet3d_scaling.engine.work_dir_lock import WorkDirLock
    outer = WorkDirLock(str(tmp_path)).acquire()
    inner = WorkDirLock(str(tmp_path)).acquire()  # the runner inside the CLI's lock
    inner.release()
    assert (tmp_path / '.train.lock').exists()
    outer.release()
    assert not (tmp_path / '.train.lock').exists()


# -------------------------------------------------------------- checkpoint download
def _download_rank(rank: int, port: int, url: str, homes: list, out: str) -> None:
    import torch.distributed as dist
    os.environ.update(RANK=str(rank), WORLD_SIZE='2', LOCAL_RANK='0',  # two "nodes"
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port),
                      TORCH_HOME=homes[rank])
    dist.init_process_group('gloo', rank=rank, world_size=2)
    try:
        import mmdet3d_scaling  # noqa: F401  (the http scheme of the loader)
        from mmengine.runner.checkpoint import CheckpointLoader
        ckpt = CheckpointLoader.load_checkpoint(url, map_location='cpu')
        with open(osp.join(out, f'rank{rank}.json'), 'w') as f:
            json.dump(dict(weight=ckpt['state_dict']['w'].tolist()), f)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_http_checkpoint_is_downloaded_on_every_node(tmp_path):
    served = tmp_path / 'served'
    served.mkdir()
    torch.save(dict(state_dict=dict(w=torch.tensor([1.0, 2.0])), meta=dict()),
               served / 'toy.pth')
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f'http://127.0.0.1:{server.server_address[1]}/toy.pth'
    homes = [str(tmp_path / f'node{i}_torch_home') for i in range(2)]
    try:
        method = 'fork' if not torch.cuda.is_initialized() else 'spawn'
        mp.start_processes(_download_rank, args=(_free_port(), url, homes, str(tmp_path)),
                           nprocs=2, join=True, start_method=method)
    finally:
        server.shutdown()
    for rank in range(2):
        assert osp.isfile(osp.join(homes[rank], 'hub', 'checkpoints', 'toy.pth'))
        result = json.loads((tmp_path / f'rank{rank}.json').read_text())
        assert result['weight'] == [1.0, 2.0]
