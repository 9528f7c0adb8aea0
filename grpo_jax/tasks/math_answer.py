"""Final-answer extraction and checking for math word problems (GSM8K-style), in plain Python.

Why ours and not `math-verify`: a reward term runs in a worker thread (rewards.PythonTerm), where math-verify's
signal-based timeouts cannot run, and it pulls in sympy + an ANTLR LaTeX parser (~1.5 s import, ms per call). The
answers here are numbers or small arithmetic expressions, which an exact-rational evaluator over a whitelisted
Python AST covers; tests/test_math_answer.py checks both agree on a table of cases (and says where they differ).

Extraction: the body of the last `<answer>…</answer>` if there is one, else the last `\\boxed{…}` (of nested boxes
the outer one: a box inside it only frames a part), else (when the
caller allows it: a completion that ended) the expression after the last explicit final-answer phrase ("the answer
is", "final answer:", "answer =", GSM8K's "####"; `expression_at`: `\\sqrt{2}`, `2 x`, `2^{10}`, not the number they
start with), numbers written after it notwithstanding, else the last number in the text, or the LaTeX expression it
is written in (`x = \\sqrt{2}`, `$2\\pi$`). Normalisation: `\\boxed{}`, `$`, `\\$`, `\\(…\\)`/`\\[…\\]`, markdown `**…**`, `\\%`/`%`, thousands
grouped by commas, spaces, thin / no-break spaces (U+2009, U+202F, U+00A0, LaTeX `\\,`), `{,}` or MATH's `,\\!` (1-3 digits, then
groups of exactly 3), `\\frac{a}{b}` (`\\dfrac`, `\\tfrac`),
`\\cdot`/`\\times`, `^`, `\\left`/`\\right`, spacing commands, trailing '.', and words/units (`\\mathrm{cm}`,
`^\\circ`, with a unit's power: `6\\text{ cm}^2` is 6) are stripped; `1.5e3` is 1500. A single letter is a variable,
not a unit: `2x`, `x+1`, `3+2i`, `2 x` are unparsable (`x = 5`'s right side is 5), except a one-letter SI unit after a
lone number and a space (`5 m`, `12 h`). A function or constant we do not evaluate (`\\sqrt`, `\\log`, `\\pi`,
`sqrt(…)`, any LaTeX command that is not layout) makes the answer unparsable: dropping it as if it were a unit read
`\\sqrt{16}` as 16. Values are exact `Fraction`s, so 0.5 == 1/2 == \\frac{1}{2} == 50%.
"""
from __future__ import annotations

import ast
import bisect
import re
from fractions import Fraction

_MAX_EXPONENT = 64       # 2**64 is fine; 10**10**10 would hang the host, so larger exponents fail to parse
_MAX_BITS = 4096         # no answer needs a power beyond 2**4096
_MAX_LEN = 200           # longer "answers" are prose, not an expression
# A simple a/b counts as one; so does scientific notation ('1.5e3', not the 1.5 before its exponent).
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?(?:/\d+(?:\.\d+)?)?|-?\.\d+(?:[eE][-+]?\d+)?")
_THOUSANDS = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+)(?![\d])")
# Thousands grouped by a space, a thin or no-break space, LaTeX's `\,` / `\ ` / `\thinspace`, `{,}` or MATH's `,\!`:
# '37 230', '1,\!000'.
_GROUP_SEP = r"(?: |\u2009|\u202f|\u00a0|\\,|\\ |\\thinspace\s?|\{,\}|,\\!)"
_SPACED = re.compile(rf"(?<![\d.,])(\d{{1,3}}(?:{_GROUP_SEP}\d{{3}})+)(?![\d])")
# In running text only the unambiguous separators group (not a plain space: '3 100-dollar bills').
_NUMBER_GROUPED = re.compile(r"-?\d{1,3}(?:(?:\u2009|\u202f|\u00a0|\{,\}|,\\!)\d{3})+(?![\d])(?:\.\d+)?")
# LaTeX commands that only typeset (fonts, units, sizes, degrees): dropped. Any other command left after the
# fractions and operators are rewritten changes the value (\sqrt, \log, \pi, \binom, \lfloor, \overline): unparsable.
_LAYOUT_COMMANDS = {"text", "textrm", "textbf", "textit", "textnormal", "mathrm", "mathbf", "mathit", "mathsf",
                    "mathtt", "rm", "bf", "it", "displaystyle", "textstyle", "big", "Big", "bigl", "bigr", "Bigl",
                    "Bigr", "circ", "degree", "mbox", "hbox", "ensuremath", "quad", "qquad", "dollar", "dollars",
                    "boxed", "fbox"}  # a box inside the answer's box only frames its part: \boxed{\boxed{2}+3} is 5
