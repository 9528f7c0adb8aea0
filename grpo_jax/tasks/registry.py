"""The one table of tasks: everything task-specific the rest of the code needs, looked up by `config.task.name`.

Code outside grpo_jax/tasks/ never branches on a task's name; it asks this table (`get(name).host_verifier`, …),
and a field left None means the task does not offer it. A new task is its module plus one entry in TASKS.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from grpo_jax.tasks import arith, base, countdown, digits, gsm8k, math_data, sums, verify_jax


def _no_python_rewards(tok) -> dict:
  del tok
  return {}


def _synthetic_examples(task, split: str, *, data_dir, split_seed: int, train_size: int, test_size: int):
  """A generated task's split, built once as a TFDS array_record dataset in `data_dir` (tfds_builders)."""
  # Here, not at the top: tensorflow_datasets (~2 s to import) loads only when a generated task reads its examples.
  from grpo_jax.tasks import tfds_builders  # pylint: disable=g-import-not-at-top
  return tfds_builders.load_split(task, split, split_seed, train_size, test_size, data_dir)


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  doc: str
  # The task object of the text pipeline (question, answer_text, batch_fields), built with the config's task knobs
  # (its dataclass fields). None: the task has no text examples.
  task_class: type | None = None
  # (task, split, *, data_dir, split_seed, train_size, test_size) -> the split's examples in index order.
  load: Callable[..., list[dict]] | None = None
  # cot.solution writes step-by-step reference solutions for it (SFT, pre-training, R1's cold start).
  worked_solutions: bool = False
  # Its records can carry worked solutions (a task knob names their field): SFT and pre-training train on them
  # through the task's `sft_completion` (R1's cold start writes its own and needs worked_solutions).
  data_solutions: bool = False
  # (tokens_NxL, mask_NxL, batch, tables) -> accuracy_N in-graph: the `accuracy` reward term and in-graph eval.
  in_graph_accuracy: Callable | None = None
  # tokenizer -> {term name: reward_spec.PyRewardFn}: Python reward terms a config may name in config.rewards.
  python_rewards: Callable[[Any], dict] = _no_python_rewards
  # tokenizer -> (tokens_NxL, mask_NxL, fields, group=G) -> (accuracy_N, format_N, answers_N): held-out evaluation
  # on the host (answers vote within runs of G rows, one prompt's samples), for tasks verified in Python (their eval
  # rows are gathered and scored by the training reward's function).
  host_verifier: Callable[[Any], Callable] | None = None


TASKS: dict[str, TaskSpec] = {
    "arith": TaskSpec(
        doc="two-operand integer arithmetic (tasks/arith.py), verified in-graph on token ids",
        task_class=arith.Arith, load=_synthetic_examples, worked_solutions=True,
        in_graph_accuracy=verify_jax.arith_accuracy),
    "countdown": TaskSpec(
        doc="reach a target from given numbers with + - * / ( ) (tasks/countdown.py), verified in-graph",
        task_class=countdown.Countdown, load=_synthetic_examples, worked_solutions=True,
        in_graph_accuracy=verify_jax.countdown_accuracy),
    "sums": TaskSpec(
        doc="multi-operand sums (tasks/sums.py): a direct answer is usually wrong, a worked running total usually "
            "right; arith's answer rule, verified in-graph",
        task_class=sums.Sums, load=_synthetic_examples, worked_solutions=True,
        in_graph_accuracy=verify_jax.sums_accuracy),
    "gsm8k": TaskSpec(
        doc="GSM8K from a local TFDS data dir (tasks/gsm8k.py), answers checked in Python on decoded text",
        task_class=gsm8k.GSM8K, load=gsm8k.load_examples, python_rewards=gsm8k.python_rewards,
        host_verifier=gsm8k.host_verifier),
    "math": TaskSpec(
        doc="your own math problems from local .jsonl / .json / .parquet files (DAPO-Math-17k, AIME, MATH-500, "
            "verl's parquet; tasks/math_data.py), graded like gsm8k: numerically, or symbolically (task.grader)",
        task_class=math_data.MathData, load=math_data.load_examples, python_rewards=gsm8k.python_rewards,
        data_solutions=True,
        host_verifier=gsm8k.host_verifier),
    "digits": TaskSpec(
        doc="digit-token addition (tasks/digits.py): the benchmark workload and the ablations' toy task; its "
            "batches are token ids built by tasks/digits.py, not by the text pipeline",
        python_rewards=digits.python_rewards),
}


# Examples a generated task's split may hold: each split is generated whole, before the first step, and read into
# memory (~2,000 countdown to ~5,000 arith examples a second on one CPU core: 10**7 is about an hour; 10**12 hung for
# years). A run draws train.steps × rl.prompts_per_step prompts, the split repeating in epochs.
MAX_GENERATED = 10_000_000


def generated(name: str) -> bool:
  """The task's splits are generated to task.train_size / test_size (a dataset task's own splits ignore them)."""
  return name in TASKS and TASKS[name].load is _synthetic_examples


def get(name: str) -> TaskSpec:
  if name not in TASKS:
    raise ValueError(f"task.name={name!r} is unknown; use one of {sorted(TASKS)}")
  return TASKS[name]


def names(offers: str | None = None) -> list[str]:
  """Sorted task names; with `offers`, only the tasks whose TaskSpec field of that name is set."""
  if offers is not None and offers not in {f.name for f in dataclasses.fields(TaskSpec)}:
    raise ValueError(f"TaskSpec has no field {offers!r}")
  return sorted(n for n, t in TASKS.items() if offers is None or getattr(t, offers))


def knob_readers(key: str) -> list[str]:
  """The tasks whose class takes `key` as a knob."""
  return sorted(n for n, t in TASKS.items() if t.task_class is not None and dataclasses.is_dataclass(t.task_class)
                and key in {f.name for f in dataclasses.fields(t.task_class)} - {"name"})


def get_task(name: str, **knobs: Any) -> base.Task:
  """The task `name` of TASKS with its knobs; unknown names or knobs raise ValueError naming the key."""
  cls = get(name).task_class
  if cls is None:
    raise ValueError(f"task.name={name!r} has no example generator; use one of {names('task_class')}")
  allowed = {f.name for f in dataclasses.fields(cls)} - {"name"} if dataclasses.is_dataclass(cls) else set()
  for k in knobs:
    if k not in allowed:
      raise ValueError(f"task.{k} is not a knob of {name}; use one of {sorted(allowed)}")
  return cls(**knobs)


def accuracy_reward(task, tokens_NxL, mask_NxL, batch: dict, tables=None):
  """1.0 where format is OK and the answer body is right for `task`, else 0.0: the task's in-graph verifier in
  TASKS (the `accuracy` reward term and in-graph evaluation call it by task name; `tables`:
  verify_jax.token_tables)."""
  task = getattr(task, "name", task)
  if task not in names("in_graph_accuracy"):
    raise ValueError(f"task={task!r} has no in-graph verifier; use one of {names('in_graph_accuracy')} "
                     "(or name the task's Python reward term in config.rewards)")
  return get(task).in_graph_accuracy(tokens_NxL, mask_NxL, batch, tables)
