"""checkpoint: a cut checkpoint is named with the previous good one; trust is logged.

Real mmengine Runners write the checkpoints; the cut is a real truncation of the file.
"""
import fractions
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.logging import MMLogger
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

import mmdet3d_scaling  # noqa: F401  (applies the fixes set)
from mmdet3d_scaling.patches.fixes import checkpoint as shim
from tests.toy import toy_runner_cfg

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


@pytest.fixture
def no_trusted(monkeypatch):
    monkeypatch.delenv(shim.TRUSTED_ENV, raising=False)
    monkeypatch.setattr(shim, '_trusted', [])  # the process list too


@pytest.fixture
def cut_run(tmp_path, no_trusted):
    """A work dir with iter_4.pth (whole) and iter_8.pth cut to half (last_checkpoint)."""
    work = tmp_path / 'run'
    cfg = toy_runner_cfg(work, max_iters=8)
    cfg['default_hooks']['checkpoint']['interval'] = 4
    Runner(**cfg).train()
    last = work / 'iter_8.pth'
    os.utime(work / 'iter_4.pth', (1, 1))  # older than the cut one, as in a real run
    with open(last, 'r+b') as f:
        f.truncate(osp.getsize(last) // 2)
    return work


def _expect_named(err, work) -> None:
    msg = str(err.value)
    assert f'checkpoint {work / "iter_8.pth"} cannot be read' in msg
    assert 'PytorchStreamReader failed reading zip archive' in msg
    assert f'The newest readable checkpoint in the same folder is {work / "iter_4.pth"}' \
        in msg
    assert f'--resume {work / "iter_4.pth"}' in msg


@pytest.mark.slow
def test_resume_from_a_cut_checkpoint_suggests_the_previous(cut_run, tmp_path):
    cfg = toy_runner_cfg(tmp_path / 'b', max_iters=12, resume=True,
                         load_from=str(cut_run / 'iter_8.pth'))
    with pytest.raises(shim.CorruptCheckpointError) as err:
        Runner(**cfg).train()
    _expect_named(err, cut_run)


@pytest.mark.slow
def test_auto_resume_of_a_cut_last_checkpoint(cut_run):
    cfg = toy_runner_cfg(cut_run, max_iters=12, resume=True)  # last_checkpoint: iter_8
    with pytest.raises(shim.CorruptCheckpointError) as err:
        Runner(**cfg).train()
    _expect_named(err, cut_run)


@pytest.mark.slow
def test_load_from_a_cut_checkpoint_suggests_the_previous(cut_run, tmp_path):
    cfg = toy_runner_cfg(tmp_path / 'c', max_iters=2, load_from=str(cut_run / 'iter_8.pth'))
    with pytest.raises(shim.CorruptCheckpointError) as err:
        Runner(**cfg).train()
    _expect_named(err, cut_run)


def test_empty_checkpoint_without_a_previous_one(tmp_path, no_trusted):
    path = tmp_path / 'only.pth'
    path.write_bytes(b'')
    with pytest.raises(shim.CorruptCheckpointError) as err:
        CheckpointLoader.load_checkpoint(str(path))
    msg = str(err.value)
    assert f'checkpoint {path} is empty (0 bytes)' in msg
    assert 'No other readable checkpoint is in its folder' in msg


@pytest.mark.slow
def test_tools_test_names_a_cut_checkpoint(cut_run, tmp_path):
    """tools/test.py loads through the same scheme: a subprocess on the toy config."""
    cfg_file = tmp_path / 'toy_test.py'
    cfg_file.write_text(
        'custom_imports = dict(imports=["mmdet3d_scaling", "tests.toy"], '
        'allow_failed_imports=False)\n'
        'model = dict(type="ToyRegressor")\n'
        'test_dataloader = dict(dataset=dict(type="ToyDataset"), batch_size=2, '
        'num_workers=0, sampler=dict(type="DefaultSampler", shuffle=False), '
        'collate_fn=dict(type="default_collate"))\n'
        f'test_evaluator = dict(type="DumpResults", out_file_path="{tmp_path}/r.pkl")\n'
        'test_cfg = dict()\n'
        'preflight = dict(check_data=False)\n')
    env = {k: v for k, v in os.environ.items() if k != shim.TRUSTED_ENV}
    env['PYTHONPATH'] = REPO
    done = subprocess.run([sys.executable, osp.join(REPO, 'tools', 'test.py'), str(cfg_file),
                           str(cut_run / 'iter_8.pth'), '--work-dir', str(tmp_path / 'w')],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert done.returncode != 0
    assert 'CorruptCheckpointError' in done.stderr, done.stderr[-3000:]
    assert f'{cut_run / "iter_8.pth"} cannot be read' in done.stderr
    assert f'newest readable checkpoint in the same folder is {cut_run / "iter_4.pth"}' \
        in done.stderr


def test_trusted_checkpoint_load_is_logged_with_what_it_accepted(tmp_path, no_trusted):
    path = str(tmp_path / 'odd.pth')
    torch.save(dict(state_dict={}, meta=dict(ratio=fractions.Fraction(1, 3))), path)
    shim.trust_checkpoints([path])
    log_file = tmp_path / 'trust.log'
    MMLogger.get_instance('trust_log_test', log_file=str(log_file), log_level='INFO')
    ckpt = CheckpointLoader.load_checkpoint(path)
    assert ckpt['meta']['ratio'] == fractions.Fraction(1, 3)
    text = log_file.read_text()
    assert f'loading checkpoint {path} with full unpickling' in text
    assert ('objects outside the mmengine allow-list it holds (accepted): '
            'fractions.Fraction') in text


def test_trusted_plain_checkpoint_logs_nothing_extra(tmp_path, no_trusted):
    path = str(tmp_path / 'plain.pth')
    torch.save(dict(state_dict=dict(w=torch.zeros(2))), path)
    shim.trust_checkpoints([path])
    log_file = tmp_path / 'plain.log'
    MMLogger.get_instance('trust_plain_test', log_file=str(log_file), log_level='INFO')
    CheckpointLoader.load_checkpoint(path)
    assert 'it holds no objects outside the mmengine allow-list' in log_file.read_text()


# ------------------------------------------------- files that are not checkpoints
def _not_checkpoints(folder) -> dict:
    """A zip without torch data, a bare tensor, an empty file: newer than iter_4.pth."""
    import zipfile
    paths = dict(notorch=folder / 'notorch.pth', tensor=folder / 'tensor.pth',
                 empty=folder / 'empty.pth')
    with zipfile.ZipFile(paths['notorch'], 'w') as archive:
        archive.writestr('hello.txt', 'hello')
    torch.save(torch.zeros(3), paths['tensor'])
    paths['empty'].write_bytes(b'')
    return paths


@pytest.mark.slow
@pytest.mark.parametrize('kind, what', [
    ('notorch', 'is a zip archive without torch data (no data.pkl; it holds hello.txt)'),
    ('tensor', 'holds a bare tensor, not the dict of a checkpoint'),
    ('empty', 'is empty (0 bytes), not a checkpoint')])
def test_a_file_that_is_not_a_checkpoint_is_named_and_never_recommended(
        cut_run, tmp_path, kind, what):
    bad = _not_checkpoints(cut_run)  # beside the cut iter_8.pth and the whole iter_4.pth
    cfg = toy_runner_cfg(tmp_path / 'r', max_iters=12, resume=True,
                         load_from=str(bad[kind]))
    with pytest.raises(shim.CorruptCheckpointError) as err:
        Runner(**cfg).train()
    msg = str(err.value)
    assert f'checkpoint {bad[kind]} {what}' in msg, msg
    assert 'not a checkpoint' in msg
    assert f'The newest readable checkpoint in the same folder is {cut_run / "iter_4.pth"}' \
        in msg, msg
    # and the cut checkpoint's error recommends none of them either
    cfg = toy_runner_cfg(tmp_path / 'c', max_iters=12, resume=True,
                         load_from=str(cut_run / 'iter_8.pth'))
    with pytest.raises(shim.CorruptCheckpointError) as err:
        Runner(**cfg).train()
    _expect_named(err, cut_run)


def test_readability_means_a_checkpoint_dict(tmp_path):
    bad = _not_checkpoints(tmp_path)
    for path in bad.values():
        assert shim.checkpoint_problem(str(path)) is not None, path
    torch.save(dict(state_dict=dict(w=torch.zeros(2))), tmp_path / 'ok.pth')
    torch.save(torch.nn.Linear(2, 1).state_dict(), tmp_path / 'weights.pth')  # OrderedDict
    assert shim.checkpoint_problem(str(tmp_path / 'ok.pth')) is None
    assert shim.checkpoint_problem(str(tmp_path / 'weights.pth')) is None
    assert CheckpointLoader.load_checkpoint(str(tmp_path / 'weights.pth'))['weight'].shape \
        == (1, 2)


@pytest.mark.slow
def test_last_checkpoint_naming_a_deleted_file_points_to_the_readable_one(tmp_path,
                                                                          no_trusted):
    work = tmp_path / 'run'
    cfg = toy_runner_cfg(work, max_iters=4)
    cfg['default_hooks']['checkpoint']['interval'] = 2
    Runner(**cfg).train()
    os.remove(work / 'iter_4.pth')  # last_checkpoint still names it
    with pytest.raises(shim.MissingCheckpointError) as err:
        Runner(**toy_runner_cfg(work, max_iters=8, resume=True)).train()
    msg = str(err.value)
    assert f'checkpoint {work / "iter_4.pth"} does not exist ({work / "last_checkpoint"}' \
        in msg, msg
    assert f'The newest readable checkpoint in the same folder is {work / "iter_2.pth"}' \
        in msg
    assert f'--resume {work / "iter_2.pth"}' in msg
