"""Math answers: extraction, exact-value comparison, safety; agreement with math-verify on a hand-built table."""
import time

import numpy as np
import pytest

from grpo_jax.tasks import gsm8k, math_answer as ma, tokenizer as tokenizer_lib



def is_correct(completion: str, gold: str) -> bool:
  """The completion's extracted answer against the gold answer string (what gsm8k's reward does per row)."""
  return ma.equal(ma.extract_answer(completion), gold)


# (predicted answer, gold, right?) — the right column is by hand; tests check ours and math-verify against it.
CASES = [
    ("72", "72", True), ("\\boxed{72}", "72", True), ("72.0", "72", True), ("72.00", "72", True),
    ("1,000", "1000", True), ("1,234,567", "1234567", True), ("$18", "18", True), ("\\$18.00", "18", True),
    ("18 dollars", "18", True), ("12 apples", "12", True), ("50%", "50", True), ("50\\%", "50", True),
    ("10%", "0.1", True), ("0.5", "\\frac{1}{2}", True), ("\\frac{1}{2}", "0.5", True),
    ("\\dfrac{3}{4}", "0.75", True), ("\\frac34", "0.75", True), ("1/2", "0.5", True),
    ("3/4", "\\frac{3}{4}", True), ("\\boxed{\\frac{3}{4}}", "0.75", True), ("3+4", "7", True),
    ("2*3+1", "7", True), ("2^3", "8", True), ("2^{10}", "1024", True), ("(1+2)*3", "9", True),
    ("3 \\times 4", "12", True), ("12 \\cdot 2", "24", True), ("-5", "-5", True), ("-5", "5", False),
    ("5", "5.0", True), ("0.1+0.2", "0.3", True), ("1/3", "0.3333", False), ("73", "72", False),
    ("72.5", "72", False), ("\\boxed{71}", "72", False), ("1,001", "1000", False), ("\\frac{2}{3}", "0.5", False),
    ("", "72", False), ("seventy-two", "72", False), ("007", "7", True), ("x = 5", "5", True),
    ("\\text{5 cm}", "5", True), ("5 \\text{ cm}", "5", True), ("1.5", "\\frac{3}{2}", True),
    ("\\left(\\frac{1}{4}\\right)", "0.25", True), ("10/0", "72", False),
    # thousands grouped by a space, a thin space (U+2009, LaTeX \\,), a no-break space or {,}; a 2-digit group is
    # two numbers, not thousands
    ("37 230", "37230", True), ("1 234 567", "1234567", True), ("37\u2009230", "37230", True),
    ("37\u202f230", "37230", True), ("\\boxed{37\\,230}", "37230", True), ("\\boxed{37{,}230}", "37230", True),
    ("$37\\,230.50$", "37230.5", True), ("37 23", "3723", False), ("37 230", "37", False),
    # a function or constant is not a unit: dropping it changed the value (\\sqrt{16} read as 16, 2\\pi as 2)
    ("\\sqrt{16}", "16", False), ("sqrt(16)", "16", False), ("2\\pi", "2", False), ("\\ln{5}", "5", False),
    ("log(100)", "100", False), ("\\frac{\\sqrt{3}}{2}", "1.5", False), ("\\lfloor 7/2 \\rfloor", "3.5", False),
    ("\\sin(30)", "30", False),
    # layout commands still typeset units and degrees
    ("5\\mathrm{cm}", "5", True), ("\\textbf{5}", "5", True), ("30^\\circ", "30", True), ("15 min", "15", True),
    # scientific notation is its value (was unparsable, and extracted as the 1.5 before its exponent)
    ("1.5e3", "1500", True), ("2.5E-1", "0.25", True), ("1.5e3", "1.5", False),
    ("1.25e2", "125", True), ("-1.25e2", "-125", True), ("3.125E-2", "0.03125", True), ("1.25e2", "1.25", False),
    # a box inside a box frames part of the answer: the outer box's content is the answer (a box holding two
    # numbers is as wrong as '72 or 73'; the innermost rule graded \boxed{71 \boxed{72}} right and \boxed{\boxed{2}+3}
    # as 2)
    ("\\boxed{\\boxed{72}}", "72", True), ("\\boxed{\\boxed{2}+3}", "5", True), ("\\boxed{\\boxed{2}+3}", "2", False),
    ("\\boxed{71 \\boxed{72}}", "72", False), ("\\boxed{71} \\boxed{72}", "72", False),  # one answer, two boxes
    # a unit's power belongs to the unit (6\text{ cm}^2 was read as 36), on either side
    ("6\\text{ cm}^2", "6", True), ("6 \\mathrm{cm}^{2}", "6", True), ("6 cm^2", "6", True), ("36", "6\\text{ cm}^2", False),
    ("6\\text{ cm}^2", "36", False), ("27", "3 \\text{ cm}^3", False), ("25°C", "25", True), ("10^{\\circ}C", "10", True),
    # a single letter is a variable, not a unit: an expression is not the number it holds (x+1 was 1, 2x was 2)
    ("x+1", "1", False), ("2x", "2", False), ("3+2i", "5", False), ("n = 2k", "2", False), ("k = 3", "3", True), ("5 m", "5", True), ("5 m^2", "5", True), ("2 m + 1", "3", False), ("3 + 2 i", "5", False), ("\\text{5 m}", "5", True),
    # a letter after a lone number and a space is a unit only if it is one (m g s h l L K N J W V): '2 x' was 2
    ("2 x", "2", False), ("3 n", "3", False), ("12 s", "12", True), ("4 L", "4", True),
    # MATH's thousands separator `,\!` (its solutions write 10,\!080; was unparsable on either side)
    ("1,\\!000", "1000", True), ("\\boxed{10,\\!080}", "10080", True), ("1000", "1,\\!000", True), ("1,\\!00", "100", False),
]
# Where math-verify (0.9.0) gives the other answer, and why we keep ours:
KNOWN_DIFFERENCES = {
    # math-verify parses LaTeX only inside $…$ or \boxed; the test wraps LaTeX-looking answers in $…$, but a
    # \text{} holding the whole answer stays text to it, while we drop the unit words.
    "\\text{5 cm}": "units inside \\text{} are stripped by us; math-verify finds no number",
    "\\text{5 m}": "units inside \\text{} are stripped by us; math-verify finds no number",
    # math-verify reads `\,` and thin / narrow no-break spaces as a separator between two numbers; in an answer they
    # are the SI thousands separator (a human grader reads 37 230).
    "37\u2009230": "a thin space groups thousands for us; math-verify reads 37",
    "37\u202f230": "a narrow no-break space groups thousands for us; math-verify reads 37",
    "\\boxed{37\\,230}": "LaTeX's thin space \\, groups thousands for us; math-verify reads 37",
    "$37\\,230.50$": "LaTeX's thin space \\, groups thousands for us; math-verify reads 37",
    # math-verify (0.9.0) does not read e-notation outside LaTeX; a human grader reads 1.5e3 as 1500.
    "1.5e3": "scientific notation is its value for us; math-verify finds no match",
    "2.5E-1": "scientific notation is its value for us; math-verify finds no match",
    "1.25e2": "scientific notation is its value for us; math-verify finds no match",
    "-1.25e2": "scientific notation is its value for us; math-verify finds no match",
    "3.125E-2": "scientific notation is its value for us; math-verify finds no match",
    # math-verify (0.9.0) reads the innermost of nested boxes; the outer box is what the reader sees as the answer
    "\\boxed{\\boxed{2}+3}": "the outer box (2+3) for us; math-verify reads the inner box (2)",
    "\\boxed{71 \\boxed{72}}": "two numbers in the outer box for us (wrong); math-verify reads the inner 72",
    # math-verify's plain-text extraction reads the first number out of an answer outside $…$ (as $2x$ it is 2*x, not 2)
    "2x": "a variable makes it an expression for us; math-verify's plain-text extraction reads 2",
    "n = 2k": "a variable makes it an expression for us; math-verify's plain-text extraction reads 2",
    "3 + 2 i": "a variable makes it an expression for us; math-verify's plain-text extraction reads 3 + 2 = 5",
    "2 x": "a variable after a space is no unit for us; math-verify's plain-text extraction reads 2",
    "3 n": "a variable after a space is no unit for us; math-verify's plain-text extraction reads 3",
    "10^{\\circ}C": "degrees Celsius are a unit for us; math-verify reads 10^{\\circ} times a symbol C",
    "1000": "against the gold 1,\\!000 outside $…$ math-verify's plain-text extraction reads 1 (in $…$ it reads 1000)",
}


