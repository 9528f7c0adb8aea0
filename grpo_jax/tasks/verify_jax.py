"""In-graph verifiers on token ids (jittable, vmap-able); the grammar is verify_py's docstring, and the two agree.

Answer and think bodies are read as a stream of character classes: each token id maps (via a table built once from
the tokenizer) to the classes of its piece's characters, runs of spaces and of "other" characters collapsed (they act
the same in every rule), padded with NONE to width C. Small state machines then run in `lax.scan` over the
L*C classes: an integer parser (arith), a two-stack shunting-yard evaluator with a fixed stack depth (countdown; the
language's paren-depth limit keeps it within the stacks), and a 6-lexeme shift register for CoT steps.
"""
from __future__ import annotations

import functools
from typing import Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.tasks import tokenizer as tokenizer_lib
from grpo_jax.tasks import verify_py
from grpo_jax.tasks.arith import INTEGER_ANSWER
from grpo_jax.tasks.countdown import MAX_ABS, MAX_PAREN_DEPTH

# Character classes.
NONE, SPACE, D0 = 0, 1, 2  # digits d -> D0 + d
PLUS, MINUS, MUL, DIV, LP, RP, EQ, SEMI, OTHER = range(12, 21)
_CHAR = {" ": SPACE, "+": PLUS, "-": MINUS, "*": MUL, "/": DIV, "(": LP, ")": RP, "=": EQ, ";": SEMI}
_MAX_DIGITS = 9
_STACK = 32  # >= 3 * (MAX_PAREN_DEPTH + 1): per nesting level at most '(' + two pending ops / values


class TokenTables(NamedTuple):
  """Per-token lookup tables built once from the tokenizer (numpy, closed over as constants when jitted)."""
  chars_VxC: np.ndarray   # int32 char classes per token
  is_space_V: np.ndarray  # bool: piece is whitespace only
  is_bad_V: np.ndarray    # bool: control / unknown token
  tags: tuple[int, int, int, int]
  eos: tuple[int, ...]    # every id that ends a completion (an HF instruct tokenizer's eos_ids)


def _classes(text: str) -> list[int]:
  out: list[int] = []
  for ch in text:
    c = D0 + int(ch) if ch in "0123456789" else _CHAR.get(ch, OTHER)
    if c in (SPACE, OTHER) and out and out[-1] == c:
      continue
    out.append(c)
  return out


def token_tables(tok: tokenizer_lib.Tokenizer | None = None) -> TokenTables:
  tok = tok or tokenizer_lib.load()
  texts = tok.piece_texts()
  rows = [_classes(t) for t in texts]
  width = max(len(r) for r in rows)
  chars = np.zeros((len(texts), width), np.int32)
  for i, r in enumerate(rows):
    chars[i, :len(r)] = r
  is_space = np.asarray([bool(t) and set(t) == {" "} for t in texts])
  is_bad = np.zeros(len(texts), bool)
  # An HF tokenizer without an unk token has unk_id -1, which as an index marked the LAST id (a tag token, where
  # the tags were added last) as a control token.
  is_bad[[i for i in (tok.pad_id, tok.bos_id, tok.unk_id) if 0 <= i < len(texts)]] = True
  tags = tuple(tok.tag_ids[t] for t in tokenizer_lib.TAGS)
  return TokenTables(chars, is_space, is_bad, tags, verify_py.eos_ids(tok))


@functools.lru_cache(maxsize=1)
def default_tables() -> TokenTables:
  return token_tables(tokenizer_lib.load())


_TABLES: dict[int, tuple] = {}  # id(tokenizer) -> (tokenizer, its TokenTables): built once per tokenizer object


def tables_for(tok) -> TokenTables | None:
  """The tables of the tokenizer a run samples with: the shipped tokenizer's (`default_tables`) when `tok` has its
  vocabulary size and tag ids; built from `tok`'s pieces otherwise (task.tokenizer='tools': pieces 512-515 are the
  tool-call markers, text like any other piece, not ids outside the vocabulary); None for a tokenizer without the
  four tag tokens or piece texts (the caller keeps its old argument, which says what is wrong)."""
  d = default_tables()
  tags = getattr(tok, "tag_ids", None) or {}
  if tok is None or (getattr(tok, "vocab_size", None) == d.is_space_V.shape[0]
                     and tuple(tags.get(t) for t in tokenizer_lib.TAGS) == d.tags):
    return d
  if not hasattr(tok, "piece_texts") or any(t not in tags for t in tokenizer_lib.TAGS):
    return None
  if id(tok) not in _TABLES:
    _TABLES[id(tok)] = (tok, token_tables(tok))  # the tokenizer kept alive, so its id is not reused
  return _TABLES[id(tok)][1]


