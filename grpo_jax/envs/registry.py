"""Which environment `tools.env` names: a built-in, or `module:attr` of any importable environment class or factory.

`attr` is called with an `envs.base.EnvContext` and must return an object with `reset(example)` and
`step(state, action_text)` (an `envs.base.Env`). Every failure is one ValueError line naming the key and the fix
(run/validate.py turns it into exit status 2 before anything is written).
"""
from __future__ import annotations

import importlib
from typing import Callable

from grpo_jax.envs import base
from grpo_jax.envs import calculator
from grpo_jax.envs import sandbox

BUILTINS: dict[str, Callable[[base.EnvContext], base.Env]] = {
    "calculator": calculator.Calculator,  # the arithmetic / sums tasks (configs/tools_calc.py)
    "python": sandbox.PythonSandbox,      # GSM8K-style problems: code in a limited child process
}


def factory(spec: str) -> Callable[[base.EnvContext], base.Env]:
  """The class or factory `spec` names (a BUILTINS name or 'module:attr')."""
  if spec in BUILTINS:
    return BUILTINS[spec]
  module, sep, attr = spec.partition(":")
  fix = (f"name a built-in ({', '.join(sorted(BUILTINS))}) or 'module:attr' of an environment class or factory "
         "importable on PYTHONPATH")
  if not sep or not module or not attr:
    raise ValueError(f"tools.env={spec!r} is neither a built-in nor 'module:attr'; {fix}.")
  try:
    obj = importlib.import_module(module)
  except Exception as e:  # pylint: disable=broad-except  (ImportError, or whatever the module raises on import)
    raise ValueError(f"tools.env={spec!r}: module {module!r} cannot be imported ({type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}); {fix}.") from None
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise ValueError(f"tools.env={spec!r}: module {module!r} has no {attr!r}; {fix}.")
    obj = getattr(obj, part)
  if not callable(obj):
    raise ValueError(f"tools.env={spec!r} is a {type(obj).__name__}, not a class or factory; {fix}.")
  return obj


def make(spec: str, ctx: base.EnvContext) -> base.Env:
  """The environment `spec` names, built with `ctx`; checked to have reset and step."""
  make_env = factory(spec)
  try:
    env = make_env(ctx)
  except Exception as e:  # pylint: disable=broad-except  (a user factory's own error, reported as the key's)
    raise ValueError(f"tools.env={spec!r}: building it raised {type(e).__name__}: "
                     f"{str(e).splitlines()[0] if str(e) else ''}; it is called with an envs.base.EnvContext "
                     "(task, tokenizer, format, options).") from None
  missing = [m for m in ("reset", "step") if not callable(getattr(env, m, None))]
  if missing:
    raise ValueError(f"tools.env={spec!r} made a {type(env).__name__} without {' and '.join(missing)}; an "
                     "environment has reset(example) -> prompt and step(state, action_text) -> StepResult "
                     "(grpo_jax/envs/base.py).")
  return env