def _math_verify_equal(pred: str, gold: str) -> bool:
  from math_verify import parse, verify
  latexish = any(c in pred for c in "\\{}")
  p = parse(f"${pred}$" if latexish else pred, parsing_timeout=None)  # timeouts use signals: off outside main
  return bool(verify(parse(gold, parsing_timeout=None), p, timeout_seconds=None))


@pytest.mark.parametrize("pred,gold,want", CASES)
def test_ours_on_the_table(pred, gold, want):
  assert ma.equal(pred, gold) is want


def test_math_verify_agrees_except_where_documented():
  disagree = {pred for pred, gold, want in CASES if _math_verify_equal(pred, gold) != want}
  assert disagree == set(KNOWN_DIFFERENCES), disagree


@pytest.mark.parametrize("text,want", [
    ("<think> 9 * 2 = 18 </think> <answer> $18 </answer>", "$18"),
    ("<answer>3</answer> oops <answer> 5 </answer>", "5"),           # the last answer block
    ("<think>\\boxed{1}</think><answer>2</answer>", "2"),             # tags beat \boxed
    ("so \\boxed{\\frac{1}{2}} and then \\boxed{\\frac{3}{4}} done", "\\frac{3}{4}"),  # last box, nested braces
    ("The answer is $\\boxed{1,200}$.", "1,200"),
    ("She sells 16 - 3 - 4 = 9 eggs and earns 9 * 2 = $18 every day.", "18"),
    ("Total: 1,234.5 miles, i.e. 3/4 of it", "3/4"),
    ("no number here", None),
    ("\\boxed{unclosed 5", "5"),                                         # an unbalanced box falls back to numbers
    ("The answer is 37230. I used 34 boxes.", "37230"),                # an explicit answer beats numbers after it
    ("so the final answer: $1,200 (for 3 weeks)", "1,200"),
    ("Answer = -4; check: 2 - 6 = -4 and 9", "-4"),
    ("the answer is 5, no wait, the answer is 6. Done in 2 steps", "6"),  # the last phrase
    ("9 * 8 = 72\n#### 72 (over 3 days)", "72"),                       # GSM8K's marker
    ("so 37\u2009230 people came", "37\u2009230"),                     # a thin-space group read whole
    ("I have 3 100 dollar bills", "100"),                               # a plain space in prose does not group
    ("The answer is 1.5e3.", "1.5e3"),                                   # an exponent is part of its number
    ("so \\boxed{\\boxed{2}+3}.", "\\boxed{2}+3"),                     # the outermost box of the last one
    ("\\boxed{1} then \\boxed{\\fbox{2}} end", "\\fbox{2}"),
    ("\\boxed{ \\boxed{5}", "5"),                                         # an unclosed outer box: the inner one
    ("}} \\boxed{7}}", "7"),                                               # stray closing braces around a box
    ("<answer> 3 <answer> 4 </answer> 5 </answer>", "3 <answer> 4"),     # a body ends at the first </answer>
    ("<answer> 3 </answer> <answer> 4", "3"),                            # an unclosed last block is no body
    ("The answer: = 42, then 7 more", "42"),                            # two of ':' / '=' after the phrase
    ("Answer := 1,200 and 3 more", "1,200"),
    ("so the total is 1,\\!000 dollars", "1,\\!000"),                   # MATH's separator read whole (was '000')
    # a LaTeX fraction after the phrase (DAPO's 'Answer: $Answer' line): the fraction, not its denominator
    ("So\nAnswer: $\\frac{1}{2}$", "\\frac{1}{2}"), ("The final answer is $-\\dfrac{3}{4}$. Check: 2", "-\\dfrac{3}{4}"),
    ("#### \\frac12 cups", "\\frac12"), ("Answer: \\frac{x}{ 2 }", "\\frac{x}{ 2 }"), ("Answer: \\frac{1 then 7", "7"),
])
def test_extract_answer(text, want):
  assert ma.extract_answer(text) == want


