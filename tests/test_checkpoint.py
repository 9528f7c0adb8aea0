"""Checkpoint round trips (bit-exact), retention, async saves and the corrupt/partial-step fallback."""

import glob
import json
import logging
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from grpo_jax.infra import checkpoint
from grpo_jax.infra import errors
from grpo_jax.infra import params_ckpt
from tests import script_parts


def abstract_of(tree):
  """Abstract twin of a concrete (sharded) pytree: the `abstract_state` that `restore` wants."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


class TrainState(NamedTuple):  # stands in for state.py's pytree: only the `params` field name matters here
  params: dict
  opt: dict
  step: jax.Array
  rng: jax.Array


def _make_state(seed: int) -> TrainState:
  """bf16 + fp32 + int32 + uint32 + a typed PRNG key: every dtype a real state holds."""
  n = len(jax.devices())
  mesh = jax.make_mesh((n,), ('data',))
  sharded, replicated = NamedSharding(mesh, P('data')), NamedSharding(mesh, P())
  rng = np.random.default_rng(seed)
  w = rng.standard_normal((2 * n, 3)).astype(np.float32)
  return TrainState(
      params={'w': jax.device_put(jnp.asarray(w, jnp.bfloat16), sharded),
              'b': jax.device_put(rng.standard_normal(3).astype(np.float32), replicated)},
      opt={'mu': jax.device_put(w * 1e-3, sharded), 'count': jax.device_put(np.int32(seed), replicated),
           'bits': jax.device_put(rng.integers(0, 2**32, 4, dtype=np.uint32), replicated)},
      step=jax.device_put(np.int32(seed), replicated),
      rng=jax.device_put(jax.random.key(seed), replicated),
  )


def _leaves_as_bytes(tree):
  """Bytes + dtype + shape per leaf: equality here is bit-identity (NaN payloads and -0.0 included)."""
  out = []
  for leaf in jax.tree.leaves(tree):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      out.append(('key', str(jax.random.key_impl(leaf)), np.asarray(jax.random.key_data(leaf)).tobytes()))
    else:
      arr = np.asarray(leaf)
      out.append((str(arr.dtype), arr.shape, arr.tobytes()))
  return out


def _assert_bit_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  assert _leaves_as_bytes(a) == _leaves_as_bytes(b)


@pytest.fixture(scope='module')
def states():
  return {s: _make_state(s) for s in range(1, 4)}


def _save_steps(directory, states, steps, **kw):
  with checkpoint.Checkpointer(directory, save_every=1, keep=kw.pop('keep', 5), **kw) as ckpt:
    for s in steps:
      assert ckpt.maybe_save(s, states[s], {'data_pos': s * 10})
  return directory


def test_round_trip_is_bit_identical_and_uses_target_shardings(tmp_path, states):
  state = states[1]
  _save_steps(tmp_path / 'ck', states, [1], async_save=False)
  abstract = abstract_of(state)
  # Restore `w` replicated instead of sharded: the result must follow the abstract state, not the saved layout.
  replicated = state.params['b'].sharding
  abstract.params['w'] = jax.ShapeDtypeStruct(abstract.params['w'].shape, jnp.bfloat16, sharding=replicated)
  with checkpoint.Checkpointer(tmp_path / 'ck', save_every=1, keep=5) as ckpt:
    assert ckpt.latest_step() == 1
    restored, meta = ckpt.restore(None, abstract)
  assert isinstance(restored, TrainState)
  _assert_bit_identical(restored, state)
  assert restored.params['w'].dtype == jnp.bfloat16
  assert restored.params['w'].sharding == replicated
  assert restored.opt['mu'].sharding == state.opt['mu'].sharding
  assert jax.dtypes.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
  # The restored key draws the same numbers as the original.
  np.testing.assert_array_equal(jax.random.uniform(restored.rng, (4,)), jax.random.uniform(state.rng, (4,)))
  assert meta == {'step': 1, 'data_pos': 10}


def test_keep_k_and_save_every(tmp_path, states):
  with checkpoint.Checkpointer(tmp_path, save_every=2, keep=2, async_save=False) as ckpt:
    saved = [ckpt.maybe_save(s, states[1]) for s in range(7)]
    assert saved == [True, False, True, False, True, False, True]
    assert ckpt.maybe_save(7, states[1], force=True)
    assert not ckpt.maybe_save(7, states[1], force=True)  # already there: no StepAlreadyExistsError
    assert ckpt.all_steps() == [6, 7]
  assert sorted(int(p) for p in os.listdir(tmp_path) if p.isdigit()) == [6, 7]


def test_async_save_survives_donation_then_restores(tmp_path, states):
  src = _make_state(2)
  expected = _make_state(2)  # deterministic twin of src
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=2, async_save=True) as ckpt:
    assert ckpt.maybe_save(5, src, {'data_pos': 7})
    for leaf in jax.tree.leaves(src):  # what donating the state to the next step does to the buffers
      leaf.delete()
    ckpt.wait()
    restored, meta = ckpt.restore(5, abstract_of(expected))
  _assert_bit_identical(restored, expected)
  assert meta == {'step': 5, 'data_pos': 7}


def _truncate_data(step_dir):
  files = glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True)
  assert files
  for f in files:
    with open(f, 'rb') as fh:
      data = fh.read()
    with open(f, 'wb') as fh:
      fh.write(data[:len(data) // 2])


def _garbage_metadata(step_dir):
  with open(os.path.join(step_dir, 'state', '_METADATA'), 'w') as fh:
    fh.write('\x00garbage')


def _garbage_meta_json(step_dir):
  with open(os.path.join(step_dir, 'meta', 'metadata'), 'w') as fh:
    fh.write('{"step": 3,')


def _uncommitted(step_dir):
  os.remove(os.path.join(step_dir, 'commit_success.txt'))


def _meta_names_another_step(step_dir):
  """One flipped bit in the metadata JSON: '3' (0x33) becomes '7' (0x37). Still valid JSON, and the checksums cover
  the state, not the JSON: step 3 restored as step 7 (data position and step count 4 steps ahead), silently."""
  path = os.path.join(step_dir, 'meta', 'metadata')
  with open(path, 'rb') as fh:
    data = bytearray(fh.read())
  at = data.index(b'"step": 3') + len(b'"step": ')
  data[at] ^= 0x04
  with open(path, 'wb') as fh:
    fh.write(bytes(data))
  assert json.loads(bytes(data))['step'] == 7


@pytest.mark.parametrize('corrupt', [_truncate_data, _garbage_metadata, _garbage_meta_json, _uncommitted,
                                     _meta_names_another_step])
def test_bad_newest_falls_back_with_warning(tmp_path, states, caplog, corrupt):
  _save_steps(tmp_path, states, [1, 2, 3], async_save=False)
  corrupt(str(tmp_path / '3'))
  caplog.set_level(logging.WARNING)
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    if corrupt is _meta_names_another_step:  # named: refused, nothing moved
      with pytest.raises(errors.InputError, match=r'step 3 .* is damaged \(its metadata says step 7, its directory 3'):
        ckpt.restore(3, abstract_of(states[3]))
    restored, meta = ckpt.restore(None, abstract_of(states[3]))
    _assert_bit_identical(restored, states[2])
    assert meta == {'step': 2, 'data_pos': 20}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any('step 3' in w and str(tmp_path) in w for w in warnings), warnings
    # The bad step is moved aside, so the resumed run can save step 3 again and restore it.
    assert not (tmp_path / '3').exists()
    assert len(os.listdir(tmp_path / checkpoint.CORRUPT_SUBDIR)) == 1
    # ... and counted (run/loop_guard.py writes them to metrics.jsonl): a partial write when the checkpointer
    # opens, a damaged step when the restore falls back
    partial = corrupt is _uncommitted
    assert ckpt.skipped == {'ckpt/partial_skipped': int(partial), 'ckpt/unusable_skipped': int(not partial)}
    assert ckpt.latest_step() == 2
    assert ckpt.maybe_save(3, states[3])
    ckpt.wait()
    restored, meta = ckpt.restore(None, abstract_of(states[3]))
  _assert_bit_identical(restored, states[3])
  assert meta['step'] == 3


def test_uncommitted_newest_is_not_latest(tmp_path, states):
  _save_steps(tmp_path, states, [1, 2], async_save=False)
  _uncommitted(str(tmp_path / '2'))
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5, async_save=False) as ckpt:
    assert ckpt.latest_step() == 1
    assert ckpt.all_steps() == [1]
    assert os.listdir(tmp_path / checkpoint.CORRUPT_SUBDIR)[0].startswith('2-')  # moved aside on open
    assert ckpt.maybe_save(2, states[3])  # so step 2 can be written again
    restored, _ = ckpt.restore(None, abstract_of(states[3]))
  _assert_bit_identical(restored, states[3])


def test_all_bad_raises_naming_directory(tmp_path, states):
  _save_steps(tmp_path, states, [1, 2], async_save=False)
  _truncate_data(str(tmp_path / '1'))
  _uncommitted(str(tmp_path / '2'))
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    with pytest.raises(ValueError, match=f'no restorable checkpoint in {tmp_path}.*move them away'):
      ckpt.restore(None, abstract_of(states[1]))
  with checkpoint.Checkpointer(tmp_path / 'empty', save_every=1, keep=5) as ckpt:
    assert ckpt.latest_step() is None
    with pytest.raises(ValueError, match='no checkpoint in .*empty'):
      ckpt.restore(None, abstract_of(states[1]))


def test_explicit_missing_step_raises(tmp_path, states):
  _save_steps(tmp_path, states, [1], async_save=False)
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    with pytest.raises(ValueError, match=r'step=4 .*available: \[1\]'):
      ckpt.restore(4, abstract_of(states[1]))


def test_restore_params_only_reads_params_subtree(tmp_path, states):
  _save_steps(tmp_path, states, [1, 2], async_save=False)
  abstract_params = abstract_of(states[1].params)
  got = params_ckpt.restore_params_only(tmp_path, abstract_params)
  assert (got.step, got.skipped) == (2, ())
  _assert_bit_identical(got.params, states[2].params)
  _assert_bit_identical(params_ckpt.restore_params_only(tmp_path, abstract_params, step=1).params, states[1].params)
  _truncate_data(str(tmp_path / '2'))
  got = params_ckpt.restore_params_only(tmp_path, abstract_params)
  # the step it says is the step it read: the damaged newest is passed over, and named with why
  assert got.step == 1 and [s for s, _ in got.skipped] == [2], got.skipped
  _assert_bit_identical(got.params, states[1].params)
  with pytest.raises(errors.InputError, match=r'checkpoint step 2 in .* is damaged'):
    params_ckpt.restore_params_only(tmp_path, abstract_params, step=2)


def test_save_and_load_params(tmp_path, states):
  params = states[3].params
  params_ckpt.save_params(tmp_path / 'p', params)
  params_ckpt.save_params(tmp_path / 'p', states[1].params)  # overwrites
  _assert_bit_identical(params_ckpt.load_params(tmp_path / 'p', abstract_of(params)), states[1].params)
  with pytest.raises(ValueError, match='does not exist'):
    params_ckpt.load_params(tmp_path / 'missing', abstract_of(params))


def test_bad_arguments_raise(tmp_path, states):
  with pytest.raises(ValueError, match='save_every'):
    checkpoint.Checkpointer(tmp_path, save_every=0, keep=1)
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=1, async_save=False) as ckpt:
    with pytest.raises(ValueError, match=r"meta\['fn'\] is not JSON"):
      ckpt.maybe_save(0, states[1], {'fn': print})
    with pytest.raises(ValueError, match=r"meta\['step'\]=5 differs from the step saved, 0"):
      ckpt.maybe_save(0, states[1], {'step': 5})
    assert ckpt.maybe_save(0, states[1], {'pos': np.int64(3), 'lr': jnp.float32(0.5)})
    no_sharding = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), states[1])
    with pytest.raises(ValueError, match=r'abstract_state.*has no concrete sharding'):
      ckpt.restore(0, no_sharding)
    with pytest.raises(ValueError, match=r'abstract_state.*has no concrete sharding'):
      ckpt.restore(0, jax.eval_shape(lambda: states[1]))  # shardings on an AbstractMesh
    _, meta = ckpt.restore(0, abstract_of(states[1]))
  assert meta == {'step': 0, 'pos': 3, 'lr': 0.5}
  on_disk = json.loads((tmp_path / '0' / 'meta' / 'metadata').read_text())
  assert set(on_disk.pop('integrity')['checksums']) == {".params['w']", ".params['b']", ".opt['mu']",
                                                        ".opt['count']", ".opt['bits']", '.step', '.rng'}
  assert on_disk.pop('mesh') == {'data': len(jax.devices())}  # the mesh it was saved from (a resume compares it)
  assert on_disk == meta


_TWO_PROCESS_SCRIPT = r'''
import glob, os, sys
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P
pid, port, directory = int(sys.argv[1]), sys.argv[2], sys.argv[3]
jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}', num_processes=2, process_id=pid)
from grpo_jax.infra import checkpoint
from grpo_jax.infra import errors
from grpo_jax.infra import params_ckpt
abstract_of = lambda tree: jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
mesh = jax.make_mesh((4,), ('data',), devices=jax.devices())
sh, rep = NamedSharding(mesh, P('data')), NamedSharding(mesh, P())

def state(s):  # every process builds the same global values; each holds only its own shards
  w = (np.arange(24, dtype=np.float32).reshape(8, 3) * s).astype(jnp.bfloat16)
  v = np.arange(4096, dtype=np.float32).reshape(64, 64) * s  # shards big enough to live in data files (not inlined)
  return {'params': {'w': jax.make_array_from_callback(w.shape, sh, lambda i: w[i]),
                     'v': jax.make_array_from_callback(v.shape, sh, lambda i: v[i])},
          'step': jax.make_array_from_callback((), rep, lambda i: np.int32(s)),
          'rng': jax.jit(lambda: jax.random.key(s), out_shardings=rep)()}

if pid == 0:  # a step dir from a save that crashed before committing
  os.makedirs(os.path.join(directory, '7', 'state'))
multihost_utils.sync_global_devices('partial')
with checkpoint.Checkpointer(directory, save_every=1, keep=3, async_save=True) as ckpt:
  assert ckpt.latest_step() is None and not os.path.exists(os.path.join(directory, '7'))
  for s in (1, 2):
    ckpt.maybe_save(s, state(s), {'data_pos': s})
  ckpt.wait()
  multihost_utils.sync_global_devices('saved')
  if pid == 0:  # damage the newest step the way a crash or bad disk would
    for f in glob.glob(os.path.join(directory, '2', 'state', '**', 'd', '*'), recursive=True):
      open(f, 'wb').write(b'\0' * 8)
  multihost_utils.sync_global_devices('corrupted')
  restored, meta = ckpt.restore(None, abstract_of(state(2)))
  want = state(1)
  for got, exp in zip(restored['params']['w'].addressable_shards, want['params']['w'].addressable_shards):
    assert got.index == exp.index and np.array_equal(np.asarray(got.data), np.asarray(exp.data)), got.index
  assert restored['params']['w'].sharding == sh and int(restored['step']) == 1, restored['step']
  assert np.array_equal(jax.random.key_data(restored['rng']), jax.random.key_data(want['rng']))
  assert meta == {'step': 1, 'data_pos': 1}, meta
  assert ckpt.latest_step() == 1 and ckpt.maybe_save(2, state(2))
  ckpt.wait()
  assert ckpt.restore(None, abstract_of(state(2)))[1]['step'] == 2
  # Damage only what process 1 reads (OCDBT: a directory per writing process; each reads back its own shards):
  # process 0 read step 3 and went on to verify it, process 1 to step 2, their collectives met and the job hung.
  assert ckpt.maybe_save(3, state(3))
  ckpt.wait()
  multihost_utils.sync_global_devices('saved 3')
  if pid == 0:
    files = glob.glob(os.path.join(directory, '3', 'state', 'ocdbt.process_1', 'd', '*'))
    assert files, os.listdir(os.path.join(directory, '3', 'state'))
    for f in files:
      open(f, 'wb').write(b'\0' * 8)
  multihost_utils.sync_global_devices('corrupted 3')
  try:
    ckpt.restore(3, abstract_of(state(3)))
    raise AssertionError('step 3 restored')
  except errors.InputError as e:  # named, on both processes (process 1: why; process 0: that process 1 failed)
    assert 'step 3' in str(e) and ('process(es) [1] could not read it' in str(e)) == (pid == 0), e
  got = params_ckpt.restore_params_only(directory, abstract_of(state(3))['params'])
  assert (got.step, [s for s, _ in got.skipped]) == (2, [3]), got
  restored, meta = ckpt.restore(None, abstract_of(state(3)))
  assert meta == {'step': 2} and int(restored['step']) == 2, meta
  assert ckpt.skipped['ckpt/unusable_skipped'] == 2 and ckpt.latest_step() == 2
print('OK', pid, flush=True)
'''


def test_two_processes_save_corrupt_fallback_resave(tmp_path):
  """Two jax.distributed processes (2 CPU devices each) share one checkpoint directory."""
  import socket
  import subprocess
  import sys
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=os.environ['XLA_FLAGS'] + ' --xla_force_host_platform_device_count=2',
             PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  procs = [subprocess.Popen([sys.executable, '-c', _TWO_PROCESS_SCRIPT, str(i), str(port), str(tmp_path / 'ck')],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
  outs = []
  for p in procs:
    try:
      outs.append(p.communicate(timeout=120)[0])
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
  for i, (p, out) in enumerate(zip(procs, outs)):
    assert p.returncode == 0 and f'OK {i}' in out, out[-3000:]


# ------------------------------------------------------------------------------------ integrity (checksums, finite)
def _np_fmix32(h):
  h = h.astype(np.uint64)
  m = np.uint64(0xFFFFFFFF)
  h ^= h >> np.uint64(16)
  h = (h * np.uint64(0x85EBCA6B)) & m
  h ^= h >> np.uint64(13)
  h = (h * np.uint64(0xC2B2AE35)) & m
  h ^= h >> np.uint64(16)
  return h


def _np_checksum(arr: np.ndarray) -> str:
  """Independent NumPy version of integrity.py's checksum (raw words, row-major index, murmur3 finaliser)."""
  size = arr.dtype.itemsize
  raw = arr.reshape(-1).view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}[size]).astype(np.uint64)
  idx = np.arange(raw.size, dtype=np.uint64)
  mix = _np_fmix32((idx * np.uint64(2)) & np.uint64(0xFFFFFFFF))
  a = int(_np_fmix32(raw ^ _np_fmix32((mix + np.uint64(1)) & np.uint64(0xFFFFFFFF))).sum() % (1 << 32))
  b = int(_np_fmix32(raw ^ _np_fmix32((mix + np.uint64(2)) & np.uint64(0xFFFFFFFF))).sum() % (1 << 32))
  return f'{a:08x}{b:08x}'


