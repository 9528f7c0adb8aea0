"""Checkpoints: orbax `CheckpointManager` over (state pytree, small JSON metadata), verified on restore.

Layout of `directory` (orbax's): `<step>/state` (the state pytree, `StandardSave`), `<step>/meta` (JSON dict with
at least `step`, the data-iterator position; `config`, the run-config view that wrote it, see run_config.py; and
`integrity`, a checksum per leaf computed on the devices, see integrity.py), `<step>/commit_success.txt` (orbax's
commit marker). A step is used only if it restores, its metadata names its own step, its checksums match and
every value in it is finite; otherwise it is moved to `directory/corrupt/<step>-<unix time>` (so that orbax neither
lists it nor refuses to save at its step again) and the previous step is tried. A step whose saved shapes differ
from the state the config builds is not damage: restoring it raises an InputError (the config changed) and moves
nothing. A state with non-finite values is never saved (RunStopped), and rotation keeps the newest `keep` steps
plus, always, the newest step known good (saved with checksums from a finite state) and, for every held-out metric
the steps' metadata record under `best` (the run's `train.keep_best`), the step best on it so far (and, there,
any step whose metadata does not read: it may be that best). Temporary dirs of saves killed mid-way are removed on
open.

Every function here must be called on all processes (orbax runs the collectives and lets one host write). A step
one process cannot read (each reads only its own shards) is unusable on every process (`read_agreed`).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any, Callable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from grpo_jax.infra import errors
from grpo_jax.infra import integrity

STATE = 'state'
_META = 'meta'
# A LoRA state's frozen base (rl/state.py): never saved, rebuilt by the caller; the checkpoint records its identity
# (source and checksum) and a resume onto another base is refused (`Checkpointer.set_frozen`).
FROZEN = 'base'
# A step saved at a held-out evaluation under train.keep_best records {metric, mode, value} under this meta key;
# value None: the metric was not finite (the step is no candidate).
BEST = 'best'
BEST_MODES = ('max', 'min')
# The mesh a step was saved from ({axis: size}): a resume on another one reshards the state and runs another program,
# whose reductions split differently, so it equals an uninterrupted run only to rounding: said in a warning.
MESH = 'mesh'
COMMIT_MARKER = 'commit_success.txt'  # orbax writes it into every finished step dir (rename and commit-file modes)
CORRUPT_SUBDIR = 'corrupt'


def as_path(directory: str | os.PathLike) -> epath.Path:
  """Orbax wants absolute paths; gs:// and other URIs pass through."""
  text = os.fspath(directory)
  return epath.Path(text if '://' in text else os.path.abspath(text))


def check_abstract(tree: Any, what: str) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    sharding = getattr(leaf, 'sharding', None)
    if sharding is None or isinstance(getattr(sharding, 'mesh', None), jax.sharding.AbstractMesh):
      raise ValueError(
          f'{what}{jax.tree_util.keystr(path)} has no concrete sharding ({sharding}); pass jax.ShapeDtypeStruct('
          'shape, dtype, sharding=NamedSharding(mesh, spec)) leaves (state.with_shardings(*family.state_spec(...)), '
          'or eval_shape + shardings from the logical rules).')


def _jsonable_meta(step: int, meta: Mapping[str, Any] | None) -> dict[str, Any]:
  out = {'step': int(step)}
  for key, value in (meta or {}).items():
    if isinstance(value, (np.generic, np.ndarray, jax.Array)) and np.ndim(value) == 0:
      value = np.asarray(value).item()  # numpy/jax scalars are common here and json rejects them
    try:
      json.dumps(value)
    except TypeError as e:
      raise ValueError(f'meta[{key!r}] is not JSON-serializable ({e}); store ints, floats, strings, lists '
                       'or dicts') from None
    out[key] = value
  if out['step'] != int(step):  # restore() refuses a step whose metadata names another one
    raise ValueError(f"meta['step']={out['step']!r} differs from the step saved, {step}; leave it out (it is set)")
  return out