# Completions end to end (extraction, then the numeric grader), and what math-verify's own extraction (its `parse` of
# the whole completion, default configs) makes of them. The class: an answer line holding LaTeX commands or spaces
# inside its expression was read as the first (or last) NUMBER in it: 2 of 'Answer: \sqrt{2}', of 'Answer: 2 x', of
# 'Final answer: 2^{10}', of 'so x = \sqrt{2}'. Now the phrase's answer, or the expression around the last number
# when it is written in LaTeX, is read whole.
COMPLETIONS = [
    ("Answer: \\sqrt{2}", "2", False), ("Answer: 2 x", "2", False), ("The answer is 2 x.", "2", False),
    ("The answer is x + 1.", "1", False), ("Final answer: 2^{10}", "1024", True), ("Final answer: 2^{10}", "2", False),
    ("Answer: 3\\sqrt{2} cm", "3", False), ("Answer: 2\\sqrt{2}+1", "2", False), ("Answer: (1, 2)", "2", False),
    ("so the area is $2\\pi$.", "2", False), ("We get $x = \\sqrt{2}$ so we are done", "2", False),
    ("so x = \\sqrt{2}", "2", False), ("so she pays 2^{3} = 8 dollars", "8", True),
    # what must still hold: units, prose after the answer, currency, markdown, a variable named in an equation
    ("Answer: 5 m", "5", True), ("Answer: 12 h", "12", True), ("The answer is 18 dollars.", "18", True),
    ("The answer is 6 because 2 + 3 = 5", "6", True), ("The answer is $1,200 and then $300 more", "1200", True),
    ("the answer is a prime number, 7", "7", True), ("**Answer:** 12", "12", True),
    ("Answer: $\\frac{1}{2}$", "0.5", True), ("The answer is 3 x 4 = 12", "12", True), ("so x = 5", "5", True),
    ("she bought a 12-pack", "12", True), ("The answer is a) 5", "5", True),
    ("Let the answer is x. Then 2x = 10 so x = 5", "5", True), ("The answer is 10 - 2 = 8 apples", "8", True),
]
# Where math-verify's extraction gives the other verdict, and why ours stands.
COMPLETION_DIFFERENCES = {
    "Answer: 2 x": "math-verify's plain-text extraction reads the number 2 out of '2 x'; for us it is an expression",
    "The answer is 2 x.": "math-verify's plain-text extraction reads 2; for us '2 x' is an expression",
    "The answer is x + 1.": "math-verify's plain-text extraction reads 1; for us 'x + 1' is an expression",
    "Final answer: 2^{10}": "math-verify reads LaTeX only inside $…$ or a box: it reads 2 of '2^{10}'",
    "Answer: 3\\sqrt{2} cm": "math-verify reads LaTeX only inside $…$ or a box: it reads 3",
    "Answer: 2\\sqrt{2}+1": "math-verify reads LaTeX only inside $…$ or a box: it reads 2",
    "Answer: (1, 2)": "math-verify's plain-text extraction reads 2 of the tuple",
    "The answer is 6 because 2 + 3 = 5": "math-verify reads the last expression (5), not the answer the phrase names",
    "The answer is $1,200 and then $300 more": "math-verify reads '$1,200 and then $' as one LaTeX span (a set); "
                                               "the '$' are dollars",
}


