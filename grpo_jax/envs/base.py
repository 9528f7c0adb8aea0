"""The environment interface: `reset(example) -> prompt`, `step(state, action_text) -> StepResult`, pure Python.

An environment object is shared by every row; what one row's episode has done so far lives in its `EnvState`, which
`step` updates in place. The batch runner (envs/batch.py) creates a row's state from its batch fields
(`initial_state`), keeps it between the row's calls, and rebuilds it when it no longer has it (a resumed run, a
carried row) by replaying the row's earlier actions from its transcript: an environment must therefore be
deterministic in (fields, the actions so far). An environment whose state carries nothing between calls sets
`stateful = False` and is never replayed (both built-ins).

`step` is called when a row emits a stop marker (tools.stop_markers), with `action_text` = everything the model wrote
since its last observation (the turn's text, the marker included). It returns:
  observation: the text appended to the row (the format's whole observation, markers included), or None (nothing
               appended);
  reward:      this step's reward (summed over the row's steps; 0 for a tool that only computes);
  done:        the row ends here: it is finished as if it had emitted EOS (the EOS id is appended, not trained on;
               no observation is);
  info:        free-form; the runner reads `error` (the tool reported an error: a bad call, code that raised) and
               `timeout` (the tool hit its own time limit), which the metrics count.
Anything else (an exception, another type, a call that outlives tools.timeout_s) is the runner's counted fallback.

Built-ins (envs/registry.py): `calculator` (calculator.py) and `python` (sandbox.py), both `ToolEnv`s: one tool in
a format (formats.py), no reward of their own (the task's verifier scores the answer).
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Mapping, NamedTuple

import numpy as np

from grpo_jax.envs import formats as formats_lib


class StepResult(NamedTuple):
  observation: str | None
  reward: float
  done: bool
  info: dict


@dataclasses.dataclass
class EnvState:
  """One row's episode: its batch fields (answer_N's value under 'answer_N', ...), the steps taken, and whatever the
  environment keeps (`memo`)."""
  fields: dict[str, np.ndarray]
  turn: int = 0
  memo: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class EnvContext:
  """What an environment is built with: the run's task object (data.make_task), tokenizer and tool format, and the
  `tools` config group's options (the sandbox's limits)."""
  task: Any
  tokenizer: Any
  format: formats_lib.Format
  options: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Env(abc.ABC):
  """reset(example) -> prompt text; step(state, action_text) -> StepResult."""
  stateful: bool = True  # the state carries something between steps (the runner keeps or replays it)

  @abc.abstractmethod
  def reset(self, example: dict) -> str:
    """The prompt text of a task example (`example['language']` picks the language, default 'a')."""

  def initial_state(self, fields: dict[str, np.ndarray]) -> EnvState:
    return EnvState(fields=dict(fields))

  @abc.abstractmethod
  def step(self, state: EnvState, action_text: str) -> StepResult:
    ...


class ToolEnv(Env):
  """An environment that offers one tool in the run's format: a turn that ends with a call gets the tool's output as
  the observation, a malformed call gets an error observation (the model may try again), and a turn without a
  call ends the row."""
  stateful = False
  tool: formats_lib.Tool

  def __init__(self, ctx: EnvContext):
    self.ctx = ctx

  def reset(self, example: dict) -> str:
    return self.ctx.format.prompt(self.ctx.task, example, example.get("language", "a"), self.ctx.tokenizer,
                                  [self.tool])

  def prompt_ids(self, example: dict) -> list[int]:
    """`reset`'s prompt as the token ids an RL batch holds (the format's bos rule)."""
    return self.ctx.format.prompt_ids(self.reset(example), self.ctx.tokenizer)

  def step(self, state: EnvState, action_text: str) -> StepResult:
    state.turn += 1
    parsed = self.ctx.format.parse(action_text, [self.tool])
    if parsed.call is None and not parsed.error:
      return StepResult(None, 0.0, True, {})
    if parsed.error:
      return StepResult(self.ctx.format.observation(f"error: {parsed.error}"), 0.0, False, {"error": parsed.error})
    content, info = self.run(state, parsed.call.arguments[self.tool.arg])
    return StepResult(self.ctx.format.observation(content), 0.0, False, info)

  @abc.abstractmethod
  def run(self, state: EnvState, value: str) -> tuple[str, dict]:
    """The tool on its argument: (output text, info with `error` / `timeout` when it failed)."""