def mesh_of(tree: Any) -> dict[str, int] | None:
  """{axis: size} of the mesh the first leaf of `tree` with a NamedSharding lies on (arrays or abstract leaves)."""
  for leaf in jax.tree.leaves(tree):
    mesh = getattr(getattr(leaf, 'sharding', None), 'mesh', None)
    if mesh is not None and getattr(mesh, 'shape', None):
      return {str(k): int(v) for k, v in mesh.shape.items()}
  return None


def step_dirs(directory: epath.Path) -> tuple[list[int], list[int]]:
  """(committed, uncommitted) step numbers, oldest first; uncommitted dirs are partial writes."""
  committed, uncommitted = [], []
  if directory.exists():
    for child in directory.iterdir():
      if child.name.isdigit() and child.is_dir():
        (committed if (child / COMMIT_MARKER).exists() else uncommitted).append(int(child.name))
  return sorted(committed), sorted(uncommitted)


def _committed_steps(directory: epath.Path) -> list[int]:
  return step_dirs(directory)[0]


def all_committed_steps(directory: str | os.PathLike) -> list[int]:
  """Committed step numbers in a checkpoint directory, oldest first ([] if it does not exist)."""
  return _committed_steps(as_path(directory))


def read_json(path: epath.Path) -> dict | None:
  try:
    value = json.loads(path.read_text())
    return value if isinstance(value, dict) else None
  except (OSError, ValueError):
    return None


def read_meta(directory: str | os.PathLike, step: int) -> dict | None:
  """A committed step's JSON metadata without restoring anything (None if unreadable)."""
  return read_json(as_path(directory) / str(step) / _META / 'metadata')


def newest_meta(directory: str | os.PathLike) -> tuple[int, dict] | None:
  """(step, meta) of the newest committed step whose metadata reads: what a resume will compare its config with."""
  for step in reversed(_committed_steps(as_path(directory))):
    meta = read_meta(directory, step)
    if meta is not None:
      return step, meta
  return None


def best_record(metric: str, mode: str, value: Any) -> dict[str, Any]:
  """The `best` metadata of a step evaluated on `metric`: a non-finite value is kept as None (no candidate)."""
  value = float(value)
  return {'metric': metric, 'mode': mode, 'value': value if np.isfinite(value) else None}


def _best_records(directory: str | os.PathLike) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
  """(committed_best_records, the committed steps whose metadata does not read: any of them may hold the best)."""
  records, unreadable = [], []
  for step in _committed_steps(as_path(directory)):
    meta = read_meta(directory, step)
    if meta is None:
      unreadable.append(step)
      continue
    rec = meta.get(BEST)
    if isinstance(rec, dict) and rec.get('mode') in BEST_MODES and isinstance(rec.get('metric'), str):
      records.append((step, rec))
  return records, unreadable


def committed_best_records(directory: str | os.PathLike) -> list[tuple[int, dict[str, Any]]]:
  """(step, `best` record) of every committed step that records a held-out score, oldest first."""
  return _best_records(directory)[0]


def best_of(records, metric: str, mode: str) -> tuple[int, dict[str, Any]] | None:
  """The (step, record) of `records` best on `metric` under `mode` (ties: the earlier), None if none is finite."""
  sign, best = (1.0 if mode == 'max' else -1.0), None
  for step, rec in records:
    value = rec.get('value')
    if rec['metric'] != metric or rec['mode'] != mode or isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    if best is None or sign * value > sign * best[1]['value']:  # strict: a tie keeps the earlier step
      best = (step, rec)
  return best


def best_step(directory: str | os.PathLike, metric: str | None = None,
              mode: str | None = None) -> tuple[int, dict[str, Any]] | None:
  """(step, its `best` record) of the committed step whose recorded held-out `metric` is best under `mode` (max or
  min; ties: the earliest step), among the steps recording that metric and mode; None if none does. `metric`/`mode`
  None: those of the newest step that records one (what the run keeps now, if train.keep_best changed). InputError
  when a committed step's metadata does not read: it may be the best, so another step is never named in its place."""
  records, unreadable = _best_records(directory)
  if unreadable:
    raise errors.InputError(
        f'checkpoint step(s) {unreadable} in {as_path(directory)} have metadata that does not read, so which step is '
        'best cannot be told (one of them may be): export a step by its number (--step), or move the damaged '
        f'step(s) aside (into {as_path(directory) / CORRUPT_SUBDIR}) to choose among the others.')
  if not records:
    return None
  return best_of(records, records[-1][1]['metric'] if metric is None else metric,
                  records[-1][1]['mode'] if mode is None else mode)


