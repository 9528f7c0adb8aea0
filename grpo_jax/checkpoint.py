"""Checkpoints: orbax `CheckpointManager` over (state pytree, small JSON metadata), with corrupt-step fallback.

Layout of `directory` (orbax's): `<step>/state` (the state pytree, `StandardSave`), `<step>/meta` (JSON dict with
at least `step`, the data-iterator position), `<step>/commit_success.txt` (orbax's commit marker). Steps that a
fallback skipped, and uncommitted step dirs found when a `Checkpointer` opens, are moved to
`directory/corrupt/<step>-<unix time>` so that orbax neither lists them nor refuses to save at their step again.

Every function here must be called on all processes (orbax runs the collectives and lets one host write).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

_STATE = 'state'
_META = 'meta'
_COMMIT_MARKER = 'commit_success.txt'  # orbax writes it into every finished step dir (rename and commit-file modes)
CORRUPT_SUBDIR = 'corrupt'


def _path(directory: str | os.PathLike) -> epath.Path:
  """Orbax wants absolute paths; gs:// and other URIs pass through."""
  text = os.fspath(directory)
  return epath.Path(text if '://' in text else os.path.abspath(text))


def abstract_of(tree: Any) -> Any:
  """Abstract twin of a concrete (sharded) pytree: the `abstract_state` that `restore` wants."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _check_abstract(tree: Any, what: str) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    sharding = getattr(leaf, 'sharding', None)
    if sharding is None or isinstance(getattr(sharding, 'mesh', None), jax.sharding.AbstractMesh):
      raise ValueError(
          f'{what}{jax.tree_util.keystr(path)} has no concrete sharding ({sharding}); pass jax.ShapeDtypeStruct('
          'shape, dtype, sharding=NamedSharding(mesh, spec)) leaves (checkpoint.abstract_of(state), or eval_shape '
          '+ shardings from the logical rules).')


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
  return out


def _step_dirs(directory: epath.Path) -> tuple[list[int], list[int]]:
  """(committed, uncommitted) step numbers, oldest first; uncommitted dirs are partial writes."""
  committed, uncommitted = [], []
  if directory.exists():
    for child in directory.iterdir():
      if child.name.isdigit() and child.is_dir():
        (committed if (child / _COMMIT_MARKER).exists() else uncommitted).append(int(child.name))
  return sorted(committed), sorted(uncommitted)


def _committed_steps(directory: epath.Path) -> list[int]:
  return _step_dirs(directory)[0]


class Checkpointer:
  """Saves every `save_every` steps, keeps the newest `keep`, restores the newest step that loads."""

  def __init__(self, directory: str | os.PathLike, *, save_every: int, keep: int, async_save: bool = True):
    if save_every < 1:
      raise ValueError(f'save_every={save_every} must be >= 1 (config.train.ckpt_every)')
    if keep < 1:
      raise ValueError(f'keep={keep} must be >= 1 (config.train.keep_checkpoints)')
    self.directory = _path(directory)
    self.save_every = save_every
    self._manager = None
    _, partial = _step_dirs(self.directory)
    if jax.process_count() > 1:  # all processes list before process 0 moves anything, so they agree on `partial`
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices('grpo_jax.checkpoint.listed')
    if partial:  # a save that crashed before its commit (commit-file mode on GCS): orbax would list and keep it
      for step in partial:
        logging.warning('checkpoint step %d in %s has no %s (partial write); moving it aside', step,
                        self.directory, _COMMIT_MARKER)
      self._quarantine(partial)
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep, save_interval_steps=1, enable_async_checkpointing=async_save, create=True),
    )

  def maybe_save(self, step: int, state: Any, meta: Mapping[str, Any] | None = None, force: bool = False) -> bool:
    """Saves when `step % save_every == 0` or `force`; returns whether it saved.

    With `async_save` the device->host copy finishes before this returns, so the caller may donate `state`
    to the next step right away; the disk write runs in the background (see `wait`).
    """
    if not (force or step % self.save_every == 0):
      return False
    if step in self._manager.all_steps():
      return False  # e.g. the final forced save on a step the periodic rule already saved
    self._manager.save(
        step,
        args=ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state),
                                   _META: ocp.args.JsonSave(_jsonable_meta(step, meta))}),
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

  def restore(self, step: int | None, abstract_state: Any) -> tuple[Any, dict[str, Any]]:
    """Restores into `abstract_state`'s shardings; `step=None` = newest step that loads, skipping bad ones."""
    _check_abstract(abstract_state, 'abstract_state')
    self.wait()
    args = ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract_state), _META: ocp.args.JsonRestore()})
    if step is not None:
      if step not in _committed_steps(self.directory):
        raise ValueError(f'step={step} is not a committed checkpoint in {self.directory}; '
                         f'available: {_committed_steps(self.directory)}')
      restored = self._manager.restore(step, args=args)
      return restored[_STATE], dict(restored[_META])
    steps, partial = _step_dirs(self.directory)
    for step_ in partial:
      logging.warning('checkpoint step %d in %s has no %s (partial write); skipping it', step_, self.directory,
                      _COMMIT_MARKER)
    if not steps and not partial:
      raise ValueError(f'no checkpoint in {self.directory}; check latest_step() is not None before restoring, '
                       'or start a fresh run with a new --workdir')
    bad = []
    for candidate in reversed(steps):
      try:
        restored = self._manager.restore(candidate, args=args)
      except Exception as e:  # pylint: disable=broad-except  # any read error means "this step is unusable"
        logging.warning('checkpoint step %d in %s failed to restore (%s: %s); falling back to an older step',
                        candidate, self.directory, type(e).__name__, str(e).splitlines()[0][:300] if str(e) else '')
        bad.append(candidate)
        continue
      if bad or partial:
        self._quarantine(bad + partial)
      return restored[_STATE], dict(restored[_META])
    raise ValueError(f'no restorable checkpoint in {self.directory}: steps {steps + partial} all failed to load (see warnings '
                     f'above); move them away (e.g. into {self.directory / CORRUPT_SUBDIR}) to restart from scratch, '
                     'or restore from a backup')

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
      multihost_utils.sync_global_devices('grpo_jax.checkpoint.quarantine')
    if self._manager is not None:
      self._manager.reload()

  def wait(self) -> None:
    """Blocks until pending async saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def _partial_restore(path: epath.Path, abstract: Any) -> Any:
  """Restores only the leaves named in `abstract` from a pytree checkpoint at `path`."""
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
    return ckptr.restore(path, args=ocp.args.PyTreeRestore(
        item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))


def restore_params_only(directory: str | os.PathLike, abstract_params: Any, step: int | None = None) -> Any:
  """The `params` subtree of another run's state checkpoint: how a pipeline stage starts from the previous one."""
  _check_abstract(abstract_params, 'abstract_params')
  root = _path(directory)
  steps, partial = _step_dirs(root)
  for step_ in partial:
    logging.warning('checkpoint step %d in %s has no %s (partial write); skipping it', step_, root, _COMMIT_MARKER)
  if step is not None and step not in steps:
    raise ValueError(f'step={step} is not a committed checkpoint in {root}; available: {steps}')
  candidates = [step] if step is not None else list(reversed(steps))
  for candidate in candidates:
    try:
      return _partial_restore(root / str(candidate) / _STATE, {'params': abstract_params})['params']
    except Exception as e:  # pylint: disable=broad-except
      if step is not None:
        raise
      logging.warning('params of checkpoint step %d in %s failed to restore (%s: %s); trying an older step',
                      candidate, root, type(e).__name__, str(e).splitlines()[0][:300] if str(e) else '')
  raise ValueError(f'no restorable checkpoint with params in {root} (steps found: {steps}); point the stage\'s '
                   'init checkpoint at a finished run\'s checkpoint directory')


def save_params(directory: str | os.PathLike, params: Any) -> None:
  """A standalone params checkpoint (e.g. a stage's final policy); overwrites `directory`."""
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(_path(directory), params, force=True)
    ckptr.wait_until_finished()


def load_params(directory: str | os.PathLike, abstract_params: Any) -> Any:
  """Reads a `save_params` checkpoint into `abstract_params`' shardings."""
  _check_abstract(abstract_params, 'abstract_params')
  path = _path(directory)
  if not path.exists():
    raise ValueError(f'params checkpoint {path} does not exist; write it with checkpoint.save_params or fix the path')
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(path, abstract_params)