def test_checksums_match_numpy_and_see_one_flipped_bit():
  from grpo_jax.infra import integrity
  rng = np.random.default_rng(0)
  leaves = {'f32': rng.standard_normal((3, 5)).astype(np.float32),
            'bf16': jnp.asarray(rng.standard_normal((4, 2, 3)), jnp.bfloat16),
            'i32': rng.integers(-9, 9, (7,)).astype(np.int32), 'u8': rng.integers(0, 255, (6,)).astype(np.uint8),
            'scalar': np.float32(2.5)}
  summary = integrity.summarize({k: jnp.asarray(v) for k, v in leaves.items()})
  for k, v in leaves.items():
    assert summary[f"['{k}']"] == (_np_checksum(np.asarray(v)), 0), k
  flipped = np.asarray(leaves['bf16']).copy()
  flipped.view(np.uint16)[1, 1, 2] ^= 1 << 3  # one bit of one bf16 value
  assert integrity.summarize({'bf16': jnp.asarray(flipped)})["['bf16']"][0] != summary["['bf16']"][0]
  swapped = leaves['f32'].copy()
  swapped[[0, 1]] = swapped[[1, 0]]  # same values, other places
  assert integrity.summarize({'f32': jnp.asarray(swapped)})["['f32']"][0] != summary["['f32']"][0]
  bad = leaves['f32'].copy()
  bad[0, 0], bad[2, 4] = np.nan, -np.inf
  assert integrity.summarize({'f32': jnp.asarray(bad), 'i': jnp.int32(3)}) ["['f32']"][1] == 2