# A power after a unit (its text group or a word): '^2', '^{3}', '^ {2}'.
_UNIT_POWER = r"(?:\s*\^\s*(?:\{\s*[-+]?\d+\s*\}|[-+]?\d))?"
# A single letter standing alone is a variable ('x+1', '2x'); a unit is a word ('5 apples', '15 min', '\text{cm}')
_VARIABLE = re.compile(r"(?<![A-Za-z_'])[A-Za-z](?![A-Za-z_'])")
# ...except a one-letter SI unit (m g s h l L K N J W V) after a lone number and a space ('5 m', '12 h', '5 m^2'; not
# '2x', '3 + 2 i', nor '2 x': any letter read as a unit made '2 x' the number 2).
_LETTER_UNIT = re.compile(r"^(\s*-?[\d.]+)\s+[mgshlLKNJWV](?:\s*\*\*\s*(?:\(\s*\d+\s*\)|\d+))?\s*\.?\s*$")
# The same functions and constants written as plain words: 'sqrt(16)', 'log 100', '2 pi'.
_FUNCTION_WORD = re.compile(r"(?<![A-Za-z])(?:(?:sqrt|cbrt|log|ln|lg|exp|sin|cos|tan|cot|sec|csc|arcsin|arccos|"
                            r"arctan|sinh|cosh|tanh)\s*[(\d]|(?:abs|floor|ceil|round|gcd|lcm|min|max|choose)\s*\(|"
                            r"pi\b)", re.I)
# An explicit final-answer phrase, then its number: "The answer is 37230. I used 34 boxes." -> 37230.
# Every run of whitespace is one possessive `\s*+`: the old form had three optional `\s*` in a row, which backtrack
# over each other (cubic: 'the answer' and 1,000 spaces took a minute, a 10k-character completion for ever).
_PHRASE = re.compile(r"(?:####|\b(?:the\s++)?(?:final\s++)?answer(?:\s*+(?:is|was|would\s++be|will\s++be|[:=]))?)"
                     r"\s*+(?:[:=]\s*+)?(?:\*{1,2}\s*+)?(?:\\?\$\s*+)?", re.I)
_FRAC_HEAD = re.compile(r"-?\s*+\\[dt]?frac\s*+")


def _balanced(text: str, start: int) -> tuple[str, int] | None:
  """The contents of the brace group opening at text[start] == '{', and the index after its '}'."""
  depth = 0
  for i in range(start, len(text)):
    if text[i] == "{":
      depth += 1
    elif text[i] == "}":
      depth -= 1
      if depth == 0:
        return text[start + 1:i], i + 1
  return None


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _last_box(text: str) -> tuple[int, int, int] | None:
  """(where its command starts, where its content starts, where its '}' is) of the `\\boxed{...}` (or `\\fbox{...}`)
  with balanced braces that closes last; None if there is none. One pass over the braces (a scan to the end per
  box was quadratic in nested boxes)."""
  opens = {m.end() - 1: m.start() for m in _BOX_OPEN.finditer(text)}
  if not opens:
    return None
  stack, found = [], None
  for m in re.finditer(r"[{}]", text):
    if m.group(0) == "{":
      stack.append(m.start())
    elif stack:
      start = stack.pop()
      if start in opens:
        found = (opens[start], start + 1, m.start())
  return found


def last_boxed(text: str) -> str | None:
  """Contents of the box that closes last, i.e. the outermost box of the last one: `\\boxed{\\boxed{2}+3}` holds
  '\\boxed{2}+3' (its value is 5, as typeset: normalize drops the inner box's command), `\\boxed{71 \\boxed{72}}`
  holds two numbers (unparsable, as '\\boxed{71 or 72}'). None if there is none."""
  box = _last_box(text)
  return None if box is None else text[box[1]:box[2]]


