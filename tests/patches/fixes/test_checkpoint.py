import fractions
import os
import pickle

import pytest
import torch
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.fixes import checkpoint as patch
from tests.toy import toy_runner_cfg


@pytest.fixture
def no_trusted(monkeypatch):
    monkeypatch.delenv(patch.TRUSTED_ENV, raising=False)
    monkeypatch.setattr(patch, '_trusted', [])  # the process list too


def _train_and_checkpoint(work_dir) -> str:
    runner = Runner(**toy_runner_cfg(work_dir, max_iters=4))
    runner.train()
    path = os.path.join(work_dir, 'iter_4.pth')
    assert os.path.isfile(path)
    return path


@pytest.mark.slow
def test_mmengine_checkpoint_needs_the_allow_list(tmp_path, no_trusted):
    path = _train_and_checkpoint(tmp_path)
    # torch >= 2.6 refuses a plain weights_only load of an mmengine checkpoint ...
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    # ... and mmengine's loader, routed through the patch, loads it safely.
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    assert ckpt['meta']['iter'] == 4
    assert 'message_hub' in ckpt and 'optimizer' in ckpt


@pytest.mark.slow
def test_resume_through_runner(tmp_path, no_trusted):
    path = _train_and_checkpoint(tmp_path / 'a')
    runner = Runner(**toy_runner_cfg(tmp_path / 'b', max_iters=6, resume=True,
                                     load_from=path))
    runner.train()
    assert runner.iter == 6


def test_untrusted_globals_are_refused_and_named(tmp_path, no_trusted):
    path = str(tmp_path / 'odd.pth')
    torch.save(dict(state_dict={}, meta=dict(ratio=fractions.Fraction(1, 3))), path)
    with pytest.raises(patch.UntrustedCheckpointError) as err:
        CheckpointLoader.load_checkpoint(path)
    message = str(err.value)
    assert 'fractions.Fraction' in message and '--trust-checkpoint' in message
    assert path in message


def test_trusted_file_loads_fully(tmp_path, no_trusted):
    path = str(tmp_path / 'odd.pth')
    torch.save(dict(state_dict={}, meta=dict(ratio=fractions.Fraction(1, 3))), path)
    patch.trust_checkpoints([path])
    ckpt = CheckpointLoader.load_checkpoint(path)
    assert ckpt['meta']['ratio'] == fractions.Fraction(1, 3)
    # Trust is per file: a copy elsewhere is still refused.
    other = str(tmp_path / 'copy.pth')
    torch.save(dict(meta=dict(ratio=fractions.Fraction(1, 3))), other)
    with pytest.raises(patch.UntrustedCheckpointError):
        CheckpointLoader.load_checkpoint(other)


def test_missing_checkpoint_names_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        CheckpointLoader.load_checkpoint(str(tmp_path / 'nope.pth'))


class _SneakyGetattr:
    """Pickles as getattr(HistoryBuffer, '__init__'): a getattr outside the allow-list."""

    def __reduce__(self):
        from mmengine.logging.history_buffer import HistoryBuffer
        return getattr, (HistoryBuffer, '__init__')


def test_getattr_is_limited_to_history_buffer_statistics(tmp_path, no_trusted):
    path = str(tmp_path / 'sneaky.pth')
    torch.save(dict(meta=dict(x=_SneakyGetattr())), path)
    with pytest.raises(patch.UntrustedCheckpointError, match='--trust-checkpoint'):
        CheckpointLoader.load_checkpoint(path)


@pytest.mark.slow
def test_fresh_process_loads_a_runner_checkpoint(tmp_path, no_trusted):
    # A new interpreter has created no HistoryBuffer yet (its statistics are registered
    # lazily): loading must not depend on that.
    import subprocess
    import sys
    path = _train_and_checkpoint(tmp_path)
    code = ('import mmdet3d_scaling\n'
            'from mmengine.runner.checkpoint import CheckpointLoader\n'
            f'ckpt = CheckpointLoader.load_checkpoint({path!r}, map_location="cpu")\n'
            'print("iter", ckpt["meta"]["iter"])\n')
    env = {k: v for k, v in os.environ.items() if k != patch.TRUSTED_ENV}
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert 'iter 4' in proc.stdout