def test_checksum_pass_needs_no_leaf_sized_temporary():
  """One fused pass per leaf (each leaf type its own program): XLA plans (almost) no temporary memory, so checking a
  state needs no spare copy."""
  from grpo_jax.infra import integrity
  for leaf in (jax.ShapeDtypeStruct((1024, 1024), jnp.float32), jax.ShapeDtypeStruct((4, 512, 512), jnp.bfloat16)):
    compiled = integrity._leaf_summary_jit.lower(leaf).compile()
    assert compiled.memory_analysis().temp_size_in_bytes < 64 * 1024, leaf  # inputs: 4 and 2 MiB


def test_checksums_of_another_tree_of_known_leaf_types_trace_nothing():
  """A run checks several trees of the same leaf types (a stage's state when it saves, its final params, the next
  stage's state, a resumed state): the checksum pass is one program per leaf type, so a tree whose leaf types were
  checked before traces (and compiles) nothing; one program per tree traced and compiled each tree again."""
  from jax import monitoring
  from grpo_jax.infra import integrity
  rng = np.random.default_rng(3)
  params = {'w': jnp.asarray(rng.standard_normal((3, 7)), jnp.float32),
            'e': jnp.asarray(rng.standard_normal((5, 3)), jnp.bfloat16)}
  state = {'params': params, 'mu': jax.tree.map(lambda x: x * 2, params), 'step': jnp.zeros((13,), jnp.int32)}
  first = integrity.summarize(state)
  traced = []

  def listener(event, secs, **kw):
    del secs
    if event.endswith('jaxpr_trace_duration'):
      traced.append(kw.get('fun_name'))
  monitoring.register_event_duration_secs_listener(listener)
  try:
    again = integrity.summarize({'params': params})
    more = integrity.summarize({'ref': params, **state})
  finally:
    monitoring.unregister_event_duration_listener(listener)
  assert traced == [], traced
  assert again == {k: v for k, v in first.items() if k.startswith("['params']")}
  assert {k: v for k, v in more.items() if not k.startswith("['ref']")} == first