def _math_verify_text(text: str, gold: str) -> bool:
  from math_verify import parse, verify
  return bool(verify(parse(gold, parsing_timeout=None), parse(text, parsing_timeout=None), timeout_seconds=None))


@pytest.mark.parametrize("text,gold,want", COMPLETIONS)
def test_completions_read_the_answer_expression(text, gold, want):
  assert is_correct(text, gold) is want


def test_math_verify_extraction_agrees_except_where_documented():
  disagree = {text for text, gold, want in COMPLETIONS if _math_verify_text(text, gold) != want}
  assert disagree == set(COMPLETION_DIFFERENCES), disagree


def test_is_correct_on_completions():
  assert is_correct("Janet earns 9 * 2 = $18 every day.", "18")
  assert is_correct("so \\boxed{\\frac{36}{2}}", "18")
  assert not is_correct("<answer> 17 </answer> but really \\boxed{18}", "18")  # the tagged answer is the one
  # nested boxes, through extraction AND comparison (the extracted content '71 \\boxed{72}' was unwrapped again to 72)
  assert not is_correct("so \\boxed{71 \\boxed{72}}", "72") and not is_correct("\\fbox{-5\\boxed{1,200}}", "1200")
  assert is_correct("so \\boxed{\\boxed{2}+3}.", "5") and not is_correct("so \\boxed{\\boxed{2}+3}.", "2")
  assert is_correct("\\boxed{\\boxed{72}}", "72") and is_correct("<answer> The answer is $\\boxed{72}$. </answer>", "72")
  assert not is_correct("<answer> \\boxed{71} \\boxed{72} </answer>", "72")  # two boxes in one answer