def _numbers(text: str) -> list[tuple[int, str]]:
  """(start, number) of every number (or a/b) in the text, a thin-space / `{,}`-grouped one read whole."""
  grouped = [(m.start(), m.group(0)) for m in _NUMBER_GROUPED.finditer(text)]
  starts = [a for a, _ in grouped]  # sorted, non-overlapping: bisect (a scan of every group per number was quadratic)

  def covered(i: int) -> bool:
    k = bisect.bisect_right(starts, i) - 1
    return k >= 0 and i < starts[k] + len(grouped[k][1])
  plain = [(m.start(), m.group(0).rstrip(",")) for m in _NUMBER.finditer(text) if not covered(m.start())]
  return sorted(grouped + plain)


def last_number(text: str) -> str | None:
  """The last number (or a/b) in the text, thousands separators allowed: 'so she pays $1,200.' -> '1,200'."""
  nums = _numbers(text)
  return nums[-1][1] if nums else None


def _fraction_at(text: str, pos: int) -> str | None:
  """The `\\frac{a}{b}` (`\\dfrac`, `\\tfrac`, `\\frac12`, a leading '-') starting at text[pos], within _MAX_LEN
  characters (an unclosed brace after each of many phrases would make the scans quadratic)."""
  head = _FRAC_HEAD.match(text, pos)
  if head is None:
    return None
  window = text[head.end():head.end() + _MAX_LEN]
  short = re.match(r"\d\s*\d", window)
  if short:
    return text[pos:head.end() + short.end()]
  num = _balanced(window, 0) if window.startswith("{") and "}" in window else None
  rest = num[1] + len(window[num[1]:]) - len(window[num[1]:].lstrip(" ")) if num else 0
  den = _balanced(window, rest) if num and window.startswith("{", rest) else None
  return text[pos:head.end() + den[1]] if den else None


# The tokens an answer expression is written with (expression_at): a LaTeX command, an escaped character or spacing
# (`\{`, `\,`, `\(`), a number (thousands grouped by ',', `{,}` or `,\!`), an operator or bracket, a run of spaces (not
# a newline), `$`, `%`, a function word (`sqrt`, `pi`) or a single letter (a variable). A word of two letters or more
# ('because', 'dollars', 'cm'), a newline, a sentence's '.', a ',' / ';' / ':' outside brackets end it.
_EXPR_TOKEN = re.compile(r"(?P<cmd>\\[A-Za-z]+\*?|\\[^A-Za-z\n])|(?P<num>\d+(?:(?:,|\{,\}|,\\!)\d{3}(?!\d))*"
                         r"(?:\.\d+)?|\.\d+)|(?P<open>[(\[{])|(?P<close>[)\]}])|(?P<space>[ \t\u2009\u202f\u00a0]+)|"
                         r"(?P<op>[-+*/^_=<>|!'×÷−·$%])|"
                         r"(?P<fn>(?<![A-Za-z])(?:sqrt|cbrt|log|ln|exp|sin|cos|tan|pi)(?![A-Za-z]))|"
                         r"(?P<letter>(?<![A-Za-z])[A-Za-z](?![A-Za-z]))")
_CLOSE = {")": "(", "]": "[", "}": "{"}


def expression_at(text: str, pos: int) -> tuple[str, int]:
  """(the answer expression written from text[pos], where it ends), read token by token within _MAX_LEN characters:
  `\\sqrt{2}`, `2 x`, `2^{10}`, `(1, 2)`, `x = \\frac{1}{2}`, not just the number they start with. A bracket left open
  where the expression ends ('1,200 (for 3 weeks)') is cut off with what follows it; a brace group left open
  ('\\frac{1 then') is no expression (''); a plain space between two numbers ends it ('3 100-dollar bills')."""
  end, limit, opened, prev = pos, min(len(text), pos + _MAX_LEN), [], None
  while end < limit:
    m = _EXPR_TOKEN.match(text, end, limit)
    if m is None:
      if text[end] == "," and opened:     # '(1, 2)': a comma inside brackets
        end, prev = end + 1, "comma"
        continue
      break
    kind = m.lastgroup
    if kind == "space" and prev == "num" and text[m.end():m.end() + 1].isdigit() and m.group(0).strip(" \t") == "":
      break                               # '3 100-dollar bills': two numbers, not one answer
    if kind == "open":
      if m.group(0) == "{":                # a brace group is read whole (\text{5 cm}, \frac{a}{b})
        group = _balanced(text[end:limit], 0)  # the window only: many phrases before a '{' stay linear
        if group is None:
          return "", end
        end, prev = end + group[1], "group"
        continue
      opened.append(end)
    elif kind == "close":
      if not opened or text[opened[-1]] != _CLOSE[m.group(0)]:
        break                             # '(the answer is 5)': a bracket this expression did not open
      opened.pop()
    end, prev = m.end(), kind
  if opened:
    end = opened[0]
  return text[pos:end].strip(" \t\u2009\u202f\u00a0$"), end


