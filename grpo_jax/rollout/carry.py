"""Partial rollouts (`rl.partial_rollouts`): rows that outlive an RL step, carried in the train state.

Why: the synchronous step decodes until its longest row has ended while most slots idle. Here a step decodes a
budget, trains on the groups that are complete and carries the rest — tokens, the behaviour log-probs the sampler
recorded, each token's policy version, their slots' KV — to the next step inside the state. No weight moves
anywhere: the sampler is the trainer.

One call of `advance` (static shapes; per device block d of the D = data × fsdp row split, as engine.py):
  1. admit: the step's prompts enter the free positions of a table of Q = (1 + rl.max_staleness) · B groups. The
     first step fills the table (Q prompts, `host_batch`); every later step admits the B prompts whose groups the
     step before trained. A new group is prefilled once; its G rows queue with their first token drawn from the
     prefill logits.
  2. KV across an update (`rl.carry_kv`): 'keep' decodes on over the KV older weights wrote (SkyRL's default);
     'recompute' first re-prefills every group's prompt and every live slot's completion so far with the current
     weights (NeMo-RL's option).
  3. decode: S slots take queued rows, oldest group first (every step the slots are grouped by length, each group
     reading the KV below its own longest row: live_attention). The loop runs at least `budget` decode steps, and on
     until every device has B/D complete groups (all G rows ended: group normalisation needs whole groups) and, under
     rl.staleness_policy 'wait', they are its oldest (below).
  4. select: each device's B/D oldest complete groups are the step's N = B·G rows (they stay on their device);
     their positions are freed for the next step's prompts. Complete groups beyond those wait (the ready buffer).
Staleness (rl.staleness_policy): 'wait' bounds it by construction — the table holds the admissions of
1 + max_staleness steps, so a group admitted at version a must train by step a + max_staleness, and a younger group
trained ahead of an older one would leave more groups due at a later step than it trains. So each device trains the
groups of its oldest admission versions (earliest deadline first): the step decodes on until every group of a version
older than its B/D-th oldest group's is complete and B/D groups of versions up to that one are: no trained token is
older than max_staleness updates; the price is waiting for a row longer than (1 + max_staleness) budgets. 'mask'
never waits: a younger complete group may train first, and the loss masks the tokens past the bound and counts them
(rl/partial.py).
With max_staleness 0 the table holds B groups and every step decodes its own batch to the end: the synchronous
continuous engine's samples (tests/test_carry.py). Multi-turn rows (tools.env, `advance(tools=...)`) pause, call the environment and are
fed its observation as in the engine (rollout/turns.py); a row paused or half-fed when a step ends is carried with
its slot's turn state and its environment rows (Carry.turn, Carry.env; tests/test_turns.py). A token drawn at step s has version s (the state's step); its
uniform is fixed when its group is admitted, so no schedule changes what a row samples beyond the weights and KV.
"""
import contextlib
import contextvars
import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from grpo_jax.infra import host_calls
from grpo_jax.model import decode as decode_lib
from grpo_jax.model import live_attention
from grpo_jax.model import model as model_lib
from grpo_jax.rollout import decode_layout
from grpo_jax.rollout import engine
from grpo_jax.rollout import sampling
from grpo_jax.rollout import turns

KV_MODES = ("keep", "recompute")
STALE_POLICIES = ("wait", "mask")  # rl.staleness_policy
ENV_ROWS = ("obs_RxL", "reward_RxL", "step_RxL", "events_RxE")  # Carry.env's leaves (multi-turn rows)
_EMA = 0.8  # the budget's length average: weight of the past (a few steps' memory; lengths drift during RL)