_SHARDED_SCRIPT = r'''
def checksums():
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  from grpo_jax.infra import integrity
  x = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
  mesh = jax.make_mesh((4,), ('d',))
  one = integrity.summarize({'x': jnp.asarray(x)})
  four = integrity.summarize({'x': jax.device_put(x, NamedSharding(mesh, P('d')))})
  grid = jax.make_mesh((2, 2), ('a', 'b'))
  two_d = integrity.summarize({'x': jax.device_put(x, NamedSharding(grid, P('a', 'b')))})
  assert one == four == two_d, (one, four, two_d)
  # More leaves than XLA:CPU lets be in flight per device (32), each pass ending in a collective: dispatched all at
  # once they deadlocked (the process aborted after 40 s in an all-gather's rendezvous); a state has ~60 such leaves.
  leaves = {f'w{i}': np.random.default_rng(i).standard_normal((8, 6)).astype(np.float32) for i in range(48)}
  want = integrity.summarize({k: jnp.asarray(v) for k, v in leaves.items()})
  for _ in range(10):  # the old dispatch deadlocked in 1 of 1-20 such calls
    on_grid = {k: jax.device_put(v, NamedSharding(grid, P('a', 'b'))) for k, v in leaves.items()}
    assert integrity.summarize(on_grid) == want
  return {'ok': True}
'''