_LINE_END = re.compile(r"[ \t]*\.?[ \t]*(?:\n|$)")


def _is_expression(span: str, line_ends: bool) -> bool:
  """An expression worth taking as the answer: with a digit or a LaTeX command, or of letters only ('x', 'x + y')
  when its line ends with it ('the answer is a prime number', 'the answer is x. Then 2x = 10', 'a) 5' are prose)."""
  if not span or len(span) >= _MAX_LEN:
    return False
  return bool(re.search(r"\d|\\[A-Za-z]", span)) or (line_ends and bool(re.search(r"[A-Za-z]", span)))


def phrase_answer(text: str) -> str | None:
  """The answer expression right after the last explicit final-answer phrase that is followed by one ('the answer is
  12', 'Final answer: $1,200', DAPO's 'Answer: $\\frac{1}{2}$', 'Answer: \\sqrt{2}', 'Answer: 2 x'), whatever
  numbers follow it; None without such a phrase. (Its first number was read: 2 of 'Answer: \\sqrt{2}', of
  'Answer: 2 x' and of 'Final answer: 2^{10}'.)"""
  found = None
  for m in _PHRASE.finditer(text):  # each expression read within _MAX_LEN characters: linear in the phrases
    span, end = expression_at(text, m.end())
    if _is_expression(span, _LINE_END.match(text, end) is not None):
      found = span
  return found


_LATEX = re.compile(r"\\[A-Za-z]|[\^{]")
_SKIP = re.compile(r"[A-Za-z]+|.", re.S)  # a word (or any other character) between two expressions


def last_number_answer(text: str) -> str | None:
  """The last number, or the LaTeX expression it is written in: `so x = \\sqrt{2}` is `x = \\sqrt{2}` (its last
  number, 2, is not the answer), `$2\\pi$` is `2\\pi`, `2^{10}` is `2^{10}`. The expressions of the number's line
  are read from its start (expression_at) up to the one holding the number; one without a LaTeX command, `^` or a
  brace leaves the plain number (prose: 'a 12-pack' is 12)."""
  nums = _numbers(text)
  if not nums:
    return None
  at, number = nums[-1]
  i = max(text.rfind("\n", 0, at) + 1, at - _MAX_LEN)
  while i <= at:
    m = _EXPR_TOKEN.match(text, i)
    if m is None or m.lastgroup == "space":  # a word, or spaces: the next expression starts after them
      i = (m or _SKIP.match(text, i)).end()
      continue
    span, stop = expression_at(text, i)
    if stop > at:
      return span if _LATEX.search(span) and _is_expression(span, False) else number
    i = max(stop, i + 1)
  return number


def last_tagged(text: str) -> str | None:
  """The body of the last `<answer>…</answer>` (each body ends at the first `</answer>` after its `<answer>`), by
  str.find: the regex `<answer>(.*?)</answer>` rescanned the rest of the text from every unclosed `<answer>`."""
  found, pos = None, 0
  while True:
    i = text.find("<answer>", pos)
    j = -1 if i < 0 else text.find("</answer>", i + len("<answer>"))
    if j < 0:
      return found
    found, pos = text[i + len("<answer>"):j], j + len("</answer>")


def extract_answer(text: str, last_number_ok: bool = True) -> str | None:
  """The answer string a completion gives: `<answer>` body, else last `\\boxed{}`, else (if `last_number_ok`) the
  last number. A truncated completion's last number is wherever it was cut, not an answer: callers pass False."""
  body = last_tagged(text)
  if body is not None:
    return body.strip()
  boxed = last_boxed(text)
  if boxed is not None:
    return boxed.strip()
  if not last_number_ok:
    return None
  phrased = phrase_answer(text)
  return phrased if phrased is not None else last_number_answer(text)


