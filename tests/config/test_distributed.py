"""The ``distributed = dict(...)`` config step (no processes started here)."""
import copy

import pytest
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.preparation import prepare_config
from mmdet3d_scaling.config.distributed import configure_distributed
from tests.parallel.dist_parts import toy_cfg


def _prepared(tmp_path, launcher='pytorch', **extra) -> Config:
    return prepare_config(toy_cfg(str(tmp_path), launcher=launcher, **extra))


def test_without_the_key_mmengine_wrapper_and_timeout_stay(tmp_path):
    cfg = toy_cfg(str(tmp_path), launcher='pytorch')
    cfg.env_cfg.dist_cfg.pop('timeout')
    prepared = prepare_config(cfg)
    assert prepared.get('model_wrapper_cfg') is None or (
        prepared.model_wrapper_cfg.get('type') != 'ScalingDistributedDataParallel')
    assert 'timeout' not in prepared.env_cfg.dist_cfg


def test_distributed_run_gets_the_scaling_wrapper_with_defaults(tmp_path):
    cfg = _prepared(tmp_path, distributed=dict())
    wrapper = cfg.model_wrapper_cfg
    assert wrapper.type == 'ScalingDistributedDataParallel'
    assert (wrapper.find_unused_parameters, wrapper.static_graph,
            wrapper.gradient_as_bucket_view, wrapper.bucket_cap_mb,
            wrapper.broadcast_buffers, wrapper.comm_compression) == (
                False, False, False, 25, False, None)
    assert 'probe_dataloader' not in wrapper


def test_options_reach_the_wrapper(tmp_path):
    cfg = _prepared(tmp_path, distributed=dict(
        find_unused_parameters='auto', static_graph=True, bucket_cap_mb=50,
        comm_compression='fp16', sync_bn='naive', sync_bn_scope=['backbone']))
    w = cfg.model_wrapper_cfg
    assert (w.find_unused_parameters, w.static_graph, w.bucket_cap_mb,
            w.comm_compression, w.sync_bn, w.sync_bn_scope) == (
                'auto', True, 50, 'fp16', 'naive', ['backbone'])
    assert w.probe_dataloader.batch_size == cfg.train_dataloader.batch_size


def test_bf16_compression_needs_nccl(tmp_path):
    with pytest.raises(ValueError, match="'bf16' needs the NCCL backend.*'gloo'"):
        _prepared(tmp_path, distributed=dict(comm_compression='bf16'))
    cfg = toy_cfg(str(tmp_path), launcher='pytorch', distributed=dict(comm_compression='bf16'))
    cfg.env_cfg.dist_cfg.backend = 'nccl'
    assert configure_distributed(cfg).model_wrapper_cfg.comm_compression == 'bf16'


def test_timeout_default_explicit_and_conflict(tmp_path):
    cfg = toy_cfg(str(tmp_path), launcher='pytorch', distributed=dict())
    cfg.env_cfg.dist_cfg.pop('timeout')
    assert prepare_config(cfg).env_cfg.dist_cfg.timeout == 3600
    cfg = toy_cfg(str(tmp_path), launcher='pytorch', distributed=dict(timeout_minutes=5))
    cfg.env_cfg.dist_cfg.pop('timeout')
    assert prepare_config(cfg).env_cfg.dist_cfg.timeout == 300
    cfg = toy_cfg(str(tmp_path), launcher='pytorch', distributed=dict(timeout_minutes=5))
    with pytest.raises(ValueError, match='timeout_minutes=5.*dist_cfg.timeout=180'):
        prepare_config(cfg)


def test_top_level_keys_are_folded_in_and_conflicts_are_errors(tmp_path):
    cfg = _prepared(tmp_path, find_unused_parameters=True, sync_bn='torch',
                    distributed=dict())
    assert cfg.model_wrapper_cfg.find_unused_parameters is True
    assert cfg.model_wrapper_cfg.sync_bn == 'torch'
    assert 'sync_bn' not in cfg  # mmengine must not convert it a second time
    with pytest.raises(ValueError, match='conflicting find_unused_parameters'):
        _prepared(tmp_path, find_unused_parameters=True,
                  distributed=dict(find_unused_parameters=False))


@pytest.mark.parametrize('options,match', [
    (dict(bucket_size=25), 'unknown key.*bucket_size'),
    (dict(comm_compression='int8'), "comm_compression.*'int8'"),
    (dict(find_unused_parameters='yes'), "find_unused_parameters.*'yes'"),
    (dict(static_graph=1), 'static_graph must be True or False'),
    (dict(bucket_cap_mb=0), 'bucket_cap_mb must be a positive number'),
    (dict(sync_bn='apex'), "sync_bn.*'apex'"),
    (dict(sync_bn='allreduce', sync_bn_scope='backbone'),
     "sync_bn_scope must be .* list .*got 'backbone'"),
])
def test_bad_options_are_errors_even_in_one_process(tmp_path, options, match):
    with pytest.raises(ValueError, match=match):
        _prepared(tmp_path, launcher='none', distributed=options)


def test_single_process_keeps_the_bare_model_config(tmp_path):
    cfg = _prepared(tmp_path, launcher='none', distributed=dict(static_graph=True))
    assert 'model_wrapper_cfg' not in cfg


def test_other_wrappers_are_left_alone_unless_options_need_ours(tmp_path):
    fsdp = dict(type='MMFullyShardedDataParallel')
    cfg = _prepared(tmp_path, model_wrapper_cfg=copy.deepcopy(fsdp))
    assert cfg.model_wrapper_cfg.type == 'MMFullyShardedDataParallel'
    with pytest.raises(ValueError, match='MMFullyShardedDataParallel'):
        _prepared(tmp_path, model_wrapper_cfg=fsdp, distributed=dict(static_graph=True))


def test_step_is_idempotent(tmp_path):
    cfg = _prepared(tmp_path, sync_bn='torch', distributed=dict(comm_compression='fp16'))
    again = configure_distributed(copy.deepcopy(cfg))
    assert again.model_wrapper_cfg == cfg.model_wrapper_cfg
    assert prepare_config(copy.deepcopy(cfg)).to_dict() == cfg.to_dict()