@pytest.fixture(scope="module")
def four_devices() -> dict:
  """_SHARDED_SCRIPT's and _MESH_SCRIPT's parts, run in ONE subprocess of 4 simulated CPU devices (one Python + JAX +
  grpo_jax start-up instead of two; tests/script_parts.py: each part's result or its traceback under its own key)."""
  import subprocess
  import sys
  env = dict(os.environ, XLA_FLAGS=os.environ['XLA_FLAGS'] + ' --xla_force_host_platform_device_count=4',
             JAX_PLATFORMS='cpu',
             PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  script = _SHARDED_SCRIPT + _MESH_SCRIPT + script_parts.tail({"checksums": "checksums", "mesh": "mesh_change"})
  out = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True, timeout=240)
  assert out.returncode == 0, out.stderr[-3000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_checksums_do_not_depend_on_the_sharding(four_devices):
  """One leaf on 1, 4 and 2x2 devices checksums the same; so do 48 sharded leaves, checked at once (more than
  XLA:CPU's in-flight limit: see sharding.dispatch_bounded)."""
  assert script_parts.part(four_devices, "checksums") == {"ok": True}


def _flip_bytes(step_dir, n=64):
  """Flips n bytes in the middle of the step's largest data file: orbax itself restores it without complaint."""
  files = sorted(glob.glob(os.path.join(step_dir, 'state', '**', 'd', '*'), recursive=True), key=os.path.getsize)
  with open(files[-1], 'r+b') as f:
    data = bytearray(f.read())
    mid = len(data) // 2
    for i in range(mid, mid + n):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(bytes(data))


def _big_state(seed):
  rng = np.random.default_rng(seed)
  return {'params': {'w': jnp.asarray(rng.standard_normal((96, 96)), jnp.float32)},
          'opt': {'nu': jnp.asarray(rng.random((96, 96)), jnp.float32)}, 'step': jnp.int32(seed)}


def test_flipped_bytes_fail_the_checksum_and_fall_back(tmp_path, caplog):
  import orbax.checkpoint as ocp
  states = {s: _big_state(s) for s in (1, 2)}
  _save_steps(tmp_path, states, [1, 2], async_save=False)
  _flip_bytes(str(tmp_path / '2'))
  raw = ocp.StandardCheckpointer().restore(str(tmp_path / '2' / 'state'), abstract_of(states[2]))
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(raw), jax.tree.leaves(states[2])))  # silent
  caplog.set_level(logging.WARNING)
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    restored, meta = ckpt.restore(None, abstract_of(states[2]))
  _assert_bit_identical(restored, states[1])
  assert meta == {'step': 1, 'data_pos': 10}
  assert any('step 2' in r.getMessage() and 'checksum mismatch' in r.getMessage() for r in caplog.records)
  assert os.listdir(tmp_path / checkpoint.CORRUPT_SUBDIR)[0].startswith('2-')