def _replace_fracs(s: str) -> str:
  """\\frac{a}{b} -> ((a)/(b)), innermost first; \\frac12 -> ((1)/(2))."""
  s = re.sub(r"\\[dt]?frac\s*(\d)\s*(\d)", r"((\1)/(\2))", s)
  while True:
    m = re.search(r"\\[dt]?frac\s*\{", s)
    if m is None:
      return s
    num = _balanced(s, m.end() - 1)
    if num is None:
      return s
    rest = num[1]
    while rest < len(s) and s[rest] == " ":
      rest += 1
    den = _balanced(s, rest) if rest < len(s) and s[rest] == "{" else None
    if den is None:
      return s
    s = s[:m.start()] + f"(({num[0]})/({den[0]}))" + s[den[1]:]


def normalize(answer: str) -> tuple[str, bool]:
  """(a Python-arithmetic string, whether it was a percentage)."""
  s = answer.strip()
  box = _last_box(s)
  if box is not None and not re.search(r"\d", s[:box[0]] + s[box[2] + 1:]):
    s = s[box[1]:box[2]]  # the box frames the answer ('The answer is $\\boxed{72}$.'); with a number outside it
    # ('71 \\boxed{72}', '\\boxed{2}+3': an extracted box's content) it is part of the answer, and only layout
  s = re.sub(r"^\*\*(.*)\*\*$|^__(.*)__$", lambda m: m.group(1) or m.group(2) or "", s)  # markdown bold
  s = _SPACED.sub(lambda m: re.sub(r"\D", "", m.group(1)), s)  # '37 230', '37\,230', '37{,}230' -> 37230
  s = re.sub(r"\\[()\[\]]", " ", s)           # \( \) \[ \] math delimiters
  # '5\mathrm{cm}', '\textbf{5}'; a unit's power goes with it: '6\text{ cm}^2' is 6 (was read as 6**2 = 36)
  s = re.sub(r"\\(?:text|textrm|textbf|textit|textnormal|mathrm|mathbf|mathit|mathsf|mathtt|mbox|hbox)\s*"
             rf"\{{([^{{}}]*)\}}({_UNIT_POWER})", lambda m: f" {re.sub('[A-Za-z]+', ' ', m.group(1))} {m.group(2)}"
             if re.search(r"\d", m.group(1)) else " ", s)  # a letter in text is a word, never a variable: '\text{5 m}'
  s = re.sub(r"(?:\^\s*(?:\\circ|\{\s*\\circ\s*\})|°)(?:\s*[CF](?![A-Za-z]))?", " ", s)  # degrees: '30^\circ', '25°C'
  s = re.sub(r"\\(?:left|right|displaystyle|,|!|;|:|quad|qquad)", " ", s)
  s = s.replace("\\$", " ").replace("$", " ").replace("\\%", "%")
  s = re.sub(r"([A-Za-z]{2,})" + _UNIT_POWER, r"\1", s)  # '6 cm^2', '6 cm$^2$': a unit's power, not the number's
  percent = "%" in s or bool(re.search(r"\bpercent\b", s))
  s = s.replace("%", " ")
  s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
  s = _replace_fracs(s)
  # Scientific notation, before the 'e' goes as a word: '1.5e3' is 1500 (exponents beyond _MAX_EXPONENT: unparsable).
  # (any number of decimals: '1.25e2' was unparsable, the mantissa read one digit after its point)
  s = re.sub(r"(?<![\w.])(\d+(?:\.\d+)?|\.\d+)[eE]([-+]?\d+)(?!\w|\.\d)", r"(\1*10**(\2))", s)
  s = re.sub(r"\\(?:cdot|times)", "*", s).replace("×", "*").replace("÷", "/").replace("−", "-")
  s = s.replace("\\div", "/").replace("^", "**").replace("{", "(").replace("}", ")")
  if set(re.findall(r"\\([A-Za-z]+)", s)) - _LAYOUT_COMMANDS or _FUNCTION_WORD.search(s):
    return "", percent  # \sqrt{16}, 2\pi, log(100): dropping the function would leave 16, 2, 100
  s = re.sub(r"\\[A-Za-z]+", " ", s)           # the layout commands (units like \mathrm, \circ)
  s = "=".join(s.split("=")[:-1] + [_LETTER_UNIT.sub(r"\1", s.split("=")[-1])])  # '5 m', '12 h', '5 m^2'
  if _VARIABLE.search(s.split("=")[-1]):
    return "", percent  # 'x+1', '2x', '3n': a variable, not a unit word ('5 apples'): not a number
  s = re.sub(r"[A-Za-z_][A-Za-z_']*\.?", " ", s)  # words and units: '18 dollars', 'x = 5' keeps '= 5'
  if "=" in s:                                   # 'x = 5' / '3 + 4 = 7': the right-most side is the answer
    s = s.split("=")[-1]
  s = s.strip().rstrip(".").strip()
  return s, percent