def _as_tables(tables) -> TokenTables:
  """TokenTables, or None / a tag_ids dict (name -> id) meaning the shipped tokenizer's tables."""
  if isinstance(tables, TokenTables):
    return tables
  default = default_tables()
  if tables is None:
    return default
  if isinstance(tables, Mapping) and tuple(tables.get(t) for t in tokenizer_lib.TAGS) == default.tags:
    return default
  raise ValueError(f"tables={tables!r} must be verify_jax.token_tables(tokenizer) (or the shipped tokenizer's "
                   "tag_ids); build TokenTables from the tokenizer you sample with")


class _Parse(NamedTuple):
  ok_N: jax.Array
  think_NxL: jax.Array   # token inside the think body
  answer_NxL: jax.Array  # token inside the answer body


def _parse(tokens_NxL, mask_NxL, tables: TokenTables) -> _Parse:
  n, length = tokens_NxL.shape
  vocab = tables.is_bad_V.shape[0]
  tok = tokens_NxL.astype(jnp.int32)
  valid = jnp.cumprod(mask_NxL.astype(jnp.int32) > 0, axis=1).astype(bool)
  pos = jnp.arange(length)[None, :]
  is_eos = jnp.isin(tok, jnp.asarray(tables.eos, jnp.int32)) & valid
  has_eos = is_eos.any(1)
  e = jnp.argmax(is_eos, 1)[:, None]
  before = valid & (pos < e)
  in_vocab = (tok >= 0) & (tok < vocab)
  safe = jnp.clip(tok, 0, vocab - 1)
  bad = before & (~in_vocab | jnp.asarray(tables.is_bad_V)[safe])
  ok = has_eos & ~bad.any(1)
  p = []
  for tag in tables.tags:
    hit = before & (tok == tag)
    ok &= hit.sum(1) == 1
    p.append(jnp.argmax(hit, 1)[:, None])
  p0, p1, p2, p3 = p
  ok &= (p0[:, 0] == 0) & (p1 > p0)[:, 0] & (p2 > p1)[:, 0] & (p3 > p2)[:, 0] & (p3 == e - 1)[:, 0]
  between = (pos > p1) & (pos < p2)
  ok &= (~between | jnp.asarray(tables.is_space_V)[safe]).all(1)
  think = ok[:, None] & (pos > p0) & (pos < p1)
  answer = ok[:, None] & (pos > p2) & (pos < p3)
  return _Parse(ok, think, answer)


def format_reward(tokens_NxL, mask_NxL, tables: TokenTables | Mapping[str, int] | None = None) -> jax.Array:
  """1.0 where the completion matches the format grammar (verify_py docstring), else 0.0."""
  return _parse(tokens_NxL, mask_NxL, _as_tables(tables)).ok_N.astype(jnp.float32)


def _char_stream(tokens_NxL, region_NxL, tables: TokenTables):
  """Char classes N x (L*C) of the tokens inside `region` (NONE elsewhere), and each char's token index."""
  vocab, width = tables.chars_VxC.shape
  safe = jnp.clip(tokens_NxL.astype(jnp.int32), 0, vocab - 1)
  chars = jnp.asarray(tables.chars_VxC)[safe]  # N x L x C
  chars = jnp.where(region_NxL[..., None], chars, NONE)
  n, length = tokens_NxL.shape
  return chars.reshape(n, length * width), width


# --- arithmetic answer: optional spaces, optional '-', 1..9 digits, optional spaces ------------------------------
def _arith_row(chars_K):
  def step(s, c):
    phase, neg, nd, val, err = s  # phase 0 leading spaces, 1 after '-', 2 digits, 3 trailing spaces
    is_d = (c >= D0) & (c < D0 + 10)
    err |= (c == OTHER) | ((c >= PLUS) & (c != MINUS) & (c != NONE))
    err |= (c == SPACE) & (phase == 1)
    err |= (c == MINUS) & (phase != 0)
    err |= is_d & (phase == 3)
    neg = neg | ((c == MINUS) & (phase == 0))
    val = jnp.where(is_d & (nd < _MAX_DIGITS), val * 10 + (c - D0), val)
    nd = nd + is_d
    phase = jnp.where(c == MINUS, 1, phase)
    phase = jnp.where(is_d, 2, phase)
    phase = jnp.where((c == SPACE) & (phase == 2), 3, phase)
    return (phase, neg, nd, val, err), None

  z = jnp.int32(0)
  (phase, neg, nd, val, err), _ = jax.lax.scan(step, (z, False, z, z, False), chars_K)
  ok = ~err & (phase >= 2) & (nd <= _MAX_DIGITS)
  return ok, jnp.where(neg, -val, val)