def test_nonfinite_state_is_never_saved_and_a_nonfinite_checkpoint_is_skipped(tmp_path, caplog):
  from grpo_jax.infra import errors
  import orbax.checkpoint as ocp
  good, bad = _big_state(1), _big_state(2)
  bad['opt']['nu'] = bad['opt']['nu'].at[3, 4].set(jnp.nan)
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5, async_save=False) as ckpt:
    assert ckpt.maybe_save(1, good)
    with pytest.raises(errors.RunStopped, match=r"step 2 has non-finite values in \['opt'\]\['nu'\] \(1\).*newest "
                                                r"good checkpoint is step 1"):
      ckpt.maybe_save(2, bad)
    assert ckpt.all_steps() == [1]
  # A checkpoint written without checksums (an older version) that holds a NaN is skipped like damage.
  with ocp.CheckpointManager(tmp_path) as mngr:
    mngr.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(bad), meta=ocp.args.JsonSave({'step': 3})))
  caplog.set_level(logging.WARNING)
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    restored, meta = ckpt.restore(None, abstract_of(good))
  assert meta == {'step': 1}
  _assert_bit_identical(restored, good)
  msgs = [r.getMessage() for r in caplog.records]
  assert any('step 3' in m and 'no checksums' in m for m in msgs)
  assert any('step 3' in m and 'non-finite values' in m for m in msgs)