class Spec(NamedTuple):
  """The carry's static shapes. fields: (name, per-prompt shape, dtype) of the batch's verifier fields."""
  B: int  # groups trained per step (rl.prompts_per_step)
  G: int
  Q: int  # group table: (1 + rl.max_staleness) · B
  P: int  # prompt length
  L: int  # completion length (sampling.max_new_tokens)
  S: int  # decode slots
  D: int  # the row split (data × fsdp): every count below is a multiple of it
  blk: int  # completion keys per KV block read (engine.KV_BLOCK)
  fields: tuple
  kv_dtype: str = "float32"  # the sampler's compute dtype: what its KV is written in
  kv_groups: int = 1  # each device's slots read the completion KV in this many groups (rl.carry_kv_groups)
  wait: bool = True  # rl.staleness_policy 'wait': decode on until the oldest admission versions' groups are complete
  obs: int = 0  # multi-turn rows (tools.env): the observation's width O (tools.max_obs_tokens); 0 = no environment

  @property
  def R(self) -> int:
    return self.Q * self.G

  @property
  def lc(self) -> int:
    return -(-self.L // self.blk) * self.blk


class Carry(NamedTuple):
  """The in-flight state. Leading axes Q (groups), R = Q·G (rows, row p·G + g of group p) and S (slots) are split
  into D device blocks; indices stored in it (row_S, next_D, order) are local to the device block."""
  prompt_QxP: jax.Array  # int32
  pmask_QxP: jax.Array  # int32
  fields: dict  # name -> [Q, ...] the group's verifier fields
  age_Q: jax.Array  # int32 admission serial (smaller = older); -1 = a free position
  pk: tuple  # per layer [Q, K, Dh, P]: the group's prompt KV (decode layout dtype)
  pv: tuple  # per layer [Q, K, P, Dh]
  tokens_RxL: jax.Array  # int32, pad after the end
  logp_RxL: jax.Array  # float32: the behaviour log-prob the sampler recorded (0 where nothing was drawn)
  ver_RxL: jax.Array  # int32: the policy version (state step) whose weights drew the token
  mask_RxL: jax.Array  # int32: 1 where a token was drawn
  u_RxL: jax.Array  # float32: the row's uniforms, fixed at admission
  done_R: jax.Array  # bool: the row has ended (EOS or L tokens)
  trunc_R: jax.Array  # bool: ended at L without EOS
  next_D: jax.Array  # int32 per device: rows of its age order that have had a slot (a prefix of it)
  row_S: jax.Array  # int32 local row in the slot (R/D = none)
  t_S: jax.Array  # int32 completion position of the slot's last drawn token
  tok_S: jax.Array  # int32 that token (the next decode step's input)
  live_S: jax.Array  # bool
  ck: tuple  # per layer [S, K, Dh, lc]
  cv: tuple  # per layer [S, K, lc, Dh]
  serial: jax.Array  # int32: groups admitted so far
  len_ema: jax.Array  # float32: average completion length of trained rows (0 = none seen yet): the auto budget
  # multi-turn rows (tools.env; () without): the slots' turn state (turns.Slots: paused, the observation being fed)
  # and per row what the environment did (turns.Rows' obs / reward / step [R, L] and events [R, E]) — a row paused
  # for the environment, or half-way through its observation, when a step ends is carried like any live row
  turn: Any = ()
  env: Any = ()


class Out(NamedTuple):
  """One step's trained rows (N = B·G, device blocks) and what the schedule did."""
  rollout: sampling.Rollout
  ver_NxL: jax.Array
  fields: dict  # name -> [B, ...] (prompt_NxP / prompt_mask_NxP among them): tile G times for the rows
  steps: jax.Array  # decode steps this call
  row_steps: jax.Array  # slot-steps computed
  new_tokens: jax.Array  # tokens drawn this call (the admitted rows' first tokens, drawn from the prefill, included)
  admitted_rows: jax.Array  # rows admitted this call (their first token counts as their prefill's row-step)
  carried_rows: jax.Array  # rows left in flight or queued after the selection
  ready_groups: jax.Array  # complete groups left waiting after the selection
  budget: jax.Array
  env: Any = None  # multi-turn rows: turns.Result of the trained rows (its calls, counts and status: this call's)


_FIELDS = contextvars.ContextVar("carry_batch_fields", default=None)


@contextlib.contextmanager
def batch_fields(fields: dict[str, tuple]):
  """Within: the carry's batch fields are `fields` (name -> (per-prompt shape, dtype)) instead of the task data's:
  for a step compiled on abstract batches of its own (perf/aot.py)."""
  token = _FIELDS.set(dict(fields))
  try:
    yield
  finally:
    _FIELDS.reset(token)


def fields_override() -> dict[str, tuple] | None:
  return _FIELDS.get()


def kv_groups(setting: int, slots: int, split: int) -> int:
  """rl.carry_kv_groups, or for 0 (auto) the most groups up to 8 that divide each device's slots: a carried long row
  then makes only its group read its length, not every slot (bench-tail on the CPU, 128 slots: the rollout's
  decode 5,248 tokens/s with 8 groups against 3,406 with one; docs/performance.md)."""
  if setting:
    return setting
  per = slots // max(split, 1)
  return max(g for g in (1, 2, 4, 8) if per % g == 0)


def spec_for(config, fields: dict[str, tuple], split: int, kv_dtype: str = "") -> Spec:
  """The carry of a config; fields: the batch's fields, name -> (per-prompt shape, dtype name); kv_dtype: the
  sampler's compute dtype ('' = the model's)."""
  rl = config.rl
  B, G, L = int(rl.prompts_per_step), int(rl.G), int(config.sampling.max_new_tokens)
  S = int(config.sampling.slots) or B * G
  keys = sorted(k for k in fields if k not in ("prompt_NxP", "prompt_mask_NxP"))
  return Spec(B=B, G=G, Q=(1 + int(rl.max_staleness)) * B, P=int(config.task.prompt_len), L=L, S=S, D=split,
              blk=min(engine.KV_BLOCK, L), fields=tuple((k, tuple(fields[k][0]), str(fields[k][1])) for k in keys),
              kv_dtype=kv_dtype or config.model.dtype,
              kv_groups=kv_groups(int(rl.get("carry_kv_groups", 0)), S, split),
              wait=rl.get("staleness_policy", "wait") == "wait",
              obs=int(config.tools.max_obs_tokens) if "tools" in config and config.tools.get("env") else 0)


def check(spec: Spec) -> str | None:
  """Why the carry cannot run this shape (None: it can)."""
  if spec.B % spec.D or spec.S % spec.D:
    return (f"rl.prompts_per_step={spec.B} and sampling.slots={spec.S} must be multiples of the mesh's row split "
            f"data*fsdp={spec.D} with rl.partial_rollouts (each device trains whole groups of its own)")
  if not 1 <= spec.S <= spec.R:
    return f"sampling.slots={spec.S}: must be in [1, table rows {spec.R}] with rl.partial_rollouts"
  if spec.kv_groups < 1 or (spec.S // spec.D) % spec.kv_groups:
    return (f"rl.carry_kv_groups={spec.kv_groups}: must divide each device's {spec.S // spec.D} slots (0 = auto: "
            "the most up to 8 that do)")
  return None


def _rows(x):
  return nn.with_logical_constraint(x, ("batch",) + (None,) * (x.ndim - 1))


def _cache(x, name: str):
  return nn.with_logical_constraint(x, tuple(decode_lib.cache_axes()[name]))


def axes(spec: Spec, layers: int) -> Carry:
  """Logical axes of every leaf (the state's shardings: rows over the batch split, KV as the decode cache)."""
  row = lambda nd: PartitionSpec("batch", *(None,) * (nd - 1))
  ck, cv = decode_lib.cache_axes()["k"], decode_lib.cache_axes()["v"]
  return Carry(prompt_QxP=row(2), pmask_QxP=row(2),
               fields={k: row(1 + len(shape)) for k, shape, _ in spec.fields}, age_Q=row(1),
               pk=(ck,) * layers, pv=(cv,) * layers, tokens_RxL=row(2), logp_RxL=row(2), ver_RxL=row(2),
               mask_RxL=row(2), u_RxL=row(2), done_R=row(1), trunc_R=row(1), next_D=PartitionSpec(None),
               row_S=row(1), t_S=row(1), tok_S=row(1), live_S=row(1), ck=(ck,) * layers, cv=(cv,) * layers,
               serial=PartitionSpec(), len_ema=PartitionSpec(),
               turn=turns.Slots(row(1), row(1), row(1), row(2), row(1)) if spec.obs else (),
               env={k: row(2) for k in ENV_ROWS} if spec.obs else ())


def init(spec: Spec, mcfg: model_lib.ModelConfig) -> Carry:
  """An empty carry: every table position free, every slot empty (pure: jit it with the state's shardings)."""
  Q, R, S, P, L, D = spec.Q, spec.R, spec.S, spec.P, spec.L, spec.D
  K, Dh, dt = mcfg.kv_heads, mcfg.head_dim, jnp.dtype(spec.kv_dtype)
  z = lambda shape, dtype=jnp.int32: jnp.zeros(shape, dtype)
  return Carry(
      prompt_QxP=z((Q, P)), pmask_QxP=z((Q, P)),
      fields={k: z((Q,) + tuple(shape), jnp.dtype(dtype)) for k, shape, dtype in spec.fields},
      age_Q=jnp.full((Q,), -1, jnp.int32),
      pk=tuple(z((Q, K, Dh, P), dt) for _ in range(mcfg.layers)),
      pv=tuple(z((Q, K, P, Dh), dt) for _ in range(mcfg.layers)),
      tokens_RxL=z((R, L)), logp_RxL=z((R, L), jnp.float32), ver_RxL=z((R, L)), mask_RxL=z((R, L)),
      u_RxL=z((R, L), jnp.float32), done_R=z((R,), bool), trunc_R=z((R,), bool), next_D=z((D,)),
      row_S=jnp.full((S,), R // D, jnp.int32), t_S=z((S,)), tok_S=z((S,)), live_S=z((S,), bool),
      ck=tuple(z((S, K, Dh, spec.lc), dt) for _ in range(mcfg.layers)),
      cv=tuple(z((S, K, spec.lc, Dh), dt) for _ in range(mcfg.layers)),
      serial=jnp.int32(0), len_ema=jnp.float32(0),
      turn=turns.init_slots(S, spec.obs) if spec.obs else (),
      env=dict(obs_RxL=z((R, L)), reward_RxL=z((R, L), jnp.float32), step_RxL=z((R, L)),
               events_RxE=z((R, turns.EVENTS))) if spec.obs else ())


def auto_budget(spec: Spec, len_ema: jax.Array) -> jax.Array:
  """Decode steps that draw one step's worth of tokens at full slots: N rows × the average length / S slots. Before
  any row has been trained: L (the first step decodes like the synchronous engine)."""
  n = spec.B * spec.G
  per = jnp.where(len_ema > 0, jnp.ceil(len_ema * n / spec.S), spec.L)
  return jnp.clip(per, 1, spec.L).astype(jnp.int32)


def host_batch(batches: list[dict], spec: Spec) -> dict:
  """The step's input from the prompt stream: the first step takes Q = (1 + max_staleness) · B prompts (the
  batches' concatenation, in stream order), a later step the B prompts of one batch, placed where each device
  admits them (rows d·Q/D + j for device d's j-th of its B/D: the device block it decodes them in). The other rows
  are never read (they repeat the batch)."""
  if len(batches) == spec.Q // spec.B:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  if len(batches) != 1:
    raise ValueError(f"host_batch: {len(batches)} batches; the first step takes {spec.Q // spec.B}, later ones 1.")
  (b,), qd, bd = batches, spec.Q // spec.D, spec.B // spec.D
  idx = np.zeros(spec.Q, np.int64)
  for d in range(spec.D):
    idx[d * qd: (d + 1) * qd] = d * bd + np.arange(qd) % bd
  return {k: v[idx] for k, v in b.items()}


def stream_batches(spec: Spec, step: int) -> tuple[int, int]:
  """(first stream batch, count) the carry's step `step` reads: 0 and Q/B at step 0, then one batch at step + Q/B - 1."""
  k = spec.Q // spec.B
  return (0, k) if step == 0 else (step + k - 1, 1)


def host_stream(batches_from, spec: Spec, start: int):
  """The steps' inputs from `start` on, out of the prompt stream (`batches_from(k)`: the stream's batches from
  batch k on, each of B prompts): host_batch of the batches stream_batches names."""
  first, count = stream_batches(spec, start)
  it = batches_from(first)
  if count > 1:
    yield host_batch([next(it) for _ in range(count)], spec)
  for b in it:
    yield host_batch([b], spec)


def advance(mcfg: model_lib.ModelConfig, params: Any, carry: Carry, batch: dict, version: jax.Array,
            rng: jax.Array, scfg: sampling.SamplingConfig, spec: Spec, *, budget: jax.Array | None = None,
            kv: str = "keep", decode: decode_layout.Decode | None = None,
            tools: turns.Tools | None = None) -> tuple[Carry, Out]:
  """One step of the schedule above: admit `batch` ([Q, ...] as host_batch lays it out), decode, select the B
  oldest complete groups. `version`: the policy version of `params` (the state's step). `budget`: None = auto.
  tools: multi-turn rows as the continuous engine runs them (rollout/turns.py: a row pauses on a stop id, the paused
  slots go to the environment once per chunk boundary with their group's verifier fields, the observation is fed in
  teacher-forced); a row still paused, or being fed, when the step ends is carried with its turn state (Carry.turn)
  and what the environment did so far (Carry.env). A chunk boundary counts this call's decode steps."""
  if kv not in KV_MODES:
    raise ValueError(f"rl.carry_kv={kv!r}: one of {KV_MODES}.")
  if (tools is None) != (spec.obs == 0) or (tools is not None and tools.max_obs != spec.obs):
    raise ValueError(f"carry.advance: the carry holds observations of width {spec.obs} (0: no environment), the "
                     f"tools {None if tools is None else tools.max_obs}: build the Spec with spec_for(config) of the "
                     "run's tools.")
  bad = check(spec)
  if bad:
    raise ValueError(bad)
  if batch["prompt_NxP"].shape != (spec.Q, spec.P):
    raise ValueError(f"the carry's batch has prompts {batch['prompt_NxP'].shape}; need [Q, P] = {(spec.Q, spec.P)} "
                     "(carry.host_batch lays the prompt stream out).")
  B, G, Q, R, S, L, D = spec.B, spec.G, spec.Q, spec.R, spec.S, spec.L, spec.D
  Qd, Rd, Sd, Bd = Q // D, R // D, S // D, B // D
  if decode is None:
    decode = decode_layout.prepare(mcfg, params, decode_layout.Layout("fsdp"))
  dm = decode.mcfg
  dev = lambda x: x.reshape((D, x.shape[0] // D) + x.shape[1:])
  flat = lambda x: x.reshape((-1,) + x.shape[2:])
  is_eos = lambda tok: functools.reduce(jnp.logical_or, [tok == e for e in scfg.eos_ids])
  version = jnp.asarray(version, jnp.int32)
  budget = auto_budget(spec, carry.len_ema) if budget is None else jnp.asarray(budget, jnp.int32)
  c = carry

  # ---- 1. admit: device d's new prompts are batch rows d·Q/D + j, j < its free count (host_batch's layout)
  free_DxQd = dev(c.age_Q < 0)
  f_D = jnp.sum(free_DxQd.astype(jnp.int32), axis=1)
  rank_DxQd = jnp.cumsum(free_DxQd.astype(jnp.int32), axis=1) - 1
  src_DxQd = jnp.where(free_DxQd, rank_DxQd, 0)  # the batch row within the device's block
  new_Q = flat(free_DxQd)
  src_Q = flat(src_DxQd + Qd * jnp.arange(D)[:, None])  # the global batch row (blocks stay on their device)
  # stream order: device d's j-th new prompt is the stream's d·f + j (the first step: rows in order)
  age_new_Q = c.serial + flat(jnp.arange(D)[:, None] * f_D[:, None] + rank_DxQd)
  serial = c.serial + jnp.sum(f_D)
  take = lambda x: _rows(jnp.take(x, src_Q, axis=0))
  sel_new = lambda new, old: jnp.where(new_Q.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
  prompt_QxP = sel_new(take(batch["prompt_NxP"].astype(jnp.int32)), c.prompt_QxP)
  pmask_QxP = sel_new(take(batch["prompt_mask_NxP"].astype(jnp.int32)), c.pmask_QxP)
  fields = {k: sel_new(take(batch[k]), v) for k, v in c.fields.items()}
  age_Q = jnp.where(new_Q, age_new_Q, c.age_Q)
  pos_QxP = jnp.maximum(jnp.cumsum(pmask_QxP, axis=1) - 1, 0)
  plen_Q = jnp.sum(pmask_QxP, axis=1)

  # prefill: in 'recompute' every group (the new weights), else the new ones (their positions hold the rest as is)
  logits_QxV, pcache = decode_lib.prefill(mcfg, params, prompt_QxP, pos_QxP, pmask_QxP,
                                          decode_lib.init_cache(mcfg, Q, spec.P))
  pcache = decode.expand_cache(pcache)
  keep_Q = ~new_Q if kv == "keep" else jnp.zeros_like(new_Q)
  kv_sel = lambda new, old: _cache(jnp.where(keep_Q[:, None, None, None], old, new.astype(old.dtype)), "k")
  pk = tuple(kv_sel(n, o) for n, o in zip(pcache["k"], c.pk))
  pv = tuple(_cache(jnp.where(keep_Q[:, None, None, None], o, n.astype(o.dtype)), "v")
             for n, o in zip(pcache["v"], c.pv))

  # the new groups' rows: uniforms fixed now (column src·G + g of the step's draw: with max_staleness 0 the
  # synchronous engine's), the first token drawn from the prefill logits
  new_R = jnp.repeat(new_Q, G)
  col_R = jnp.repeat(src_Q, G) * G + jnp.tile(jnp.arange(G, dtype=jnp.int32), Q)
  u_RxL = jnp.where(new_R[:, None], _rows(jnp.take(sampling.uniforms(rng, L, Q * G).T, col_R, axis=0)), c.u_RxL)
  tok0_R, lp0_R = sampling.draw(jnp.repeat(logits_QxV, G, axis=0), u_RxL[:, 0], scfg)
  end0_R = is_eos(tok0_R) | (L == 1)
  first = lambda v0, rest: jnp.concatenate([v0[:, None], jnp.broadcast_to(rest, (R, L - 1))], axis=1)
  row_new = lambda new, old: _rows(jnp.where(new_R[:, None], new, old))
  tokens_RxL = row_new(first(tok0_R, jnp.int32(scfg.pad_id)), c.tokens_RxL)
  logp_RxL = row_new(first(lp0_R, jnp.float32(0)), c.logp_RxL)
  ver_RxL = row_new(first(jnp.broadcast_to(version, (R,)), jnp.int32(0)), c.ver_RxL)
  mask_RxL = row_new(first(jnp.ones((R,), jnp.int32), jnp.int32(0)), c.mask_RxL)
  done_R = jnp.where(new_R, end0_R, c.done_R)
  trunc_R = jnp.where(new_R, end0_R & ~is_eos(tok0_R), c.trunc_R)
  env_rows = c.env if tools is None else {k: row_new(jnp.zeros_like(v), v) for k, v in c.env.items()}

  # the age order of each device's groups (free last): rows that have had a slot are a prefix of it (old groups
  # were queued first; trained groups were fully started; new groups are the youngest)
  order_DxQd = jnp.argsort(jnp.where(dev(age_Q) < 0, jnp.iinfo(jnp.int32).max, dev(age_Q)), axis=1, stable=True)
  rank_of_DxQd = jnp.argsort(order_DxQd, axis=1)  # the inverse permutation
  started_rank_R = flat(jnp.repeat(rank_of_DxQd, G, axis=1) * G + jnp.tile(jnp.arange(G), (D, Qd)))
  queued_D = jnp.sum(dev(age_Q >= 0).astype(jnp.int32), axis=1) * G  # rows of the order that exist

  # ---- 2. KV across the update: 'recompute' rebuilds the live slots' completion KV with the current weights
  ck, cv = c.ck, c.cv
  if kv == "recompute":
    ck, cv = _recompute_slots(mcfg, params, prompt_QxP, pmask_QxP, tokens_RxL, c, spec, decode)

  class Loop(NamedTuple):
    tokens_RxL: jax.Array
    logp_RxL: jax.Array
    ver_RxL: jax.Array
    mask_RxL: jax.Array
    done_R: jax.Array
    trunc_R: jax.Array
    next_D: jax.Array
    row_S: jax.Array
    t_S: jax.Array
    tok_S: jax.Array
    live_S: jax.Array
    ck: tuple
    cv: tuple
    steps: jax.Array
    new_tokens: jax.Array
    turn: Any  # tools: turns.Slots, else ()
    env: Any   # tools: Carry.env's rows, else ()
    calls: Any  # tools: (status, counts_K, calls) of this call's host calls (turns.Rows'), else ()

  def complete_DxQd(lp: Loop) -> jax.Array:
    """Groups whose G rows have all had a slot and ended."""
    ok_R = lp.done_R & (started_rank_R < jnp.repeat(lp.next_D, Rd))
    return jnp.all(dev(ok_R).reshape(D, Qd, G), axis=2) & dev(age_Q >= 0)

  def admit(lp: Loop) -> Loop:
    """Free slots take their device's next queued rows in age order, with the first token drawn at admission."""
    free_DxSd = dev(~lp.live_S)
    k_DxSd = lp.next_D[:, None] + jnp.cumsum(free_DxSd.astype(jnp.int32), axis=1) - 1
    take_DxSd = free_DxSd & (k_DxSd < queued_D[:, None])
    k_DxSd = jnp.minimum(k_DxSd, Rd - 1)
    grp_DxSd = jnp.take_along_axis(order_DxQd, k_DxSd // G, axis=1)
    new_DxSd = grp_DxSd * G + k_DxSd % G
    take_S, new_S = flat(take_DxSd), flat(new_DxSd)
    row_S = jnp.where(take_S, new_S, jnp.where(flat(free_DxSd), Rd, lp.row_S))
    at = lambda x_R: flat(jax.vmap(lambda x, r: x[r])(dev(x_R), dev(jnp.minimum(row_S, Rd - 1))))
    tok0_S, live0_S = at(lp.tokens_RxL[:, 0]), take_S & ~at(lp.done_R)
    turn = lp.turn
    if tools is not None:  # a row starts with nothing to feed, paused if its first token (drawn at admission) is a stop
      turn = turn._replace(paused_S=jnp.where(take_S, live0_S & turns.is_any(tok0_S, tools.stop_ids), turn.paused_S),
                           fpos_S=jnp.where(take_S, 0, turn.fpos_S), flen_S=jnp.where(take_S, 0, turn.flen_S),
                           fend_S=turn.fend_S & ~take_S)
    return lp._replace(row_S=row_S, t_S=jnp.where(take_S, 0, lp.t_S),
                       tok_S=jnp.where(take_S, tok0_S, lp.tok_S), live_S=lp.live_S | live0_S,
                       next_D=lp.next_D + jnp.sum(take_DxSd.astype(jnp.int32), axis=1), turn=turn)

  def step(lp: Loop) -> Loop:
    """Decode every slot's last token into its own position t, then each live slot draws its row's next token."""
    # local to the device's block of the table; unsigned (the clamped row is >= 0): no floor-division sign fix-up
    group_S = (engine.nonneg(jnp.minimum(lp.row_S, Rd - 1)) // np.uint32(G)).astype(jnp.int32)
    clen_S = lp.t_S + 1
    # the slots in groups by length, longest first, each group reading the completion blocks below its own longest
    # live row (live_attention.attend): a carried long row costs its group, not every slot
    len_DxSd = dev(jnp.where(lp.live_S, clen_S, 0))
    order_DxSd = jnp.argsort(-len_DxSd, axis=1, stable=True)
    live_len = jnp.max(jnp.take_along_axis(len_DxSd, order_DxSd, axis=1).reshape(D, spec.kv_groups, -1), axis=(0, 2))
    kvs = tuple(live_attention.LiveKV(pk[l], pv[l], pmask_QxP, group_S, lp.ck[l], lp.cv[l], clen_S, live_len,
                                      spec.blk, D, flat(order_DxSd)) for l in range(dm.layers))
    pos_S = live_attention.take_local(plen_Q, group_S, D) + lp.t_S
    logits_SxV, kvs = decode_lib.decode_step_live(dm, decode.weights, lp.tok_S, pos_S, kvs, lp.t_S)
    # a paused slot stays where it is (its decode step rewrote its stop id's K/V at its own position, unchanged)
    go_S = lp.live_S if tools is None else lp.live_S & ~lp.turn.paused_S
    t_S = jnp.where(go_S, lp.t_S + 1, lp.t_S)
    r_DxSd, t_DxSd = dev(jnp.minimum(lp.row_S, Rd - 1)), dev(jnp.minimum(t_S, L - 1))
    u_S = flat(jax.vmap(lambda u, r, t: u[engine.nonneg(r), engine.nonneg(t)])(dev(u_RxL), r_DxSd, t_DxSd))
    tok_S, lp_S = sampling.draw(_rows(logits_SxV), u_S, scfg)
    turn, env = lp.turn, lp.env
    if tools is None:
      cut_S = ~is_eos(tok_S)  # an ending row ends truncated
      end_S = go_S & (~cut_S | (t_S == L - 1))
    else:  # the engine's turn rules (turns.emit): fed observation tokens, the fed EOS of a row the environment ended
      tok_S, lp_S, fed_S, end_S, cut_S, turn = turns.emit(turn, go_S, tok_S, lp_S, t_S == L - 1, is_eos,
                                                          tools.stop_ids)
    r_DxSd = dev(jnp.where(go_S, lp.row_S, Rd))  # Rd: dropped by the scatters
    set_at = lambda x, r, t, v: x.at[engine.nonneg(r), engine.nonneg(t)].set(v, mode="drop")
    put = lambda x, v: flat(jax.vmap(set_at)(dev(x), r_DxSd, t_DxSd, dev(v)))
    mark = lambda x, v: flat(jax.vmap(lambda x, r, v: x.at[engine.nonneg(r)].set(v, mode="drop"))(
        dev(x), dev(jnp.where(end_S, lp.row_S, Rd)), dev(v)))
    if tools is not None:
      env = dict(env, obs_RxL=_rows(put(env["obs_RxL"], fed_S.astype(jnp.int32))))
    lp = lp._replace(
        tokens_RxL=_rows(put(lp.tokens_RxL, tok_S)), logp_RxL=_rows(put(lp.logp_RxL, lp_S)),
        ver_RxL=_rows(put(lp.ver_RxL, jnp.broadcast_to(version, tok_S.shape))),
        mask_RxL=_rows(put(lp.mask_RxL, jnp.ones_like(tok_S))),
        done_R=mark(lp.done_R, jnp.ones_like(end_S)), trunc_R=mark(lp.trunc_R, cut_S),
        t_S=t_S, tok_S=tok_S if tools is None else jnp.where(go_S, tok_S, lp.tok_S), live_S=lp.live_S & ~end_S,
        ck=tuple(_cache(kv.ck_NxKxDxL, "k") for kv in kvs), cv=tuple(_cache(kv.cv_NxKxLxD, "v") for kv in kvs),
        steps=lp.steps + 1, new_tokens=lp.new_tokens + jnp.sum(go_S.astype(jnp.int32)), turn=turn, env=env)
    return admit(lp)

  def call_env(lp: Loop, go: jax.Array) -> Loop:
    """The paused slots' one host call (turns.call: per device, its own slots) with their rows' transcripts and
    their groups' fields; then each ends (done, turn limit, fallback, a call that failed as a whole) or resumes with
    its observation to feed — as the engine's boundary (engine.py). `go`: as there, False keeps a vmapped run that
    is not at a boundary from passing rows."""
    turn, env = lp.turn, lp.env
    act_S = turn.paused_S & go
    row_S = jnp.minimum(lp.row_S, Rd - 1)
    fields_S = {k: _rows(live_attention.take_local(v, row_S // G, D)) for k, v in fields.items()}
    out = turns.call(tools.call, _rows(live_attention.take_local(lp.tokens_RxL, row_S, D)),
                     _rows(live_attention.take_local(env["obs_RxL"], row_S, D)), lp.t_S + 1, act_S, fields_S)
    turn, end_S, ok = turns.answer(turn, out, act_S, L - 1 - lp.t_S)
    r_DxSd, t_DxSd = dev(jnp.where(act_S, lp.row_S, Rd)), dev(lp.t_S)
    add = lambda x, v: flat(jax.vmap(lambda x, r, t, v: x.at[r, t].add(v, mode="drop"))(dev(x), r_DxSd, t_DxSd,
                                                                                         dev(v)))
    events_SxE = jax.nn.one_hot(out.event_R, turns.EVENTS, dtype=jnp.int32)
    env = dict(env, reward_RxL=_rows(add(env["reward_RxL"], jnp.where(act_S & ok, out.reward_R, 0.0))),
               step_RxL=_rows(add(env["step_RxL"], act_S.astype(jnp.int32))),
               events_RxE=_rows(flat(jax.vmap(lambda x, r, v: x.at[r].add(v, mode="drop"))(
                   dev(env["events_RxE"]), r_DxSd, dev(events_SxE)))))
    done_R = flat(jax.vmap(lambda x, r: x.at[r].set(True, mode="drop"))(dev(lp.done_R),
                                                                        dev(jnp.where(end_S, lp.row_S, Rd))))
    status, counts_K, calls = lp.calls
    return lp._replace(live_S=lp.live_S & ~end_S, done_R=done_R, turn=turn, env=env,
                       calls=(jnp.maximum(status, out.status), counts_K + out.counts_K, calls + 1))

  def step_turns(lp: Loop) -> Loop:
    """step, then the chunk boundary (every tools.chunk decode steps, or when every live row is paused): one host
    call if any row is paused. `running`: the loop's predicate before the step (False only in a vmapped run that
    has left the loop, whose state is kept, not the body's)."""
    running = more(lp)
    lp = step(lp)
    waiting = jnp.any(lp.turn.paused_S)
    due = (lp.steps % tools.chunk == 0) | ~jnp.any(lp.live_S & ~lp.turn.paused_S)
    go = waiting & due & running
    return jax.lax.cond(go, lambda lp: call_env(lp, go), lambda lp: lp, lp)

  # 'wait': each device trains its B/D groups from its oldest admission versions (earliest deadline first; a row's
  # first token carries its group's admission version): every group of a version older than the B/D-th oldest
  # group's, and B/D complete ones of versions up to it. The table holds (1 + max_staleness) steps' admissions, so
  # a younger group trained ahead of an older one would leave more than B/D groups due at a later step
  # (tests/test_carry.py::test_wait_never_trains_past_the_bound)
  ver_DxQd = dev(jnp.where(age_Q >= 0, ver_RxL[::G, 0], jnp.iinfo(jnp.int32).max))
  cut_Dx1 = jnp.sort(ver_DxQd, axis=1)[:, Bd - 1:Bd]

  def more(lp: Loop) -> jax.Array:
    work = jnp.any(lp.live_S) | jnp.any(lp.next_D < queued_D)
    done_DxQd = complete_DxQd(lp)
    short = jnp.any(jnp.sum(done_DxQd.astype(jnp.int32), axis=1) < Bd)
    if spec.wait:
      short = (short | jnp.any((ver_DxQd < cut_Dx1) & ~done_DxQd)
               | jnp.any(jnp.sum((done_DxQd & (ver_DxQd <= cut_Dx1)).astype(jnp.int32), axis=1) < Bd))
    return work & ((lp.steps < budget) | short)

  with decode.view():
    lp = Loop(tokens_RxL, logp_RxL, ver_RxL, mask_RxL, done_R, trunc_R, c.next_D, c.row_S, c.t_S, c.tok_S,
              c.live_S, ck, cv, jnp.int32(0), jnp.sum(new_R.astype(jnp.int32)), c.turn, env_rows,
              () if tools is None else (jnp.int32(host_calls.OK), jnp.zeros((turns.COUNTS,), jnp.int32),
                                        jnp.int32(0)))
    lp = jax.lax.while_loop(more, step if tools is None else step_turns, admit(lp))

  # ---- 4. select each device's B/D oldest complete groups
  done_DxQd = complete_DxQd(lp)
  key_DxQd = jnp.where(done_DxQd, dev(age_Q), jnp.iinfo(jnp.int32).max)
  sel_DxBd = jnp.argsort(key_DxQd, axis=1, stable=True)[:, :Bd]
  rows_DxBdG = (sel_DxBd[:, :, None] * G + jnp.arange(G)).reshape(D, Bd * G)
  pick = lambda x_R, idx: flat(jax.vmap(lambda x, i: jnp.take(x, i, axis=0))(dev(x_R), idx))
  mask_NxL = _rows(pick(lp.mask_RxL, rows_DxBdG))
  ro = sampling.Rollout(tokens_NxL=_rows(pick(lp.tokens_RxL, rows_DxBdG)), mask_NxL=mask_NxL,
                        lengths_N=jnp.sum(mask_NxL, axis=1), logp_NxL=_rows(pick(lp.logp_RxL, rows_DxBdG)),
                        truncated_N=pick(lp.trunc_R, rows_DxBdG), decode_steps=lp.steps)
  out_fields = {k: pick(v, sel_DxBd) for k, v in fields.items()}
  out_fields.update(prompt_NxP=pick(prompt_QxP, sel_DxBd), prompt_mask_NxP=pick(pmask_QxP, sel_DxBd))
  freed_DxQd = jnp.zeros((D, Qd), bool).at[jnp.arange(D)[:, None], sel_DxBd].set(True)
  age_Q = jnp.where(flat(freed_DxQd), -1, age_Q)
  mean_len = jnp.mean(ro.lengths_N.astype(jnp.float32))
  new = Carry(prompt_QxP=prompt_QxP, pmask_QxP=pmask_QxP, fields=fields, age_Q=age_Q, pk=pk, pv=pv,
              tokens_RxL=lp.tokens_RxL, logp_RxL=lp.logp_RxL, ver_RxL=lp.ver_RxL, mask_RxL=lp.mask_RxL,
              u_RxL=u_RxL, done_R=lp.done_R, trunc_R=lp.trunc_R, next_D=lp.next_D - Bd * G, row_S=lp.row_S,
              t_S=lp.t_S, tok_S=lp.tok_S, live_S=lp.live_S, ck=lp.ck, cv=lp.cv, serial=serial,
              len_ema=jnp.where(c.len_ema > 0, _EMA * c.len_ema + (1 - _EMA) * mean_len, mean_len),
              turn=lp.turn, env=lp.env)
  in_table = jnp.sum((age_Q >= 0).astype(jnp.int32)) * G
  left_done = jnp.sum((done_DxQd & ~freed_DxQd).astype(jnp.int32))
  out = Out(rollout=ro, ver_NxL=_rows(pick(lp.ver_RxL, rows_DxBdG)), fields=out_fields, steps=lp.steps,
            row_steps=lp.steps * S, new_tokens=lp.new_tokens, admitted_rows=jnp.sum(new_R.astype(jnp.int32)),
            carried_rows=in_table - left_done * G, ready_groups=left_done, budget=budget)
  if tools is not None:
    e = lp.env
    out = out._replace(env=turns.Result(
        obs_NxL=_rows(pick(e["obs_RxL"], rows_DxBdG)), reward_NxL=_rows(pick(e["reward_RxL"], rows_DxBdG)),
        step_NxL=_rows(pick(e["step_RxL"], rows_DxBdG)), events_NxE=_rows(pick(e["events_RxE"], rows_DxBdG)),
        status=lp.calls[0], counts_K=lp.calls[1], calls=lp.calls[2]))
  return new, out


def _recompute_slots(mcfg, params, prompt_QxP, pmask_QxP, tokens_RxL, c: Carry, spec: Spec, decode):
  """The live slots' completion KV (positions below t) rebuilt by one forward over prompt + completion so far with
  the current weights: what 'recompute' pays (S × (P + L) positions) for decoding on exactly the new policy."""
  D, G, P, L = spec.D, spec.G, spec.P, spec.L
  Rd = spec.R // D
  row_S = jnp.minimum(c.row_S, Rd - 1)
  group_S = row_S // G
  take_q = lambda x: live_attention.take_local(x, group_S, D)
  tok_SxL = live_attention.take_local(tokens_RxL, row_S, D)
  keep_SxL = (jnp.arange(L)[None] < c.t_S[:, None]) & c.live_S[:, None]
  seq_SxT = jnp.concatenate([take_q(prompt_QxP), tok_SxL], axis=1)
  mask_SxT = jnp.concatenate([take_q(pmask_QxP), keep_SxL.astype(jnp.int32)], axis=1)
  pos_SxT = jnp.maximum(jnp.cumsum(mask_SxT, axis=1) - 1, 0)
  _, _, (k_LxSxKxDxT, v_LxSxKxTxD) = model_lib.apply_stack(mcfg, params, "prefill", seq_SxT, pos_SxT, mask_SxT)
  cache = decode.expand_cache({"k": tuple(k_LxSxKxDxT[l] for l in range(mcfg.layers)),
                               "v": tuple(v_LxSxKxTxD[l] for l in range(mcfg.layers))})
  pad = spec.lc - L
  ck = tuple(_cache(jnp.pad(k[..., P:], ((0, 0),) * 3 + ((0, pad),)).astype(o.dtype), "k")
             for k, o in zip(cache["k"], c.ck))
  cv = tuple(_cache(jnp.pad(v[:, :, P:], ((0, 0), (0, 0), (0, pad), (0, 0))).astype(o.dtype), "v")
             for v, o in zip(cache["v"], c.cv))
  return ck, cv


def simulate(lengths: np.ndarray, B: int, G: int, max_staleness: int, slots: int, budget: int, max_new: int,
             block: int, split: int = 1, kv_groups: int = 1, wait: bool = True) -> dict[str, Any]:
  """The carry's schedule replayed in NumPy for a stream of completion lengths (row i of the stream: group i // G,
  row i % G), over as many steps as the stream feeds: `advance`'s admission, slot queues, loop condition and
  selection with the lengths in place of the sampled EOS, on `split` devices (device d's table, slots and queue
  are its own; it admits the stream's groups d·f + j of each step's f per device, as host_batch lays them out;
  the loop runs until every device has its B/D complete groups). budget 0 = auto (auto_budget on the trained
  lengths). Returns totals (decode steps, slot-steps, completion KV positions read — every computed slot reads the
  blocks below the live maximum over all devices, as the block loop does —, tokens drawn and trained), the version
  lags of the trained tokens, and per step its decode steps and the stream groups it trained (device blocks in
  order, oldest first in each)."""
  D = split
  Q = (1 + max_staleness) * B
  Qd, Bd, Sd = Q // D, B // D, slots // D
  Rd = Qd * G
  big = np.iinfo(np.int64).max
  len_DxR, drawn_DxR = np.zeros((D, Rd), np.int64), np.zeros((D, Rd), np.int64)
  ver_DxRxL = np.zeros((D, Rd, max_new), np.int64)
  age_DxQ, gid_DxQ = np.full((D, Qd), -1), np.full((D, Qd), -1)
  row_DxS, live_DxS = np.full((D, Sd), -1), np.zeros((D, Sd), bool)
  nxt_D = np.zeros(D, np.int64)
  stream = np.minimum(np.asarray(lengths, np.int64), max_new).reshape(-1, G)
  fed, serial, version, ema = 0, 0, 0, 0.0
  tot = dict(steps=0, row_steps=0, kv_read=0, drawn_tokens=0, trained_tokens=0)
  lags, steps_per_step, trained = [], [], []
  while True:
    f = int((age_DxQ[0] < 0).sum())  # every device frees as many as it trained
    if fed + D * f > len(stream):
      break
    for d in range(D):  # admit device d's f prompts: the stream's fed + d·f + j, in stream order
      for j, p in enumerate(np.flatnonzero(age_DxQ[d] < 0)):
        g = fed + d * f + j
        age_DxQ[d, p], gid_DxQ[d, p] = serial + d * f + j, g
        rows = p * G + np.arange(G)
        len_DxR[d, rows], drawn_DxR[d, rows], ver_DxRxL[d, rows, 0] = stream[g], 1, version
    serial, fed = serial + D * f, fed + D * f
    tot["drawn_tokens"] += D * f * G
    order_DxQ = np.argsort(np.where(age_DxQ < 0, big, age_DxQ), axis=1, kind="stable")
    rank_DxR = (np.argsort(order_DxQ, axis=1, kind="stable")[:, :, None] * G + np.arange(G)).reshape(D, Rd)
    n_rows_D = (age_DxQ >= 0).sum(1) * G
    bud = budget or int(np.clip(np.ceil(ema * B * G / slots) if ema > 0 else max_new, 1, max_new))
    at = lambda x_DxR, r_DxS: np.take_along_axis(x_DxR, np.maximum(r_DxS, 0), axis=1)

    def admit():
      free = ~live_DxS
      k = nxt_D[:, None] + np.cumsum(free, axis=1) - 1
      take = free & (k < n_rows_D[:, None])
      kc = np.minimum(k, Rd - 1)
      new = np.take_along_axis(order_DxQ, kc // G, axis=1) * G + kc % G
      row_DxS[:] = np.where(take, new, np.where(free, -1, row_DxS))
      live_DxS[:] = live_DxS | (take & (at(drawn_DxR, row_DxS) < at(len_DxR, row_DxS)))
      nxt_D[:] = nxt_D + take.sum(axis=1)

    def complete():
      ok = (drawn_DxR >= len_DxR) & (rank_DxR < nxt_D[:, None])
      return np.all(ok.reshape(D, Qd, G), axis=2) & (age_DxQ >= 0)

    admit()
    ver_DxQ = np.where(age_DxQ >= 0, ver_DxRxL[:, ::G, 0], big)  # 'wait': the oldest admission versions train
    cut = np.sort(ver_DxQ, axis=1)[:, Bd - 1:Bd]

    def short():
      done = complete()
      return ((done.sum(axis=1) < Bd).any()
              or (wait and (((ver_DxQ < cut) & ~done).any() or ((done & (ver_DxQ <= cut)).sum(axis=1) < Bd).any())))

    steps = 0
    while (live_DxS.any() or (nxt_D < n_rows_D).any()) and (steps < bud or short()):
      len_DxS = -np.sort(-np.where(live_DxS, at(drawn_DxR, row_DxS), 0), axis=1)  # longest first, per device
      live_G = len_DxS.reshape(D, kv_groups, -1).max(axis=(0, 2))
      steps += 1
      tot["row_steps"] += slots
      tot["kv_read"] += int((-(-live_G // block) * block).sum()) * (slots // kv_groups)
      for d in range(D):
        r = row_DxS[d][live_DxS[d]]
        ver_DxRxL[d, r, drawn_DxR[d, r]] = version
        drawn_DxR[d, r] += 1
        tot["drawn_tokens"] += len(r)
      live_DxS[:] = live_DxS & (at(drawn_DxR, row_DxS) < at(len_DxR, row_DxS))
      admit()
    tot["steps"] += steps
    steps_per_step.append(steps)
    done = complete()
    if (done.sum(axis=1) < Bd).any():
      break
    sel_DxB = np.argsort(np.where(done, age_DxQ, big), axis=1, kind="stable")[:, :Bd]
    trained.append([int(x) for x in np.take_along_axis(gid_DxQ, sel_DxB, axis=1).reshape(-1)])
    lens = []
    for d in range(D):
      for r in (sel_DxB[d][:, None] * G + np.arange(G)).reshape(-1):
        lags.extend(version - ver_DxRxL[d, r, :len_DxR[d, r]])
        lens.append(int(len_DxR[d, r]))
      age_DxQ[d, sel_DxB[d]] = -1
    tot["trained_tokens"] += sum(lens)
    ema = float(np.mean(lens)) if ema == 0 else _EMA * ema + (1 - _EMA) * float(np.mean(lens))
    nxt_D -= Bd * G
    version += 1
  lag = np.asarray(lags, np.int64)
  tot["stale_tokens"] = int((lag > max_staleness).sum())  # masked out of the loss (rl/partial.py)
  return dict(tot, updates=version, lag_mean=float(lag.mean()) if len(lag) else 0.0,
              lag_max=int(lag.max()) if len(lag) else 0, lag_hist=np.bincount(lag) if len(lag) else np.zeros(1, int),
              steps_per_step=steps_per_step, trained=trained)
