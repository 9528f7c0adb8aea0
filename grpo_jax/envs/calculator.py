"""The calculator environment (`tools.env='calculator'`): evaluates the arithmetic expression of a tool call.

Safe by construction, not by sandboxing: the expression is parsed with `ast` (mode 'eval') and only integer and
decimal literals, parentheses, unary + and -, and + - * / // % ** are evaluated, by this module's own walk of the
tree; names, calls, attributes, subscripts and every other node are refused, so no Python the model writes is ever
run. Bounds keep a call cheap: at most MAX_CHARS characters, MAX_NODES nodes, exponents up to MAX_EXPONENT, and
every intermediate value within MAX_ABS.
"""
from __future__ import annotations

import ast
import math
import operator

from grpo_jax.envs import base
from grpo_jax.envs import formats

MAX_CHARS = 200
MAX_NODES = 64
MAX_EXPONENT = 64
MAX_ABS = 10 ** 18
DECIMALS = 6  # a non-integer result is written with at most this many decimals

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_CHARS = set("0123456789.+-*/%() \t")


class CalcError(ValueError):
  """The expression is not one the calculator evaluates (the message is the observation's error text)."""


def _bounded(v):
  if (isinstance(v, float) and not math.isfinite(v)) or abs(v) > MAX_ABS:
    raise CalcError(f"a value exceeds {MAX_ABS:.0e}")
  return v


def _eval(node):
  if isinstance(node, ast.Constant):
    if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
      raise CalcError(f"{node.value!r} is not a number")
    return _bounded(node.value)
  if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    return _UNARY[type(node.op)](_eval(node.operand))
  if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
    a, b = _eval(node.left), _eval(node.right)
    if isinstance(node.op, ast.Pow) and (not float(b).is_integer() or abs(b) > MAX_EXPONENT):
      raise CalcError(f"exponents must be whole numbers up to {MAX_EXPONENT}")
    if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and b == 0:
      raise CalcError("division by zero")
    if isinstance(node.op, ast.Pow) and a == 0 and b < 0:
      raise CalcError("division by zero")
    try:
      return _bounded(_BINARY[type(node.op)](a, b))
    except OverflowError:  # float ** float beyond the float range
      raise CalcError(f"a value exceeds {MAX_ABS:.0e}") from None
  raise CalcError(f"{type(node).__name__} is not arithmetic")


def evaluate(expression: str) -> int | float:
  """The value of an arithmetic expression; CalcError (one line) for anything else."""
  text = expression.strip()
  if not text:
    raise CalcError("empty expression")
  if len(text) > MAX_CHARS:
    raise CalcError(f"expression longer than {MAX_CHARS} characters")
  bad = sorted(set(text) - _CHARS)
  if bad:
    raise CalcError(f"unexpected character {bad[0]!r}")
  try:
    tree = ast.parse(text, mode="eval")
  except SyntaxError:
    raise CalcError("not an arithmetic expression") from None
  if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
    raise CalcError(f"expression with more than {MAX_NODES} parts")
  return _eval(tree.body)


def format_value(v: int | float) -> str:
  """An integer as digits ('85', also for 170 / 2); otherwise at most DECIMALS decimals, trailing zeros dropped."""
  if isinstance(v, int):
    return str(v)
  if v.is_integer():
    return str(int(v))
  return f"{v:.{DECIMALS}f}".rstrip("0").rstrip(".")


def result_text(expression: str) -> tuple[str, dict]:
  """(observation content, info) for one call: the value, or `error: <why>` with info['error']."""
  try:
    return format_value(evaluate(expression)), {}
  except CalcError as e:
    return f"error: {e}", {"error": str(e)}


class Calculator(base.ToolEnv):
  tool = formats.Tool("calculator", "Evaluate an arithmetic expression and return its value.", "expression",
                      "integers and decimals with + - * / // % ** and parentheses, e.g. 37 + 48 * 2")

  def run(self, state: base.EnvState, value: str) -> tuple[str, dict]:
    del state
    return result_text(value)