def test_changed_shapes_are_a_config_error_not_damage(tmp_path):
  from grpo_jax.infra import errors
  state = _big_state(1)
  _save_steps(tmp_path, {1: state}, [1], async_save=False)
  other = dict(state, params={'w': jnp.zeros((64, 96), jnp.float32)})
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    with pytest.raises(errors.InputError, match=r"params.w is saved with shape \(96, 96\) but the config builds "
                                                r"\(64, 96\).*Nothing was moved"):
      ckpt.restore(None, abstract_of(other))
    with pytest.raises(errors.InputError, match=r"lacks params.v"):
      ckpt.restore(None, abstract_of(dict(state, params={'w': state['params']['w'], 'v': jnp.ones(2)})))
  assert os.listdir(tmp_path) == ['1']  # the good checkpoint stays where it is


def test_rotation_keeps_the_newest_known_good(tmp_path):
  """keep=1, but the newest checkpoints carry no checksums (unknown): the newest good one is not deleted."""
  states = {s: _big_state(s) for s in range(1, 5)}
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=1, async_save=True) as ckpt:
    for s in (1, 2):
      ckpt.maybe_save(s, states[s])
    ckpt.wait()
    assert ckpt.all_steps() == [2]  # plain rotation: keep the newest
  for s in (3, 4):  # written by an older version: no integrity record
    import orbax.checkpoint as ocp
    with ocp.CheckpointManager(tmp_path) as mngr:
      mngr.save(s, args=ocp.args.Composite(state=ocp.args.StandardSave(states[s]),
                                           meta=ocp.args.JsonSave({'step': s})))
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=1) as ckpt:
    ckpt.wait()
    assert ckpt.newest_good() == 2
    assert ckpt.all_steps() == [2, 4]