def kept_best_steps(directory: str | os.PathLike) -> set[int]:
  """The best step of every (metric, mode) the steps record: rotation never deletes one, even after train.keep_best
  changed or was turned off on resume (a kept best is removed by hand, not by a bookkeeping key). Where steps record
  scores, a step whose metadata does not read is kept too: it may be the best (which step is, cannot be told)."""
  records, unreadable = _best_records(directory)
  kinds = {(rec['metric'], rec['mode']) for _, rec in records}
  kept = {best[0] for best in (best_of(records, *kind) for kind in kinds) if best is not None}
  return kept | set(unreadable) if records else kept


def agreed_failure(why: str | None) -> str | None:
  """Why a step does not read on this process (None: it read), made the same on every process (a collective: call
  it on every process at the same point)."""
  if jax.process_count() == 1:
    return why
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  failed = np.asarray(multihost_utils.process_allgather(np.int32(why is not None)))
  if why is None and failed.any():
    why = f'process(es) {np.nonzero(failed)[0].tolist()} could not read it (their warnings say why)'
  return why


def restore_barrier(checkpointer: Any) -> str:
  """The barrier an orbax Checkpointer's restore ends with (a sync_global_devices: a collective), by its key prefix:
  None for a synchronous checkpointer, '' for an asynchronous one (orbax 0.12; tests/test_checkpoint.py's
  two-process test reads one of each way)."""
  return ocp.multihost.unique_barrier_key('Checkpointer:restore',
                                          prefix=getattr(checkpointer, '_barrier_sync_key_prefix', None))


def read_agreed(read: Callable[[], Any], barrier: str) -> tuple[Any, str | None]:
  """(read(), None), or (None, why) on every process when the read raised on any: each process reads only its own
  shards, so one can fail (a damaged file only it reads) where the others succeed. They then waited in the barrier
  orbax ends a restore with (`barrier`, restore_barrier), and went on to verify the step (collectives) while the
  failed one tried an older step: its collectives met theirs, the job hung. The failed process joins that barrier,
  then all learn why."""
  try:
    return read(), agreed_failure(None)
  except Exception as e:  # pylint: disable=broad-except  # any read error means "this step is unusable"
    why = errors.root_cause(e)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices(barrier)
    return None, agreed_failure(why)


def _leaf_name(path) -> str:
  """Orbax's leaf name for a tree path: keys joined by '.' (dict keys, attribute names, sequence indices)."""
  parts = []
  for k in path:
    parts.append(str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k)))))
  return '.'.join(parts)


def saved_shape(directory: str | os.PathLike, step: int, name: str) -> tuple[int, ...] | None:
  """The shape leaf `name` (e.g. 'carry.next_D') of `step`'s state was saved with; None: no such leaf, or the
  metadata does not read (restore() then reports or falls back)."""
  try:
    tree = ocp.PyTreeCheckpointHandler().metadata(as_path(directory) / str(step) / STATE).tree
  except Exception:  # pylint: disable=broad-except  # unreadable metadata is damage: restore() falls back
    return None
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    if (getattr(leaf, 'name', None) or _leaf_name(path)) == name:
      shape = getattr(leaf, 'shape', None)
      return None if shape is None else tuple(shape)
  return None


