"""The synthetic tasks as TFDS array_record datasets (built on first use, read back without TensorFlow).

Each record is {index, json}: the example as JSON. Content is a pure function of (task knobs, seed, sizes) and of
the code that generates it (the task's module and base.py's split rule), all encoded in the config name, so a data
dir never mixes datasets and a copy built by other generator code is never read as this one. TFDS shuffles records on write; readers sort by index.
A process reads each split from disk once (load_split keeps what it read).
"""
from __future__ import annotations

import dataclasses
import fcntl
import inspect
import json
import os
import sys

import numpy as np
import tensorflow_datasets as tfds

from grpo_jax.tasks import base

# Overridable per call (task.data_dir) or for the whole process with $GRPO_JAX_DATA_DIR.
DEFAULT_DATA_DIR = os.environ.get("GRPO_JAX_DATA_DIR",
                                  os.path.join(os.path.expanduser("~"), ".cache", "grpo_jax", "tfds"))


@dataclasses.dataclass(eq=False)
class TaskConfig(tfds.core.BuilderConfig):
  task_name: str = ""
  knobs_json: str = "{}"
  seed: int = 0
  train_size: int = 0
  test_size: int = 0
  # The task object the examples come from (its knobs are knobs_json, which with the name says what was built).
  task: base.Task | None = None


def generator_digest(task: base.Task) -> str:
  """A digest of the code the examples come from: the task's module and base.py (the split rule). Without it a
  data dir built before a change to either was read back as the same dataset (the name held knobs, seed and sizes
  only), and a host with a fresh dir drew other examples than one with an old dir."""
  parts = []
  for module in (sys.modules[type(task).__module__], base):
    try:
      parts.append(inspect.getsource(module))
    except (OSError, TypeError):  # no source shipped (a zipped install): its name only
      parts.append(module.__name__)
  return base.key_hash("\n".join(parts))[:8]


def make_config(task: base.Task, seed: int, train_size: int, test_size: int) -> TaskConfig:
  name = f"{task.config_name()}_s{seed}_n{train_size}_{test_size}_g{generator_digest(task)}"
  return TaskConfig(name=name, task_name=task.name, knobs_json=json.dumps(task.knobs(), sort_keys=True), seed=seed,
                    train_size=train_size, test_size=test_size, task=task)


class _TaskBuilder(tfds.core.GeneratorBasedBuilder):
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  # No checksums file to locate: TFDS's lookup of one needs the `importlib_resources` package, which the pure-JAX
  # venv does not ship, and a synthetic dataset downloads nothing.
  code_path = None

  def _info(self) -> tfds.core.DatasetInfo:
    # Built directly: dataset_info_from_configs() reads package metadata (a checksums/metadata folder next to a
    # registered TFDS dataset package) that this module does not ship.
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__,
        features=tfds.features.FeaturesDict({"index": tfds.features.Scalar(dtype=np.int64),
                                             "json": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    del dl_manager  # synthetic: nothing to download
    return {"train": self._generate_examples("train"), "test": self._generate_examples("test")}

  def _generate_examples(self, split: str):
    cfg: TaskConfig = self.builder_config
    n = cfg.train_size if split == "train" else cfg.test_size
    for ex in cfg.task.examples(cfg.seed, split, n, cfg.test_size):
      yield ex["index"], {"index": ex["index"], "json": json.dumps(ex, sort_keys=True)}


class ArithTask(_TaskBuilder):
  """Two-operand arithmetic (grpo_jax.tasks.arith)."""


class CountdownTask(_TaskBuilder):
  """Countdown (grpo_jax.tasks.countdown)."""


class SumsTask(_TaskBuilder):
  """Multi-operand sums (grpo_jax.tasks.sums)."""


_BUILDERS = {"arith": "arith_task", "countdown": "countdown_task", "sums": "sums_task"}


def _decode(record: dict) -> dict:
  text = record["json"]
  ex = json.loads(text.decode() if isinstance(text, bytes) else text)
  for k in ("numbers", "steps", "terms"):
    if k in ex:
      ex[k] = tuple(tuple(x) if isinstance(x, list) else x for x in ex[k])
  return ex


# Splits already read by this process, by (data dir, config name, split). The name encodes the content, so a hit is
# the same examples: a process that reads a split again (the train and eval data of every stage or run of an R1
# pipeline, a sweep or a test module) skips the TFDS read, 0.6 s for arith's 20,000 train examples on the 2-core CPU.
_READ: dict[tuple[str, str, str], tuple[dict, ...]] = {}


def load_split(task: base.Task, split: str, seed: int, train_size: int, test_size: int,
               data_dir: str | None = None) -> list[dict]:
  """All examples of a split in index order, building the dataset into `data_dir` on first use."""
  if task.name not in _BUILDERS:
    raise ValueError(f"task.name={task.name!r} has no TFDS builder; use one of {sorted(_BUILDERS)}")
  if split not in base.SPLITS:
    raise ValueError(f"split={split!r} is unknown; use one of {base.SPLITS}")
  data_dir = data_dir or DEFAULT_DATA_DIR
  config = make_config(task, seed, train_size, test_size)
  key = (data_dir, config.name, split)
  if key not in _READ:
    tfds.disable_progress_bar()
    # One builder per dataset at a time across processes: two runs started together on an empty data_dir (a
    # parallel sweep, two pipelines) both generated the split, and the second one's final rename failed with
    # FileExistsError. Under the lock the second finds the first's finished copy and only reads it.
    os.makedirs(data_dir, exist_ok=True)
    where = os.path.join(data_dir, _BUILDERS[task.name], config.name)
    cached = os.path.isdir(where)  # read back, not generated now: a failure is the copy's damage
    try:
      with open(os.path.join(data_dir, f".{config.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        source = tfds.data_source(_BUILDERS[task.name], data_dir=data_dir, split=split, download=True,
                                  builder_kwargs={"config": config, "file_format": "array_record"})
      examples = [_decode(r) for r in source.__getitems__(list(range(len(source))))]
    except Exception as e:  # pylint: disable=broad-except  (array_record / protobuf / json errors of a damaged copy)
      if not cached or isinstance(e, OSError):  # a generation failure (a bug), or storage (errors.py's one line)
        raise
      # generated data, cached: a damaged copy (truncated, edited) is one line saying what to delete, never deleted here
      raise ValueError(f"task.data_dir: the generated {task.name} {split} split in {where} cannot be read "
                       f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); delete that directory "
                       "and it is generated again on the next run.") from None
    _READ[key] = tuple(sorted(examples, key=lambda ex: ex["index"]))
  return [dict(ex) for ex in _READ[key]]  # the caller's own dicts (their values are ints, strings and tuples)