def test_a_step_from_a_newer_version_is_refused_not_set_aside(tmp_path, states):
  """A step whose checksums use an algorithm this version does not know (a newer grpo_jax wrote it) mismatched on
  every leaf: it was moved to corrupt/ as damaged and the run went on from the step before. Now one InputError naming
  the step and the fix; nothing is moved."""
  _save_steps(tmp_path, states, [1, 2], async_save=False)
  path = tmp_path / '2' / 'meta' / 'metadata'
  meta = json.loads(path.read_text())
  meta['integrity'] = {**meta['integrity'], 'algo': 'fmix64-sum-v2'}
  path.write_text(json.dumps(meta))
  with checkpoint.Checkpointer(tmp_path, save_every=1, keep=5) as ckpt:
    for step in (None, 2):
      with pytest.raises(errors.InputError, match=r"step 2 .* written with checksums 'fmix64-sum-v2', which this "
                                                  r"version does not know .* a newer grpo_jax wrote it"):
        ckpt.restore(step, abstract_of(states[2]))
  assert sorted(os.listdir(tmp_path)) == ['1', '2']


_MESH_SCRIPT = r'''
def mesh_change():
  import logging, sys, tempfile
  import jax, jax.numpy as jnp, numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P
  from grpo_jax.infra import checkpoint
  records = []
  class Keep(logging.Handler):
    def emit(self, record):
      records.append(record.getMessage())
  logging.getLogger().addHandler(Keep()); logging.getLogger().setLevel(logging.WARNING)
  def on(mesh, x):
    return jax.device_put(x, NamedSharding(mesh, P('data')))
  four, one = jax.make_mesh((4,), ('data',)), jax.make_mesh((1,), ('data',), devices=jax.devices()[:1])
  w = np.arange(32, dtype=np.float32).reshape(8, 4)
  d = tempfile.mkdtemp()
  with checkpoint.Checkpointer(d, save_every=1, keep=2) as ck:
    ck.maybe_save(1, {'w': on(four, w)}, {'step': 1})
  for mesh, warned in ((four, False), (one, True)):
    records.clear()
    with checkpoint.Checkpointer(d, save_every=1, keep=2) as ck:
      target = {'w': jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=NamedSharding(mesh, P('data')))}
      state, meta = ck.restore(None, target)
    assert meta == {'step': 1}, meta
    np.testing.assert_array_equal(np.asarray(state['w']), w)
    said = [r for r in records if 'saved on the mesh' in r]
    assert bool(said) == warned, (mesh.shape, records)
    if warned:
      assert "{'data': 4} (4 devices) and resumes on {'data': 1} (1 devices)" in said[0], said
      assert 'to rounding' in said[0], said
  return {'ok': True}
'''


def test_a_resume_on_another_mesh_says_it_is_not_bit_identical(four_devices):
  """A step saved on 4 devices restores on 1 (the state resharded: values equal) with one warning naming both meshes
  and that the run then equals an uninterrupted one only to rounding; on the mesh it was saved on, no warning. (It
  resumed silently: another program, whose Adam moments were 1e-9 away from the uninterrupted run's after 3 steps.)"""
  assert script_parts.part(four_devices, "mesh") == {"ok": True}