def _eval(node: ast.AST) -> Fraction:
  """Exact arithmetic over a whitelisted AST (numbers, + - * / **, unary +-); anything else raises ValueError."""
  if isinstance(node, ast.Expression):
    return _eval(node.body)
  if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
    return Fraction(repr(node.value)) if isinstance(node.value, float) else Fraction(node.value)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
    v = _eval(node.operand)
    return -v if isinstance(node.op, ast.USub) else v
  if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)):
    a, b = _eval(node.left), _eval(node.right)
    if isinstance(node.op, ast.Add):
      return a + b
    if isinstance(node.op, ast.Sub):
      return a - b
    if isinstance(node.op, ast.Mult):
      return a * b
    if isinstance(node.op, ast.Div):
      if b == 0:
        raise ValueError("division by zero")
      return a / b
    if b.denominator != 1 or abs(b) > _MAX_EXPONENT or (a == 0 and b < 0):
      raise ValueError("exponent must be a small integer")
    if max(a.numerator.bit_length(), a.denominator.bit_length()) * abs(b) > _MAX_BITS:
      raise ValueError("power too large")  # nested powers, ((2^64)^64)^64…, would grow without bound
    return a ** int(b)
  raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")


def _decimal_literals(s: str) -> str:
  """Decimals as exact fractions before parsing, so '0.1' is 1/10 and never the float 0.1000000000000000055…"""
  return re.sub(r"(?<![\w.])(\d*)\.(\d+)", lambda m: f"({int(m.group(1) or 0) * 10 ** len(m.group(2)) + int(m.group(2))}"
                f"/{10 ** len(m.group(2))})", s)


def parse_value(answer: str | None) -> tuple[Fraction, bool] | None:
  """(exact value, is_percent) of an answer string, or None if it is not a number or arithmetic expression."""
  if answer is None or len(answer) > _MAX_LEN:
    return None
  s, percent = normalize(answer)
  if not s or not re.fullmatch(r"[\d\s.+\-*/()]+", s):
    return None
  s = re.sub(r"(?<![\d.])0+(?=\d)", "", s)  # '007' is 7 (Python rejects leading zeros)
  try:
    return _eval(ast.parse(_decimal_literals(s), mode="eval")), percent
  except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError):
    return None


def equal(pred: str | None, gold: str | None) -> bool:
  """Whether two answer strings have the same value; a percentage matches either its number or number/100."""
  p, g = parse_value(pred), parse_value(gold)
  if p is None or g is None:
    return False
  (pv, pp), (gv, gp) = p, g
  if pv == gv:
    return True
  return (pp and pv / 100 == gv) or (gp and gv / 100 == pv)


# A reference's units in \text{…} / \mathrm{…}, its LaTeX commands (parse_value refuses those that change the
# value) and scientific notation's exponent: what may hold letters in a numeric reference.
_UNIT_GROUP = re.compile(r"\\(?:text|textrm|mathrm|mbox)\s*\{[^{}]*\}")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_EXPONENT = re.compile(r"(?<=\d)[eE](?=[-+]?\d)")


def no_variables(text: str) -> bool:
  """No letter outside units (\\text{…}, \\mathrm{…}), LaTeX commands and exponents. parse_value drops bare words as
  units, which suits a completion ('5 apples') but would read a symbolic reference 'x+1' as 1 and 'k=3' as 3, and
  grade a completion '1' right on it: a reference is numeric only if this holds too."""
  return re.search(r"[A-Za-z]", _EXPONENT.sub("", _COMMAND.sub("", _UNIT_GROUP.sub("", text)))) is None