def _structure_mismatch(saved_tree: Any, abstract_state: Any) -> str | None:
  """First difference between a step's saved leaves (orbax metadata) and the state the config builds, or None."""
  saved = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(saved_tree)[0]:
    name = getattr(leaf, 'name', None) or _leaf_name(path)
    saved[name] = leaf
  want = {_leaf_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
  missing, extra = sorted(set(want) - set(saved)), sorted(set(saved) - set(want))
  if missing or extra:
    return (f'the checkpoint {"lacks " + ", ".join(missing[:3]) if missing else ""}'
            f'{" and " if missing and extra else ""}{"has extra " + ", ".join(extra[:3]) if extra else ""}')
  for name, x in want.items():
    shape = getattr(saved[name], 'shape', None)
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
      continue  # saved as its key data, whose trailing shape depends on the PRNG implementation
    if shape is not None and tuple(shape) != tuple(x.shape):
      return f'{name} is saved with shape {tuple(shape)} but the config builds {tuple(x.shape)}'
  return None


class Checkpointer:
  """Saves every `save_every` steps, keeps the newest `keep` (and the newest known-good), restores the newest step
  that loads and verifies. `run_config`: the run-config view stored in every step's metadata; `meta`: entries every
  step's caller meta starts from."""

  def __init__(self, directory: str | os.PathLike, *, save_every: int, keep: int, async_save: bool = True,
               run_config: Mapping[str, Any] | None = None, meta: Mapping[str, Any] | None = None,
               best: tuple[str, str] | None = None):
    if save_every < 1:
      raise errors.ConfigError(f'config.train.ckpt_every: save_every={save_every} must be >= 1')
    if keep < 1:
      raise errors.ConfigError(f'config.train.keep_checkpoints: keep={keep} must be >= 1')
    self.directory = as_path(directory)
    self.save_every = save_every
    self.keep = keep
    if best is not None and best[1] not in BEST_MODES:
      raise errors.ConfigError(f'config.train.keep_best_mode: {best[1]!r} is not one of {BEST_MODES}')
    self.best = best  # (metric, mode) of train.keep_best: the caller records it with each evaluated save
    self.run_config = dict(run_config) if run_config is not None else None
    self.meta = dict(meta or {})  # stored with every step, under the meta each save passes (restored_meta has it)
    self.restored_config: dict | None = None  # the run config stored with the step `restore` returned
    self.restored_meta: dict[str, Any] = {}  # the caller's meta of the step `restore` returned ({}: none restored)
    self._frozen: tuple[Any, dict[str, str]] | None = None  # (the live frozen base, its identity): set_frozen
    self._manager = None
    self._warned_unreadable: set[int] = set()  # steps rotation keeps because their metadata does not read (_rotate)
    # the steps opening and restoring skipped and moved aside, by metric (run/loop_guard.py writes them to
    # metrics.jsonl at the step the run goes on from): each fallback logged where it happens and counted
    self.skipped = {'ckpt/partial_skipped': 0, 'ckpt/unusable_skipped': 0}
    _, partial = step_dirs(self.directory)
    if jax.process_count() > 1:  # all processes list before process 0 moves anything, so they agree on `partial`
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices('grpo_jax.infra.checkpoint.listed')
    if partial:  # a save that crashed before its commit (commit-file mode on GCS): orbax would list and keep it
      for step in partial:
        logging.warning('checkpoint step %d in %s has no %s (partial write); moving it aside', step,
                        self.directory, COMMIT_MARKER)
      self._quarantine(partial)
      self.skipped['ckpt/partial_skipped'] += len(partial)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=None, save_interval_steps=1, enable_async_checkpointing=async_save, create=True,
            cleanup_tmp_directories=True),  # rotation is ours (_rotate): it must know which step is good
    )
    self._restore_barrier = restore_barrier(getattr(self._manager, '_checkpointer', None))

  def set_frozen(self, source: str, base: Any) -> None:
    """The state's frozen entry (FROZEN: a LoRA run's base) that saves leave out and restores put back; `source`
    (a path, or how it was made) and a checksum of its values identify it in every step's metadata."""
    digest = integrity.digest(integrity.summarize(base))
    self._frozen = (base, {'source': source, 'checksum': digest})

  def _unfrozen(self, state: Any) -> Any:
    if not (isinstance(state, Mapping) and FROZEN in state):
      return state
    if self._frozen is None:
      raise ValueError(f'the state has a frozen {FROZEN!r} entry: call Checkpointer.set_frozen(source, base) first.')
    return {k: v for k, v in state.items() if k != FROZEN}

  def _check_frozen(self, step: int, meta: Mapping[str, Any]) -> None:
    saved, (_, mine) = meta.get(FROZEN) or {}, self._frozen
    if saved.get('checksum') != mine['checksum']:
      raise errors.InputError(
          f'checkpoint step {step} in {self.directory} trained adapters on base {saved.get("source", "?")!r} '
          f'(checksum {saved.get("checksum", "none")}), but this run\'s base {mine["source"]!r} has checksum '
          f'{mine["checksum"]}: resume with the same base (train.init_from), or use a new --workdir.')

  def maybe_save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Saves when `step % save_every == 0` or `force`; returns whether it saved. `state`: the state, or a function
    returning it, called only when this saves (train.Program.saved_state: a vmapped run's slice of its group).

    With `async_save` the device->host copy finishes before this returns, so the caller may donate `state`
    to the next step right away; the disk write runs in the background (see `wait`). A state with a non-finite
    value anywhere raises errors.RunStopped and is not saved (the newest good step stays the newest).
    """
    if not (force or step % self.save_every == 0):
      return False
    self._manager.wait_until_finished()  # the previous save is committed before rotation looks at the steps
    self._rotate()
    if step in self._manager.all_steps():
      return False  # e.g. the final forced save on a step the periodic rule already saved
    state = self._unfrozen(state() if callable(state) else state)
    summary = integrity.summarize(state)
    bad = integrity.nonfinite(summary)
    if bad:
      good = self.newest_good()
      raise errors.RunStopped(
          f'the state at step {step} has non-finite values in {integrity.describe(bad)}; it was not saved. '
          + (f'The newest good checkpoint is step {good} in {self.directory}. ' if good is not None else '')
          + 'Lower optim.lr or check the rewards; rerunning resumes from the good checkpoint.')
    full_meta = {**self.meta, **(meta or {})}
    full_meta['integrity'] = integrity.record(summary)
    mesh = mesh_of(state)
    if mesh is not None:
      full_meta[MESH] = mesh
    if self.run_config is not None:
      full_meta['config'] = self.run_config
    if self._frozen is not None:
      full_meta[FROZEN] = self._frozen[1]
    self._manager.save(
        step,
        args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(state),
                                   _META: ocp.args.JsonSave(_jsonable_meta(step, full_meta))}),
        force=True)
    return True

  def latest_step(self) -> int | None:
    """Newest committed step (its content may still be corrupt; `restore` checks that)."""
    self.wait()
    steps = _committed_steps(self.directory)
    return steps[-1] if steps else None

  def all_steps(self) -> list[int]:
    self.wait()
    return _committed_steps(self.directory)

  def newest_good(self) -> int | None:
    """Newest committed step saved with checksums (only finite states are saved with them)."""
    for step in reversed(_committed_steps(self.directory)):
      if 'integrity' in (read_meta(self.directory, step) or {}):
        return step
    return None

  def _rotate(self) -> None:
    steps = sorted(self._manager.all_steps())
    if len(steps) <= self.keep:
      return
    keep = set(steps[-self.keep:])
    good = self.newest_good()
    if good is not None:
      keep.add(good)
    best = kept_best_steps(self.directory)
    for step in sorted(best - keep - self._warned_unreadable):
      if read_meta(self.directory, step) is None:  # logged once per step, counted nowhere: nothing is dropped
        self._warned_unreadable.add(step)
        logging.warning('checkpoint step %d in %s is kept by rotation: its metadata does not read, so whether it is '
                        'the best on a recorded held-out metric cannot be told; move it aside by hand if it is not',
                        step, self.directory)
    keep |= best
    for step in steps:
      if step not in keep:
        self._manager.delete(step)

  def _verify(self, step: int, state: Any, meta: Mapping[str, Any]) -> str | None:
    """Why the restored `state` of `step` must not be used (None = fine): metadata naming another step (the
    checksums cover the state, not the JSON: a flipped digit there resumed with another data position and step
    count, silently), a checksum mismatch or a non-finite value."""
    if not isinstance(meta, Mapping):
      return f'its metadata is a {type(meta).__name__}, not a JSON object'
    if meta.get('step') != step:
      return f'its metadata says step {meta.get("step")!r}, its directory {step}'
    summary = integrity.summarize(state)
    stored = meta.get('integrity')
    if stored is None:
      logging.warning('checkpoint step %d in %s has no checksums (written by an older version); checking only that '
                      'its values are finite', step, self.directory)
    else:
      wrong = integrity.mismatches(stored, summary)
      if wrong:
        return f'checksum mismatch in {", ".join(wrong[:3])}{" and more" if len(wrong) > 3 else ""}'
    bad = integrity.nonfinite(summary)
    if bad:
      return f'non-finite values in {integrity.describe(bad)}'
    return None

  def _check_structure(self, step: int, abstract_state: Any) -> None:
    """InputError if `step` was saved from a differently shaped state (a changed config, not damage)."""
    try:
      tree = ocp.PyTreeCheckpointHandler().metadata(self.directory / str(step) / STATE).tree
    except Exception:  # pylint: disable=broad-except  # unreadable metadata is damage: restore() falls back
      return
    why = _structure_mismatch(tree, abstract_state)
    if why:
      raise errors.InputError(
          f'checkpoint step {step} in {self.directory} does not fit the state this config builds: {why}. The '
          'config changed since it was written (model, critic, optimizer or reference): restore that config, or '
          'use a new --workdir. Nothing was moved or deleted.')

  def _check_format(self, step: int) -> None:
    """InputError if `step` was written by a newer version (a checksum algorithm this one does not know): its
    checksums would all mismatch and a good step would be set aside as damaged."""
    stored = (read_meta(self.directory, step) or {}).get('integrity')
    algo = stored.get('algo') if isinstance(stored, dict) else None
    if isinstance(algo, str) and algo != integrity.ALGO:
      raise errors.InputError(
          f'checkpoint step {step} in {self.directory} was written with checksums {algo!r}, which this version '
          f'does not know (it writes {integrity.ALGO!r}): a newer grpo_jax wrote it; resume with that version, or '
          'use a new --workdir. Nothing was moved or deleted.')

  def _split_meta(self, meta: Mapping[str, Any], abstract_state: Any = None) -> dict[str, Any]:
    """The caller's meta; the stored run config goes to `self.restored_config` (None if the step predates it)."""
    meta = dict(meta)
    meta.pop('integrity', None)
    saved, now = meta.pop(MESH, None), mesh_of(abstract_state)
    if isinstance(saved, dict) and now is not None and saved != now:
      logging.warning('checkpoint step %s in %s was saved on the mesh %s (%d devices) and resumes on %s (%d devices): '
                      'the state is resharded and the step runs as another program, so the run equals an '
                      'uninterrupted one only to rounding (bit for bit on the devices it was saved on)',
                      meta.get('step'), self.directory, saved, int(np.prod(list(saved.values()))), now,
                      int(np.prod(list(now.values()))))
    if self._frozen is not None:
      self._check_frozen(int(meta.get('step', -1)), meta)
    meta.pop(FROZEN, None)
    self.restored_config = meta.pop('config', None)
    self.restored_meta = dict(meta)
    return meta

  def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restores into `abstract_state`'s shardings; `step=None` = newest step that loads and verifies. A frozen
    entry (set_frozen) is not read: its identity is checked against the step's and the live one put back."""
    if isinstance(abstract_state, Mapping) and FROZEN in abstract_state:
      state, meta = self.restore(step, self._unfrozen(abstract_state))
      return {**state, FROZEN: self._frozen[0]}, meta
    check_abstract(abstract_state, 'abstract_state')
    self.wait()
    args = ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract_state), _META: ocp.args.JsonRestore()})
    if step is not None:
      if step not in _committed_steps(self.directory):
        raise ValueError(f'step={step} is not a committed checkpoint in {self.directory}; '
                         f'available: {_committed_steps(self.directory)}')
      self._check_structure(step, abstract_state)
      self._check_format(step)
      restored, why = read_agreed(functools.partial(self._manager.restore, step, args=args), self._restore_barrier)
      why = why or self._verify(step, restored[STATE], restored[_META])
      if why:
        raise errors.InputError(f'checkpoint step {step} in {self.directory} is damaged ({why}); restore an older '
                                'step (step=None falls back automatically)')
      return restored[STATE], self._split_meta(restored[_META], abstract_state)
    steps, partial = step_dirs(self.directory)
    for step_ in partial:
      logging.warning('checkpoint step %d in %s has no %s (partial write); skipping it', step_, self.directory,
                      COMMIT_MARKER)
    if not steps and not partial:
      raise ValueError(f'no checkpoint in {self.directory}; check latest_step() is not None before restoring, '
                       'or start a fresh run with a new --workdir')
    bad = []
    for candidate in reversed(steps):
      self._check_structure(candidate, abstract_state)
      self._check_format(candidate)
      restored, why = read_agreed(functools.partial(self._manager.restore, candidate, args=args),
                                  self._restore_barrier)
      if not why:
        try:
          why = self._verify(candidate, restored[STATE], restored[_META])
        except Exception as e:  # pylint: disable=broad-except
          why = errors.root_cause(e)
      if why:
        logging.warning('checkpoint step %d in %s is unusable (%s); falling back to an older step', candidate,
                        self.directory, why)
        bad.append(candidate)
        continue
      if bad or partial:
        self._quarantine(bad + partial)
        self.skipped['ckpt/unusable_skipped'] += len(bad)
        self.skipped['ckpt/partial_skipped'] += len(partial)
      return restored[STATE], self._split_meta(restored[_META], abstract_state)
    raise errors.InputError(
        f'no restorable checkpoint in {self.directory}: steps {steps + partial} all failed to load or verify (see the '
        f'warnings above); move them away (e.g. into {self.directory / CORRUPT_SUBDIR}) to restart from scratch, or '
        'restore from a backup')

  def _quarantine(self, steps: list[int]) -> None:
    """Moves unloadable steps aside: orbax would otherwise refuse saves at or below them and count them in keep."""
    if jax.process_index() == 0:
      target = self.directory / CORRUPT_SUBDIR
      target.mkdir(parents=True, exist_ok=True)
      for step in steps:
        dest = target / f'{step}-{int(time.time())}'
        (self.directory / str(step)).rename(dest)
        logging.warning('moved unloadable checkpoint step %d to %s', step, dest)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices('grpo_jax.infra.checkpoint.quarantine')
    if self._manager is not None:
      self._manager.reload()

  def wait(self) -> None:
    """Blocks until pending async saves are on disk, then applies the retention rule."""
    self._manager.wait_until_finished()
    self._rotate()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._rotate()
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()




class NoCheckpoints:
  """The checkpointer of a scratch run, whose directory is deleted when the run ends and which no resume reads (an
  ablation table's seeds: a table resumes by cell, from DIR/cells/<variant>.json, and reruns an unfinished cell from
  its start; studies/ablations/train_table.train_seeds): it saves nothing. What a Checkpointer gave such a run was an
  end checkpoint written only to be deleted, its state's checksums compiled and computed first (~1-2 s a cell).
  The interface train.rl_loop and loop_guard.LoopGuard use of a Checkpointer; nothing is ever restored."""
  best = None  # no train.keep_best record: nothing is kept

  def __init__(self, directory: str | os.PathLike):
    self.directory = as_path(directory)
    self.meta: dict[str, Any] = {}
    self.restored_config: dict | None = None
    self.restored_meta: dict[str, Any] = {}
    self.skipped = {'ckpt/partial_skipped': 0, 'ckpt/unusable_skipped': 0}

  def maybe_save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    del step, state, meta, force
    return False

  def latest_step(self) -> int | None:
    return None

  def all_steps(self) -> list[int]:
    return []

  def wait(self) -> None:
    pass

  def close(self) -> None:
    pass
