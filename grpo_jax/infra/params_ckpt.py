"""Params-only checkpoints: a stage's final policy (`save_params` / `load_params`, checksums in a sidecar), and
the `params` subtree of another run's state checkpoint (`restore_params_only`: how a stage starts from the last)."""
from __future__ import annotations

import functools
import json
import os
from typing import Any, NamedTuple

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from grpo_jax.infra import errors
from grpo_jax.infra import integrity
from grpo_jax.infra.checkpoint import (COMMIT_MARKER, STATE, check_abstract, as_path, read_agreed, read_json,
                                       read_meta, restore_barrier, step_dirs)

def _partial_restore(ckptr: ocp.Checkpointer, path: epath.Path, abstract: Any) -> Any:
  """Restores only the leaves named in `abstract` from a pytree checkpoint at `path`."""
  return ckptr.restore(path, args=ocp.args.PyTreeRestore(
      item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract), partial_restore=True))


def _partial_params(ckptr: ocp.Checkpointer, path: epath.Path, abstract_params: Any) -> Any:
  return _partial_restore(ckptr, path, {'params': abstract_params})['params']


def _verify_params(params: Any, stored: dict | None, where: str) -> str | None:
  summary = integrity.summarize({'params': params})
  if stored is not None:
    wrong = integrity.mismatches(stored, summary)
    if wrong:
      return f'checksum mismatch in {", ".join(wrong[:3])}'
  bad = integrity.nonfinite(summary)
  return f'non-finite values in {integrity.describe(bad)}' if bad else None


class Restored(NamedTuple):
  """What `restore_params_only` read: the params, the step they really come from, and the newer steps it passed
  over (step, why): a caller that names a step names this one."""
  params: Any
  step: int
  skipped: tuple[tuple[int, str], ...] = ()


def restore_params_only(directory: str | os.PathLike, abstract_params: Any, step: int | None = None) -> Restored:
  """The `params` subtree of another run's state checkpoint (how a pipeline stage starts from the previous one, how
  an export reads a run): the given step, or the newest that restores and verifies, passing over damaged ones with a
  warning. Reads only: nothing is moved (the run's own resume sets damaged steps aside)."""
  check_abstract(abstract_params, 'abstract_params')
  root = as_path(directory)
  steps, partial = step_dirs(root)
  for step_ in partial:
    logging.warning('checkpoint step %d in %s has no %s (partial write); skipping it', step_, root, COMMIT_MARKER)
  if step is not None and step not in steps:
    raise ValueError(f'step={step} is not a committed checkpoint in {root}; available: {steps}')
  skipped = []
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
    for candidate in ([step] if step is not None else list(reversed(steps))):
      # every process passes over the step if one could not read it (multi-process: checkpoint.read_agreed)
      params, why = read_agreed(functools.partial(_partial_params, ckptr, root / str(candidate) / STATE,
                                                  abstract_params), restore_barrier(ckptr))
      if not why:
        try:
          why = _verify_params(params, (read_meta(root, candidate) or {}).get('integrity'), str(root))
        except Exception as e:  # pylint: disable=broad-except
          why = errors.root_cause(e)
      if not why:
        return Restored(params, candidate, tuple(skipped))
      if step is not None:
        raise errors.InputError(f'checkpoint step {step} in {root} is damaged ({why}); pick another step '
                                f'(available: {steps}) or leave the step unset for the newest that restores.')
      logging.warning('params of checkpoint step %d in %s are unusable (%s); trying an older step', candidate,
                      root, why)
      skipped.append((candidate, why))
  raise errors.InputError(f'no restorable checkpoint with params in {root} (steps found: {steps}, every one '
                          'damaged or unreadable: the warnings above say why); restore them from a backup, or read '
                          'another run\'s checkpoints')


def _sidecar(path: epath.Path) -> epath.Path:
  return path.parent / f'{path.name}.integrity.json'


def save_params(directory: str | os.PathLike, params: Any) -> None:
  """A standalone params checkpoint (e.g. a stage's final policy); overwrites `directory`. Checksums go next to
  it (`<directory>.integrity.json`); a non-finite value raises errors.RunStopped and nothing is written."""
  summary = integrity.summarize({'params': params})
  bad = integrity.nonfinite(summary)
  if bad:
    raise errors.RunStopped(f'the final params have non-finite values in {integrity.describe(bad)}; not writing '
                            f'{directory}')
  path = as_path(directory)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path, params, force=True)
    ckptr.wait_until_finished()
  if jax.process_index() == 0:
    tmp = path.parent / f'{path.name}.integrity.json.tmp'
    tmp.write_text(json.dumps(integrity.record(summary)))
    tmp.replace(_sidecar(path))


def load_params(directory: str | os.PathLike, abstract_params: Any) -> Any:
  """Reads a `save_params` checkpoint into `abstract_params`' shardings, verifying its checksums if recorded."""
  check_abstract(abstract_params, 'abstract_params')
  path = as_path(directory)
  if not path.exists():
    raise errors.InputError(f'params checkpoint {path} does not exist; write it with checkpoint.save_params or fix '
                            'the path (train.init_from / sft.init_from)')
  with ocp.StandardCheckpointer() as ckptr:
    try:
      params = ckptr.restore(path, abstract_params)
    except Exception as e:  # pylint: disable=broad-except
      raise errors.InputError(f'params checkpoint {path} cannot be read ({type(e).__name__}: '
                              f'{errors.one_line(str(e))[:300]}); rewrite it (rerun the stage that wrote it) or '
                              'point init_from elsewhere') from e
  why = _verify_params(params, read_json(_sidecar(path)), str(path))
  if why:
    raise errors.InputError(f'params checkpoint {path} is damaged ({why}); rerun the stage that wrote it '
                            '(--config.train.rerun_stages=<stage>) or point init_from elsewhere')
  return params