def test_values_are_exact():
  assert ma.parse_value("0.1+0.2") == (ma.Fraction(3, 10), False)  # floats would give 0.30000000000000004
  assert ma.parse_value("12.5%") == (ma.Fraction(25, 2), True)
  assert ma.parse_value("-\\frac{7}{2}") == (ma.Fraction(-7, 2), False)


@pytest.mark.parametrize("evil", ["__import__('os').system('echo hi')", "(lambda: 1)()", "[1, 2][0]",
                                  "2**10**10", "9^99999", "((((((2^64)^64)^64)^64)^64)^64)", "1" * 500, "((((((((((1))))))))))" * 30, "1 if 1 else 2"])
def test_never_evaluates_code_or_hangs(evil):
  t0 = time.perf_counter()
  assert ma.parse_value(evil) is None
  assert time.perf_counter() - t0 < 0.5


# Completions a policy can write to stall the grader (each ran for seconds to minutes, in the reward's worker thread,
# where a call past rl.reward_timeout_s stops the run): the phrase regex backtracked cubically over whitespace, and
# the boxes, answer blocks and thin-space groups were rescanned per occurrence (quadratic).
_SLOW = {
    "phrase then spaces": "the answer" + " " * 400,  # cubic: 400 spaces took ~4 s, 10,000 for ever
    "phrase, colon, dollar, spaces": "final answer : $" + " " * 400,
    "nested boxes": "\\boxed{" * 3000 + "}" * 3000,
    "unclosed answer blocks": "<answer>" * 5000,
    "thin-space groups and numbers": "1\u2009000 2 " * 4000,
    "many answer phrases": "the answer is 1 " * 2500,
    "tag pairs": "<think>" + "</think><answer></answer>" * 1600 + "x",
    "phrases before unclosed fractions": "answer: \\frac{" * 2000,
    "phrases before deep fractions": ("answer: \\frac{" + "{" * 90 + "}" * 90) * 100,
}


@pytest.mark.parametrize("name", list(_SLOW))
def test_adversarial_long_completions_grade_fast(name):
  text = _SLOW[name]
  t0 = time.perf_counter()
  gsm8k.grade_text(text, "72")
  gsm8k.grade_text(text, "72", prompt_format="chat")
  assert time.perf_counter() - t0 < 0.5, name


def test_gsm8k_rewards_use_the_verifier():
  tok = tokenizer_lib.load()
  finals = ["1000", "1000", "1000", "1000", "1000", "18"]
  bodies = [" $1,000.00 ", " 1000 dollars ", " \\boxed{1000} ", " 2000/2 ", " 1001 ", " 18 "]
  comps = [f"<think> x </think> <answer>{b}</answer>" for b in bodies[:-1]] + ["<think> 9 * 2 = 18 </think> 18"]
  ids = [tok.encode(c) for c in comps]  # the PyRewardFn form: completion ids without the trailing EOS
  batch = {"answer_chars_NxA": gsm8k.encode_answers(finals)}
  texts = [tok.decode(i) for i in ids]
  terms = gsm8k.make_rewards(tok)
  # Accuracy reads the <answer> body, else (the last row, untagged) the last number; format is its own term.
  assert terms["math_accuracy"](texts, ids, batch) == [1.0, 1.0, 1.0, 1.0, 0.0, 1.0]
  assert terms["math_format"](texts, ids, batch) == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
  tokens = np.zeros((len(ids), 32), np.int32)
  mask = np.zeros_like(tokens)
  for r, row in enumerate(ids):
    tokens[r, :len(row) + 1], mask[r, :len(row) + 1] = row + [tok.eos_id], 1
  acc, fmt, _ = gsm8k.host_verifier(tok)(tokens, mask, batch)
  np.testing.assert_array_equal(acc, [1, 1, 1, 1, 0, 1])
  np.testing.assert_array_equal(fmt, [1, 1, 1, 1, 1, 0])