# --- countdown answer: two-stack evaluator ---------------------------------------------------------------------------
_OP_CODE = {PLUS: 1, MINUS: 2, MUL: 3, DIV: 4}
_LPAREN = 5


class _CD(NamedTuple):
  err: jax.Array
  nlen: jax.Array
  nval: jax.Array
  expect_op: jax.Array
  vals: jax.Array
  vsp: jax.Array
  ops: jax.Array
  osp: jax.Array
  depth: jax.Array
  used: jax.Array


_END = 21  # appended after the answer's last char: closes the number, reduces everything pending


def _get(stack, i):
  return jnp.sum(jnp.where(jnp.arange(_STACK) == i, stack, 0))


def _put(stack, i, v, cond):
  return jnp.where((jnp.arange(_STACK) == i) & cond, v, stack)


def _top_op(s: _CD):
  return jnp.where(s.osp > 0, _get(s.ops, s.osp - 1), 0)


def _reduce(s: _CD, cond) -> _CD:
  """Pops one operator and two values and pushes the result, where cond."""
  cond = cond & ~s.err & (s.vsp >= 2)
  op = _top_op(s)
  b = _get(s.vals, s.vsp - 1)
  a = _get(s.vals, s.vsp - 2)
  safe_b = jnp.where(b == 0, 1, b)
  mul_ok = (b == 0) | (jnp.abs(a) <= (MAX_ABS - 1) // jnp.abs(safe_b))
  div_ok = (b != 0) & (jnp.remainder(a, safe_b) == 0)
  r = jnp.select([op == 1, op == 2, op == 3], [a + b, a - b, jnp.where(mul_ok, a * b, 0)],
                 jnp.floor_divide(a, safe_b))
  bad = ((op == 3) & ~mul_ok) | ((op == 4) & ~div_ok) | (jnp.abs(r) >= MAX_ABS)
  return s._replace(err=s.err | (cond & bad), vals=_put(s.vals, s.vsp - 2, r, cond), vsp=s.vsp - cond,
                    osp=s.osp - cond)


def _countdown_row(chars_K, numbers_M, nmask_M):
  def step(s: _CD, c):
    is_d = (c >= D0) & (c < D0 + 10)
    is_op = (c >= PLUS) & (c <= DIV)
    is_lp, is_rp, is_end = c == LP, c == RP, c == _END
    err = s.err | (is_d & s.expect_op & (s.nlen == 0)) | (c == OTHER) | (c == EQ) | (c == SEMI)
    nval = jnp.where(is_d & (s.nlen < _MAX_DIGITS), s.nval * 10 + (c - D0), s.nval)
    nlen = s.nlen + is_d
    # Any other char (not NONE) ends a pending number literal: take it from the multiset, push it.
    fin = ~is_d & (c != NONE) & (nlen > 0)
    match = (numbers_M == nval) & nmask_M & ~s.used
    first = jnp.arange(match.shape[0]) == jnp.argmax(match)
    err |= fin & ((nlen > _MAX_DIGITS) | ~match.any())
    s = s._replace(err=err, used=s.used | (fin & first & match), vals=_put(s.vals, s.vsp, nval, fin),
                   vsp=s.vsp + fin, nlen=jnp.where(fin, 0, nlen), nval=jnp.where(fin, 0, nval),
                   expect_op=s.expect_op | fin)
    s = s._replace(err=s.err | ((is_op | is_rp | is_end) & ~s.expect_op) | (is_lp & s.expect_op))
    prec = jnp.where((c == MUL) | (c == DIV), 2, 1)
    for _ in range(2):  # at most two pending operators per nesting level (module docstring)
      top = _top_op(s)
      arith_top = (top >= 1) & (top <= 4)
      top_prec = jnp.where(top >= 3, 2, 1)
      s = _reduce(s, arith_top & ((is_op & (top_prec >= prec)) | is_rp | is_end))
    code = jnp.select([c == PLUS, c == MINUS, c == MUL, c == DIV], [1, 2, 3, 4], _LPAREN)
    push = is_op | is_lp
    s = s._replace(ops=_put(s.ops, s.osp, code, push), osp=s.osp + push,
                   expect_op=jnp.where(is_op | is_lp, False, s.expect_op))
    s = s._replace(err=s.err | (is_rp & (_top_op(s) != _LPAREN)) | (is_end & (s.osp != 0)))
    s = s._replace(osp=s.osp - (is_rp & (s.osp > 0)), depth=s.depth + is_lp - is_rp)
    s = s._replace(err=s.err | (s.depth > MAX_PAREN_DEPTH))
    return s, None

  z = jnp.int32(0)
  m = numbers_M.shape[0]
  init = _CD(jnp.bool_(False), z, z, jnp.bool_(False), jnp.zeros(_STACK, jnp.int32), z,
             jnp.zeros(_STACK, jnp.int32), z, z, jnp.zeros(m, bool))
  chars_K = jnp.concatenate([chars_K, jnp.full((1,), _END, chars_K.dtype)])
  s, _ = jax.lax.scan(step, init, chars_K)
  return ~s.err & (s.vsp == 1), s.vals[0]


def answer_value(task, tokens_NxL, mask_NxL, batch: dict, tables: TokenTables | Mapping[str, int] | None = None):
  """(valid_N, value_N): whether the format is OK and the answer body parses/evaluates under `task`'s rule."""
  task = getattr(task, "name", task)
  if task not in INTEGER_ANSWER + ("countdown",):
    raise ValueError(f"task={task!r} has no in-graph verifier; use one of {INTEGER_ANSWER + ('countdown',)}")
  tables = _as_tables(tables)
  p = _parse(tokens_NxL, mask_NxL, tables)
  chars, _ = _char_stream(tokens_NxL, p.answer_NxL, tables)
  if task in INTEGER_ANSWER:
    ok, val = jax.vmap(_arith_row)(chars)
  else:
    ok, val = jax.vmap(_countdown_row)(chars, jnp.asarray(batch["numbers_NxM"]).astype(jnp.int32),
                                       jnp.asarray(batch["numbers_mask_NxM"]).astype(bool))
  ok &= p.ok_N
  return ok, jnp.where(ok, val, 0)


def _integer_accuracy(task: str, tokens_NxL, mask_NxL, batch, tables) -> jax.Array:
  ok, val = answer_value(task, tokens_NxL, mask_NxL, batch, tables)
  return (ok & (val == jnp.asarray(batch["answer_N"]).astype(jnp.int32))).astype(jnp.float32)


def arith_accuracy(tokens_NxL, mask_NxL, batch, tables=None) -> jax.Array:
  return _integer_accuracy("arith", tokens_NxL, mask_NxL, batch, tables)


def sums_accuracy(tokens_NxL, mask_NxL, batch, tables=None) -> jax.Array:
  return _integer_accuracy("sums", tokens_NxL, mask_NxL, batch, tables)


def countdown_accuracy(tokens_NxL, mask_NxL, batch, tables=None) -> jax.Array:
  ok, val = answer_value("countdown", tokens_NxL, mask_NxL, batch, tables)
  return (ok & (val == jnp.asarray(batch["target_N"]).astype(jnp.int32))).astype(jnp.float32)


# --- CoT steps: shift register of the last 6 lexemes ----------------------------------------------------------------
_LEX_NONE, _LEX_NUM, _LEX_EQ, _LEX_OTHER = 0, 1, 6, 7  # ops are 2..5 = PLUS..DIV - PLUS + 2
_REG = 6


def _step_row(chars_K, width: int, max_steps: int):
  def push(kinds, vals, ovf, kind, val, of, cond):
    kinds = jnp.where(cond, jnp.concatenate([kinds[1:], kind[None]]), kinds)
    vals = jnp.where(cond, jnp.concatenate([vals[1:], val[None]]), vals)
    ovf = jnp.where(cond, jnp.concatenate([ovf[1:], of[None]]), ovf)
    return kinds, vals, ovf

  def score(kinds, vals, ovf):
    is_op = (kinds >= 2) & (kinds <= 5)
    p5 = (kinds[1] == _LEX_NUM) & is_op[2] & (kinds[3] == _LEX_NUM) & (kinds[4] == _LEX_EQ) & (kinds[5] == _LEX_NUM)
    p6 = ((kinds[0] == _LEX_NUM) & is_op[1] & (kinds[2] == _LEX_NUM) & (kinds[3] == _LEX_EQ)
          & (kinds[4] == MINUS - PLUS + 2) & (kinds[5] == _LEX_NUM))
    a = jnp.where(p6, vals[0], vals[1])
    op = jnp.where(p6, kinds[1], kinds[2]) - 2 + PLUS
    b = jnp.where(p6, vals[2], vals[3])
    c = jnp.where(p6, -vals[5], vals[5])
    of = jnp.where(p6, ovf[0] | ovf[2], ovf[1] | ovf[3]) | ovf[5]
    sb = jnp.where(b == 0, 1, b)
    right = jnp.select(
        [op == PLUS, op == MINUS, op == MUL],
        [a + b == c, a - b == c,
         jnp.where(b == 0, c == 0, (jnp.remainder(c, sb) == 0) & (jnp.floor_divide(c, sb) == a))],
        (b != 0) & (jnp.remainder(a, sb) == 0) & (jnp.floor_divide(a, sb) == c))
    return ((p5 | p6) & ~of & right).astype(jnp.float32)

  def step(s, kc):
    k, c = kc
    run_val, run_len, kinds, vals, ovf, nsteps, scores, ends = s
    is_d = (c >= D0) & (c < D0 + 10)
    run_val = jnp.where(is_d & (run_len < _MAX_DIGITS), run_val * 10 + (c - D0), run_val)
    run_len = run_len + is_d
    flush = ~is_d & (c != NONE) & (run_len > 0)
    kinds, vals, ovf = push(kinds, vals, ovf, jnp.int32(_LEX_NUM), run_val, run_len > _MAX_DIGITS, flush)
    run_val, run_len = jnp.where(flush, 0, run_val), jnp.where(flush, 0, run_len)
    lex = jnp.select([(c >= PLUS) & (c <= DIV), c == EQ], [c - PLUS + 2, _LEX_EQ], _LEX_OTHER)
    is_lex = ~is_d & (c != NONE) & (c != SPACE) & (c != SEMI)
    kinds, vals, ovf = push(kinds, vals, ovf, lex.astype(jnp.int32), jnp.int32(0), jnp.bool_(False), is_lex)
    semi = c == SEMI
    slot = jnp.minimum(nsteps, max_steps - 1)
    rec = semi & (nsteps < max_steps)
    hit = rec & (jnp.arange(max_steps) == slot)
    scores = jnp.where(hit, score(kinds, vals, ovf), scores)
    ends = jnp.where(hit, k // width, ends)
    nsteps = nsteps + semi
    kinds = jnp.where(semi, _LEX_NONE, kinds)
    return (run_val, run_len, kinds, vals, ovf, nsteps, scores, ends), None

  z = jnp.int32(0)
  init = (z, z, jnp.zeros(_REG, jnp.int32), jnp.zeros(_REG, jnp.int32), jnp.zeros(_REG, bool), z,
          jnp.zeros(max_steps, jnp.float32), jnp.zeros(max_steps, jnp.int32))
  s, _ = jax.lax.scan(step, init, (jnp.arange(chars_K.shape[0]), chars_K))
  nsteps, scores, ends = s[5], s[6], s[7]
  return scores, ends, jnp.arange(max_steps) < nsteps


def step_rewards(task, tokens_NxL, mask_NxL, batch, max_steps: int, tables: TokenTables | Mapping[str, int] | None = None):
  """(scores_NxS, end_pos_NxS, valid_NxS) for the CoT steps of the think body (cot.py rule; format OK required).

  end_pos is the index of the token holding the step's ';'. The rule is the same for every task."""
  del task, batch  # task-independent: every step is an `A op B = C` equation
  if max_steps < 1:
    raise ValueError(f"max_steps={max_steps} must be >= 1")
  tables = _as_tables(tables)
  p = _parse(tokens_NxL, mask_NxL, tables)
  chars, width = _char_stream(tokens_NxL, p.think_NxL, tables)
  scores, ends, valid = jax.vmap(lambda ch: _step_row(ch, width, max_steps))(chars)
  valid &= p.ok_N[:, None]
  return jnp.where(valid, scores, 0.0), jnp.where(valid, ends, 0), valid
