"""The continuous rollout engine (rollout/engine.py) against the static sampler it replaces: the same tokens and
log-probs from the same uniforms for every slot count, left-padded prompts, several EOS ids, rows ending at their
first token or never, G in {1, 4}, temperature / top-k / top-p / greedy; by teacher forcing where rounding could
flip a draw; on 8 simulated devices; under vmap; and that the schedule computes about as many rows as are alive."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.model import live_attention
from grpo_jax.model import model as M
from grpo_jax.rollout import engine as E
from grpo_jax.rollout import sampling as S
from tests import script_parts
from tests.test_sampling import MCFG, on_8_devices, random_params

B, P, L = 4, 6, 20
static = jax.jit(S.sample, static_argnums=(0, 5))


@pytest.fixture(scope="module")
def params():
  return random_params(MCFG, 0)


def prompts(b, seed=0):
  rng = np.random.default_rng(seed)
  pm = (np.arange(P)[None] >= np.array([0, 2, 5, 1] * b)[:b, None]).astype(np.int32)  # left pads of 0..5
  return rng.integers(1, 64, (b, P)).astype(np.int32) * pm, pm


def continuous(params, prompt, pm, G, scfg, u, **kw):
  f = jax.jit(lambda pr, m, u: E.sample_groups(MCFG, params, pr, m, G, scfg, u_LxN=u, **kw))
  return f(prompt, pm, u)


def reference(params, prompt, pm, G, scfg, u):
  return static(MCFG, params, np.repeat(prompt, G, 0), np.repeat(pm, G, 0), None, scfg, u_LxN=u)


def assert_same(ro, ref):
  np.testing.assert_array_equal(np.asarray(ro.tokens_NxL), np.asarray(ref.tokens_NxL))
  np.testing.assert_array_equal(np.asarray(ro.mask_NxL), np.asarray(ref.mask_NxL))
  np.testing.assert_array_equal(np.asarray(ro.truncated_N), np.asarray(ref.truncated_N))
  np.testing.assert_allclose(np.asarray(ro.logp_NxL), np.asarray(ref.logp_NxL), rtol=0, atol=1e-5)


@pytest.mark.parametrize("G,slots", [(4, 0), (4, 8), (4, 2), (1, 0), (1, 2)])
def test_same_samples_as_static_for_any_slot_count(params, G, slots):
  """S = N, N/2 and N/8 (G = 4: 16 rows), G = 1; EOS ids that end some rows early, others run to L."""
  prompt, pm = prompts(B)
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(3, 7, 11), exit_chunk=4)
  u = S.uniforms(jax.random.PRNGKey(1), L, B * G)
  ref = reference(params, prompt, pm, G, scfg, u)
  lengths = np.asarray(ref.lengths_N)
  assert lengths.min() < L and lengths.max() == L, lengths  # both kinds of row are in the batch
  ro, stats = continuous(params, prompt, pm, G, scfg, u, slots=slots, kv_block=4)
  assert_same(ro, ref)
  n = B * G
  # every emitted token but each row's first (from its prefill) needed a decode row-step
  assert int(stats.row_steps) >= lengths.sum() - n
  if slots in (0, n):
    assert int(ro.decode_steps) == lengths.max() - 1  # the longest row, no exit-chunk rounding
    assert float(stats.admit_wait) == 0
  else:
    assert int(ro.decode_steps) > lengths.max() - 1 and float(stats.admit_wait) > 0


@pytest.mark.parametrize("G,slots,L", [(3, 4, 9), (3, 5, 1)])
def test_groups_that_do_not_divide_the_slots_and_one_token_rows(params, G, slots, L):
  """G = 3 rows per prompt in 4 or 5 slots (a group split across refills), and max_new_tokens = 1 (no decode step in
  the static engine; every row ends at its prefill token, so each refill costs the engine one decode step): the static
  engine's samples, top-p at temperature 0.9."""
  prompt, pm = prompts(B, seed=7)
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=tuple(range(1, 30)), top_p=0.85, temperature=0.9)
  u = S.uniforms(jax.random.PRNGKey(11), L, B * G)
  ref = reference(params, prompt, pm, G, scfg, u)
  ro, _ = continuous(params, prompt, pm, G, scfg, u, slots=slots, kv_block=4)
  assert_same(ro, ref)
  lengths = np.asarray(ref.lengths_N)
  if L == 1:
    assert int(ref.decode_steps) == 0 and int(ro.decode_steps) == -(-B * G // slots) - 1
  else:
    assert lengths.min() < L == lengths.max(), lengths


@pytest.mark.parametrize("kind", ["greedy", "top_k", "top_p"])
def test_truncated_sampling_and_first_token_eos(params, kind):
  """Greedy with the first token's argmax as EOS for row 0 (it ends at its first token); top-k, top-p and a
  temperature other than 1 through the same draw."""
  prompt, pm = prompts(B, seed=3)
  G = 4
  kw = dict(greedy=dict(greedy=True), top_k=dict(top_k=5, temperature=1.7), top_p=dict(top_p=0.7))[kind]
  probe = S.SamplingConfig(max_new_tokens=2, eos_id=63, **kw)
  u = S.uniforms(jax.random.PRNGKey(2), L, B * G)
  first = np.asarray(reference(params, prompt, pm, G, probe, u[:2]).tokens_NxL)[0, 0]
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(int(first), 61), **kw)
  ref = reference(params, prompt, pm, G, scfg, u)
  assert int(ref.lengths_N[0]) == 1
  ro, _ = continuous(params, prompt, pm, G, scfg, u, slots=4, kv_block=8, levels=1)  # compaction: the other tests
  assert_same(ro, ref)


def test_teacher_forcing_log_probs_match_static(params):
  """A bigger vocabulary and flatter logits, where a different summation order could flip a draw: the static
  tokens fed through the engine score within tolerance of the static log-probs."""
  mcfg = M.ModelConfig(vocab_size=512, hidden=32, layers=2, heads=4, kv_heads=1, inter=64, max_len=32)
  p2 = random_params(mcfg, 4, emb_std=0.1, std=0.05)
  prompt, pm = prompts(B, seed=5)
  G = 2
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(3, 4, 5, 6), top_p=0.95)
  u = S.uniforms(jax.random.PRNGKey(3), L, B * G)
  ref = jax.jit(S.sample, static_argnums=(0, 5))(mcfg, p2, np.repeat(prompt, G, 0), np.repeat(pm, G, 0), None,
                                                 scfg, u_LxN=u)
  f = jax.jit(lambda pr, m, u, t: E.sample_groups(mcfg, p2, pr, m, G, scfg, u_LxN=u, slots=2, kv_block=4,
                                                  levels=1, force_NxL=t))
  ro, _ = f(prompt, pm, u, ref.tokens_NxL)
  assert_same(ro, ref)


def test_live_attention_equals_one_softmax_over_the_concatenated_cache():
  """The prompt partial and the blocked completion partials merged by log-sum-exp = one softmax over prompt +
  completion keys, checked in NumPy (float64) with GQA, left pads and rows at different lengths."""
  rng = np.random.default_rng(0)
  n, h, k, d, b, p, lc = 5, 4, 2, 8, 3, 6, 12
  q = rng.standard_normal((n, h, d)).astype(np.float32)
  pk = rng.standard_normal((b, k, d, p)).astype(np.float32)
  pv = rng.standard_normal((b, k, p, d)).astype(np.float32)
  ck = rng.standard_normal((n, k, d, lc)).astype(np.float32)
  cv = rng.standard_normal((n, k, lc, d)).astype(np.float32)
  pok = (np.arange(p)[None] >= np.array([0, 3, 5])[:, None]).astype(np.int32)
  group = np.array([0, 0, 1, 2, 2])
  clen = np.array([1, 7, 12, 3, 5])
  kv = live_attention.LiveKV(pk, pv, pok, group, ck, cv, clen, jnp.int32(clen.max()), 4)
  got = np.asarray(jax.jit(lambda q: live_attention.attend(q, kv))(q))
  for i in range(n):
    keys = np.concatenate([pk[group[i]], ck[i]], -1).astype(np.float64)  # [k, d, p + lc]
    vals = np.concatenate([pv[group[i]], cv[i]], 1).astype(np.float64)
    ok = np.concatenate([pok[group[i]] > 0, np.arange(lc) < clen[i]])
    for j in range(h):
      s = q[i, j].astype(np.float64) @ keys[j // (h // k)] / np.sqrt(d)
      s = np.where(ok, s, -np.inf)
      w = np.exp(s - s.max())
      np.testing.assert_allclose(got[i, j], (w / w.sum()) @ vals[j // (h // k)], atol=2e-5)


def test_live_attention_refuses_a_block_that_does_not_divide_the_buffer():
  """Block 5 over 12 completion keys: the last block's dynamic_slice would start at 7, not 10, and score keys 7..11
  as positions 10..14 (a silently wrong softmax); one line instead. Blocks of 4 and 12 (one read) run. Likewise live_len
  groups that do not divide the rows."""
  n, h, k, d, p, lc = 2, 2, 1, 4, 3, 12
  z = lambda *s: np.zeros(s, np.float32)
  kv = live_attention.LiveKV(z(1, k, d, p), z(1, k, p, d), np.ones((1, p), np.int32), np.zeros(n, np.int32),
                             z(n, k, d, lc), z(n, k, lc, d), np.array([12, 11]), jnp.int32(12), 5)
  with pytest.raises(ValueError, match=r"^LiveKV: block=5 does not divide the completion buffer's 12 keys"):
    live_attention.attend(z(n, h, d), kv)
  for ok in (4, 12):
    assert live_attention.attend(z(n, h, d), kv._replace(block=ok)).shape == (n, h, d)
  # live_len groups (the rollout carry's kv groups) must divide each device's rows: 3 groups of 2 rows left a
  # group of 0 rows, every output 0
  with pytest.raises(ValueError, match=r"^LiveKV: 2 rows over split=1 device blocks into 3 live_len groups"):
    live_attention.attend(z(n, h, d), kv._replace(block=4, live_len=jnp.array([12, 12, 12], jnp.int32)))


def test_compaction_follows_the_live_rows(params):
  """A long-tailed batch (most rows end early): the compacted decode computes far fewer row-steps than rows ×
  steps, and the KV read loop stops at the live maximum; samples unchanged."""
  prompt, pm = prompts(8, seed=1)
  G = 4
  n = 8 * G
  u = S.uniforms(jax.random.PRNGKey(7), L, n)
  eos = tuple(range(1, 40))  # most draws end a row
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=eos)
  ref = reference(params, prompt, pm, G, scfg, u)
  traces = []

  def run(u):
    traces.append(1)
    return E.sample_groups(MCFG, params, prompt, pm, G, scfg, u_LxN=u, levels=4, kv_block=4)
  f = jax.jit(run)
  ro, stats = f(u)
  assert_same(ro, ref)
  # another length mix through the same program: no retrace (the schedule is data, not shape)
  u2 = S.uniforms(jax.random.PRNGKey(8), L, n)
  ro2, _ = f(u2)
  ref2 = reference(params, prompt, pm, G, scfg, u2)
  assert_same(ro2, ref2)
  assert len(traces) == 1 and not np.array_equal(np.asarray(ref.lengths_N), np.asarray(ref2.lengths_N))
  steps = int(ro.decode_steps)
  assert steps == int(np.asarray(ref.lengths_N).max()) - 1
  assert int(stats.row_steps) < n * steps
  static_util = float(E.slot_util(ref.lengths_N, n * ref.decode_steps))
  util = float(E.slot_util(ro.lengths_N, stats.row_steps))
  assert util > static_util, (util, static_util)


def test_vmapped_runs_each_get_their_own_samples(params):
  """Under vmap the phases' batched predicates run until every run is done; each run equals its own rollout."""
  prompt, pm = prompts(B, seed=2)
  G = 2
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=(3, 7, 11, 13, 17))
  us = jnp.stack([S.uniforms(jax.random.PRNGKey(s), L, B * G) for s in (0, 1, 2)])
  refs = [reference(params, prompt, pm, G, scfg, us[r]) for r in range(3)]
  # Free draws agree but where float32 rounding moves a CDF boundary (it flips 1 of these 480 tokens on some CPUs:
  # Intel Xeon, 2026-12-05): the schedule and the scores are checked exactly by teacher forcing each run's
  # reference tokens, which fixes every row's length (and so the schedule under vmap) as the reference's.
  f = jax.jit(jax.vmap(lambda u, t: E.sample_groups(MCFG, params, prompt, pm, G, scfg, u_LxN=u, slots=4, levels=2,
                                                    kv_block=4, force_NxL=t)))
  ros, _ = f(us, jnp.stack([r.tokens_NxL for r in refs]))
  for r in range(3):
    assert_same(jax.tree.map(lambda x: x[r], ros), refs[r])
  free, _ = jax.jit(jax.vmap(lambda u: E.sample_groups(MCFG, params, prompt, pm, G, scfg, u_LxN=u, slots=4,
                                                       levels=2, kv_block=4)))(us)
  same = np.asarray(free.tokens_NxL) == np.stack([np.asarray(r.tokens_NxL) for r in refs])
  assert same.mean() > 0.99, same.mean()


def test_bad_slot_count_is_refused(params):
  prompt, pm = prompts(B)
  scfg = S.SamplingConfig(max_new_tokens=L)
  with pytest.raises(ValueError, match="sampling.slots=17"):
    E.sample_groups(MCFG, params, prompt, pm, 4, scfg, u_LxN=jnp.zeros((L, 16)), slots=17)
  assert E.compaction_sizes(32, 4) == (32, 16, 8, 4)
  assert E.compaction_sizes(32, 4, split=8) == (32, 16, 8)
  assert E.compaction_sizes(12, 4) == (12, 6, 3)


_SHARDED = r"""
import json, sys
import flax.linen as nn, jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
sys.path.insert(0, sys.argv[1])
from tests.test_sampling import MCFG, random_params
from tests.test_engine import prompts
from grpo_jax.model import model as M
from grpo_jax.perf import hlo_collectives
from grpo_jax.rollout import decode_layout, engine as E, sampling as S
from grpo_jax.infra import sharding


def sharded_runs():
  params = random_params(MCFG, 0)
  prompt, pm = prompts(8, seed=4)
  L = 12
  eos = (3, 5, 7, 9, 11)
  # top-k: XLA's TopK is not split by rows (it all-gathers the [S, V] logits, as in the static engine), so the
  # locality runs sample untruncated, the RL rollout's default
  topk = S.SamplingConfig(temperature=1.3, top_k=20, max_new_tokens=L, eos_id=eos, pad_id=0)
  plain = S.SamplingConfig(temperature=1.3, max_new_tokens=L, eos_id=eos, pad_id=0)
  u = S.uniforms(jax.random.PRNGKey(5), L, 32)
  refs = {}
  static = jax.jit(S.sample, static_argnums=(0, 5))  # one jit: "spans" (4 x G8) reuses "topk"'s (8 x G4) program
  for key, b, G, scfg in (("topk", 8, 4, topk), ("plain", 8, 4, plain), ("spans", 4, 8, topk)):
    one = static(MCFG, params, np.repeat(prompt[:b], G, 0), np.repeat(pm[:b], G, 0), None, scfg, u_LxN=u)
    refs[key] = dict(tokens=np.asarray(one.tokens_NxL).tolist(), logp=np.asarray(one.logp_NxL).tolist(),
                     lengths=np.asarray(one.lengths_N).tolist())
  mesh = Mesh(np.asarray(jax.devices()).reshape(1, 8, 1), ("data", "fsdp", "tensor"))
  rules = sharding.LOGICAL_RULES
  out = {}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    shard = lambda spec: NamedSharding(mesh, nn.logical_to_mesh_axes(tuple(spec), rules))
    p_sh = jax.device_put(params, jax.tree.map(shard, M.param_axes(MCFG), is_leaf=lambda x: isinstance(x, P)))
    u_sh = jax.device_put(u, shard(P(None, "batch")))
    # the training layout (weights all-gathered per token), then the decode layouts: gathered, and tensor-parallel
    # over 2 of the 8 fsdp chips (rows over the other 4); "spans": 4 prompts x G8, a group's rows on 2 devices
    for name, ref, slots, layout in (("fsdp/32", "topk", 32, None), ("fsdp/16", "topk", 16, None),
                                     ("gathered/16", "topk", 16, "gathered"), ("tp2/16", "topk", 16, "tp"),
                                     ("spans/8", "spans", 8, "gathered"), ("local/16", "plain", 16, "gathered")):
      b, G, scfg = {"topk": (8, 4, topk), "plain": (8, 4, plain), "spans": (4, 8, topk)}[ref]
      def run(params, pr, m, u, slots=slots, layout=layout, G=G, scfg=scfg):
        lay = None if layout is None else decode_layout.prepare(MCFG, params, decode_layout.Layout(
            layout, 2 if layout == "tp" else 1))
        return E.sample_groups(MCFG, params, pr, m, G, scfg, u_LxN=u, slots=slots, split=8, kv_block=4,
                               decode=lay)
      args = (p_sh, prompt[:b], pm[:b], u_sh)
      compiled = jax.jit(run).lower(*args).compile()
      ro, _ = compiled(*args)
      out[name] = dict(ref=ref, tokens=np.asarray(ro.tokens_NxL).tolist(), logp=np.asarray(ro.logp_NxL).tolist(),
                       shard_rows=ro.tokens_NxL.addressable_shards[0].data.shape[0])
      if name == "local/16":
        # every collective of the decode (the loops and the admission / compaction between them): kind, result arrays
        # per device, where
        colls = [c for c in hlo_collectives.collectives(compiled.as_text()) if c.phase == "rollout decode"]
        out[name]["collectives"] = [(c.kind, c.shapes, c.op_name[-60:]) for c in colls]
    # test_paged_engine_per_shard_on_8_devices_matches_one_device_static: the paged store over the same mesh, params
    # and uniforms against the same one-device reference ("plain"), in the training and the tensor-parallel layouts
    paged = {}
    for name, slots, layout in (("fsdp/16", 16, None), ("tp2/16", 16, "tp")):
      def run(params, pr, m, u, slots=slots, layout=layout):
        lay = None if layout is None else decode_layout.prepare(MCFG, params, decode_layout.Layout(layout, 2))
        return E.sample_groups(MCFG, params, pr, m, 4, plain, u_LxN=u, slots=slots, levels=2, split=8, decode=lay,
                               attention="paged", page_size=4)
      low = jax.jit(run).lower(p_sh, prompt, pm, u_sh)
      ro, _ = low.compile()(p_sh, prompt, pm, u_sh)
      paged[name] = dict(tokens=np.asarray(ro.tokens_NxL).tolist(), logp=np.asarray(ro.logp_NxL).tolist(),
                         shard_map="shard_map" in low.as_text() or "manual" in low.as_text())
  return dict(refs=refs, runs=out, paged=paged)
"""


@pytest.fixture(scope="module")
def eight_devices():
  """One 8-device subprocess for the engine's and the paged store's sharded runs (they share the set-up: params,
  prompts, uniforms, mesh, and the one-device reference samples, which each test's own subprocess made again) and
  for the RL steps of test_rl_step_on_8_devices_with_the_continuous_engine_equals_the_static_one (one process
  start-up instead of two). Each part's result, or its traceback, is under its own key: a part that raised fails
  its own tests only."""
  return on_8_devices(_EIGHT_DEVICES, timeout=1200)


@pytest.fixture(scope="module")
def sharded(eight_devices):
  return script_parts.part(eight_devices, "sharded")


def test_fsdp_over_8_devices_matches_one_device_static_and_keeps_rows_on_their_device(sharded):
  """8 simulated devices, FSDP, each device queueing and compacting its own 4 rows: 32 and 16 slots in the training
  layout, 16 with the gathered and the tensor-parallel (decode_tp=2) decode layouts, 4 prompts × G8 (a group spans
  two devices): the one-device static engine's tokens and log-probs. In the default (gathered) decode layout the
  compiled decode moves no row between devices: its only collectives are all-reduces of scalars (the phase
  predicates, the live maximum the KV block loop runs to, the admission count). The global engine this replaced
  all-gathered prompt KV, logits, slot state and new K/V there. (In the training layout the decode step's own
  weight traffic adds the weights' all-gathers and the split embedding table's lookup: the model's, not the
  schedule's.)"""
  res = sharded
  for key in ("topk", "plain", "spans"):
    assert min(res["refs"][key]["lengths"]) < 12 == max(res["refs"][key]["lengths"]), key
  assert len(res["runs"]) == 6
  for name, r in res["runs"].items():
    assert r["shard_rows"] == 4, name  # 32 rows over fsdp=8
    ref = res["refs"][r["ref"]]
    np.testing.assert_array_equal(r["tokens"], ref["tokens"], err_msg=name)
    np.testing.assert_allclose(r["logp"], ref["logp"], rtol=0, atol=1e-5, err_msg=name)
  colls = res["runs"]["local/16"]["collectives"]
  assert colls, colls  # the predicates' reductions are there: the scan found the decode
  for kind, shapes, _ in colls:
    assert kind == "all-reduce" and all(dims == [] for _, dims in shapes), colls


def test_paged_engine_per_shard_on_8_devices_matches_one_device_static(sharded):
  """(The paged store's, tests/test_paged_attention.py; here to share the 8-device run.) 8 simulated devices, FSDP:
  each device's pool holds its slots' pages (the pool ops in shard_map, page indices local to the shard); 16 slots
  for 32 rows (refill, then compaction to 8), in the training layout and the tensor-parallel decode layout (rows
  over 4 of the 8 devices): the one-device static engine's samples."""
  ref = sharded["refs"]["plain"]
  assert min(ref["lengths"]) < 12 == max(ref["lengths"]), ref["lengths"]
  assert sorted(sharded["paged"]) == ["fsdp/16", "tp2/16"]
  for name, r in sharded["paged"].items():
    assert r["shard_map"], name
    np.testing.assert_array_equal(r["tokens"], ref["tokens"], err_msg=name)
    np.testing.assert_allclose(r["logp"], ref["logp"], rtol=0, atol=1e-5, err_msg=name)


# ------------------------------------------------------------------------------------------- in the RL step


_RL_STEP_8 = r"""
def rl_steps():
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import families, rl_step
  from grpo_jax.run.train import device_batch
  from grpo_jax.tasks import digits
  from tests.test_rl_step import _ManyEos
  out = {}
  for prompts, G, slots in ((8, 4, 16), (4, 4, 8)):  # 4 rows per device (one group each); 2 rows (half a group)
    for eng in ("static", "continuous"):
      c = digits.bench_config(hidden=32, layers=1, heads=4, kv=2, inter=64, vocab=64, prompts=prompts, G=G, L=8)
      c.optim.lr = 1e-3
      c.train.num_samples_logged = prompts * G  # every row in samples/
      c.mesh.update(data=2, fsdp=4, tensor=1)
      c.sampling.update(engine=eng, slots=slots if eng == "continuous" else 0, compaction=2)
      mesh = sharding.make_mesh(c.mesh, jax.devices())
      mcfg = model_lib.ModelConfig.from_config(c.model)
      spec = digits.reward_spec(c.model.vocab_size)
      tok = _ManyEos(c.model.vocab_size)
      step = families.make_step(c, mesh, mcfg, spec, tok)
      state = rl_step.init(c, mesh, mcfg, seed=0)
      # seed 2's prompts with single-digit answers, which the random model sometimes samples: groups with reward
      # variance (reward mean 0.06 and 0.12), so the update compared is a real one (grad norm 0.37 and 0.77). Seed
      # 1's full answers gave every row reward 0 and a gradient of exactly 0: the params compared were the init.
      b = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=2))
      b["answer_ids_NxA"][:, 1:] = -1
      batch = device_batch(mesh, b)
      state, m = step(state, batch)
      m = jax.device_get(m)
      out[f"{prompts}x{G}/{eng}"] = dict(
          tokens=np.asarray(m["samples/tokens_NxL"]).tolist(),
          lengths=np.asarray(m["samples/mask_NxL"]).sum(1).tolist(),
          util=float(m["train/decode_slot_util"]),
          entropy=float(m["train/entropy"]), grad_norm=float(m["train/grad_norm"]),
          params=[np.asarray(x).ravel().tolist() for x in jax.tree.leaves(jax.device_get(state["params"]))])
  return out
"""

# The eight_devices fixture's script: the sharded engine runs (_SHARDED, a function), then the RL steps, each part
# caught on its own.
_EIGHT_DEVICES = _SHARDED + _RL_STEP_8 + script_parts.tail({"sharded": "sharded_runs", "rl_steps": "rl_steps"})


def test_rl_step_on_8_devices_with_the_continuous_engine_equals_the_static_one(eight_devices):
  """One RL step (rollout, rewards, reference, AdamW update) on a data=2 × fsdp=4 mesh, each device's rows decoded
  in its own slots: the static engine's samples and, after a real update (grad norm asserted), its params within 5e-6
  = 0.005·lr, with a device's rows one group (8 prompts × G4) or half of one (4 × G4);
  rows end early (26 EOS ids) so the slots refill."""
  r = script_parts.part(eight_devices, "rl_steps")
  for shape in ("8x4", "4x4"):
    st, co = r[f"{shape}/static"], r[f"{shape}/continuous"]
    assert co["tokens"] == st["tokens"], shape
    assert co["lengths"] == st["lengths"] and len(set(st["lengths"])) > 1, shape  # rows of different lengths
    assert co["util"] > st["util"], (shape, co["util"], st["util"])
    assert abs(co["entropy"] - st["entropy"]) < 1e-5, shape
    # a real gradient, not a zero-advantage batch's zero one (the params compared below would be the init)
    assert st["grad_norm"] > 1e-3, (shape, st["grad_norm"])
    # Params after the update within 5e-6 = 0.005·lr (measured 4.7e-8 and 6.1e-7, 2026-12-06: 8x margin). The bound
    # was test_sharding's old 2e-5 while the gradient was exactly 0; an lr 1% off on one side moves them by 1e-5.
    for a, b in zip(co["params"], st["params"]):
      np.testing.assert_allclose(a, b, rtol=0, atol=5e-6, err_msg=shape)


def test_goldens_hold_with_the_continuous_engine(monkeypatch):
  """The GRPO golden run (3 steps: rollout, rewards, μ=2 × 2 minibatch updates) with the continuous engine and
  8 slots for its 16 rows gives the pinned numbers: same samples, so the same updates (params within the goldens'
  tolerance)."""
  assert_goldens_with(monkeypatch, engine="continuous", slots=8, compaction=2)


def assert_goldens_with(monkeypatch, **sampling):
  """The GRPO golden run with these sampling.* keys set gives the pinned numbers."""
  from tests import test_goldens as tg
  base = tg._config

  def config(algo):
    c = base(algo)
    c.sampling.update(sampling)
    return c
  monkeypatch.setattr(tg, "_config", config)
  got = tg._run("grpo")
  for k, w in tg.GOLDEN["grpo"].items():
    np.testing.assert_allclose([row[k] for row in got], w, rtol=tg.RTOL, atol=tg.ATOL, err_msg=k)


def test_dynamic_sampling_rollout_equals_the_static_engines():
  """DAPO's oversampled batch: all oversample × B groups are queued (a fixed queue) and then B kept, exactly as the
  static engine does; rows that end early (26 EOS ids), bf16 old log-probs recomputed, reference log-probs."""
  from grpo_jax.tasks import digits
  from tests.test_rl_step import TINY1, _ManyEos, _rollout  # one layer: MCFG's 2 cover the per-layer caches
  c = digits.bench_config(**TINY1)
  c.rl.update(dynamic_sampling=True, oversample=2)
  tok = _ManyEos(c.model.vocab_size)
  ref = _rollout(c, 2, tokenizer=tok)
  ro = _rollout(c, 2, tokenizer=tok, **{"sampling.engine": "continuous", "sampling.compaction": 3})
  np.testing.assert_array_equal(ro.tokens_NxL, ref.tokens_NxL)
  np.testing.assert_array_equal(ro.mask_NxL, ref.mask_NxL)
  assert 0 < ref.mask_NxL.sum() < ref.mask_NxL.size
  np.testing.assert_array_equal(ro.r_N, ref.r_N)
  assert int(ro.ds_kept) == int(ref.ds_kept)
  for f in ("old_logp_NxL", "ref_logp_NxL"):
    np.testing.assert_allclose(getattr(ro, f), getattr(ref, f), atol=1e-5, rtol=0)
  # slots = 32 rows / 2 chunks = 16: the queue was used; the continuous schedule wasted fewer row-steps
  assert float(ro.decode_admit_wait) > 0 and ref.decode_admit_wait is None
  assert 0 < float(ref.decode_slot_util) < float(ro.decode_slot_util) <= 1


@pytest.mark.parametrize("over,msg", [
    (dict(engine="paged"), "config.sampling.engine: unknown value 'paged'"),
    (dict(slots=65), "config.sampling.slots: 65 exceeds the 64 rollout rows"),
    (dict(slots=12), "config.sampling.slots: 12 must be divisible by mesh data\\*fsdp=8"),
    (dict(slots=-1), "config.sampling.slots: must be an integer >= 0"),
    (dict(compaction=-1), "config.sampling.compaction: must be an integer >= 1 .* or 0 \\(auto\\)"),
])
def test_bad_engine_config_is_one_config_error(over, msg):
  """Checked on plain values by validate_rl (exit 2 before anything compiles)."""
  from grpo_jax.config import config_lib
  from grpo_jax.run import validate
  c = config_lib.base_config()
  c.mesh.update(data=1, fsdp=8, tensor=1)
  c.eval.update(batch=8 * c.eval.n_samples, size=8 * c.eval.n_samples)
  c.sampling.update({"engine": "continuous", **over})
  with pytest.raises(validate.ConfigError, match=msg):
    validate.validate_rl(c, num_devices=8)
  c.sampling.update(engine="continuous", slots=16, compaction=4)
  validate.validate_rl(c, num_devices=8)


def test_auto_slots_planner_takes_the_most_slots_that_fit():
  """rl/auto.py: `sampling.slots=auto` resolves to the largest candidate (N, N/2, ... multiples of the row split)
  whose memory plan fits the device; a tighter device gets fewer slots; other knobs are left alone."""
  from grpo_jax.config import config_lib
  from grpo_jax.rl import auto, memory_plan
  # β = 0 (no reference forward), fp32 (no old-log-prob forward), 16 minibatches: the slots' KV is the peak
  c = memory_plan.workload_config("qwen2.5-1.5b", 16, 16, 512, 8192, dict(data=1, fsdp=8, tensor=1),
                                  engine="continuous", minibatches=16, algo="dr_grpo", dtype="float32")
  mesh = dict(data=1, fsdp=8, tensor=1)
  assert auto.slot_candidates(c, auto.Context(mesh, None)) == [256, 128, 64, 32, 16, 8]
  free, chosen = auto.resolve(c, auto.Context(mesh, None))
  assert free.sampling.slots == 256 and "sampling.slots" in chosen and c.sampling.slots == 0
  totals = {}
  for s in (256, 64):
    cs = config_lib.override(c, {"sampling.slots": s})
    totals[s] = memory_plan.plan(cs, mesh, "tpu").total_bytes
  assert totals[64] < totals[256]
  budget = (totals[64] + totals[256]) // 2  # between: 128 slots fit (planned 15.1 GiB of 16.9), 256 do not
  tight, _ = auto.resolve(c, auto.Context(mesh, budget, "tpu"))
  assert tight.sampling.slots == 128
  assert memory_plan.plan(config_lib.override(c, {"sampling.slots": 128}), mesh, "tpu").total_bytes <= budget
  assert auto.resolve(c, auto.Context(mesh, 1 << 30, "tpu"))[0].sampling.slots == 8  # none fits: the fewest
  assert auto.worst_case_steps(64, 8, 100) == 800
  chunked = config_lib.override(c, {"rl.rollout_chunks": 4})  # the rollout chunks bound the slots
  assert auto.slot_candidates(chunked, auto.Context(mesh, None)) == [64, 32, 16, 8]
  static = config_lib.override(c, {"sampling.engine": "static"})  # slots mean nothing there: left at 0
  assert auto.resolve(static, auto.Context(mesh, None))[0].sampling.slots == 0


def test_evaluation_generate_with_the_continuous_engine_equals_static():
  """Evaluation's sampled generate (eval.n_samples copies of each prompt, rows repeated as Evaluator._chunks does)
  prefills each prompt once under the continuous engine and returns the static engine's samples."""
  from grpo_jax.config import config_lib
  from grpo_jax.infra import sharding
  from grpo_jax.run import evaluation
  from grpo_jax.tasks import digits
  from tests.test_rl_step import TINY
  c = digits.bench_config(**TINY)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = M.ModelConfig.from_config(c.model)
  params = random_params(mcfg, 1)
  batch = next(digits.make_batches(4, 1, seed=2))
  n_samples = 3
  prompt = np.repeat(batch["prompt_NxP"], n_samples, 0)
  pmask = np.repeat(batch["prompt_mask_NxP"], n_samples, 0)
  scfg = S.SamplingConfig(max_new_tokens=c.sampling.max_new_tokens, eos_id=tuple(range(30, 64)))
  outs = {}
  for eng in ("static", "continuous"):
    # compaction 1: one decode phase (the unresolved default compiled 3 for the 12 rows); the claim is the prefill
    ce = config_lib.override(c, {"sampling.engine": eng, "sampling.compaction": 1})
    gen = evaluation.make_generate(mcfg, scfg, mesh, c.task.name, {}, in_graph=False, config=ce, group=n_samples)
    outs[eng] = jax.device_get(gen(params, prompt, pmask, {}, jax.random.PRNGKey(4)))
  lengths = outs["static"][2]
  assert lengths.min() < lengths.max(), lengths
  for a, b in zip(outs["static"], outs["continuous"]):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("slots,levels,split", [(0, 4, 1), (2, 2, 1), (8, 3, 2), (8, 2, 8)])
def test_numpy_schedule_replays_the_engine(params, slots, levels, split):
  """engine.simulate (what the roofline models decode with) gives the jitted engine's decode steps and row-steps
  for the lengths it produced, with one queue or with `split` per-device queues (run here on one device: the
  schedule is the same program a mesh partitions); split = 8 puts 2 rows of a 4-row group on each device (the
  prompt table copies each device its group's prompt). Samples are the static engine's either way."""
  prompt, pm = prompts(B, seed=6)
  G = 4
  scfg = S.SamplingConfig(max_new_tokens=L, eos_id=tuple(range(1, 12)))
  u = S.uniforms(jax.random.PRNGKey(9), L, B * G)
  ro, stats = continuous(params, prompt, pm, G, scfg, u, slots=slots, levels=levels, kv_block=4, split=split)
  assert_same(ro, reference(params, prompt, pm, G, scfg, u))
  sizes = E.compaction_sizes(slots or B * G, levels, split)
  sim = E.simulate(np.asarray(ro.lengths_N), slots or B * G, sizes, 4, L, split)
  assert (sim["steps"], sim["row_steps"]) == (int(ro.decode_steps), int(stats.row_steps))
  assert sim["tokens"] == int(np.sum(ro.lengths_N))
  if split > 1:  # per-device queues are a different schedule from one queue over all rows
    one = E.simulate(np.asarray(ro.lengths_N), slots, E.compaction_sizes(slots, levels), 4, L)
    assert one != sim, (one, sim)


def test_per_device_schedule_by_hand():
  """engine.simulate's per-device queues on lengths worked out by hand: 2 devices × 2 slots, rows 0-3 on device 0
  (lengths 1, 1, 1, 1) and rows 4-7 on device 1 (5, 1, 1, 1). Device 0's rows end at their first token (rows
  0, 1 from the prefill, 2, 3 after one step); device 1's row 4 holds a slot from the start for its 5 tokens while its other slot runs rows 5, 6,
  7. The loop runs until the slowest device is done: 4 decode steps (row 4's tokens 2..5), 4 slots each step."""
  sim = E.simulate(np.array([1, 1, 1, 1, 5, 1, 1, 1]), 4, (4,), 64, 8, split=2)
  assert sim == dict(steps=4, row_steps=16, kv_read=16 * 64, tokens=12)
  # one queue over all 4 slots: rows 0-3 take them first, row 4 gets one a step later and ends after 5 steps
  assert E.simulate(np.array([1, 1, 1, 1, 5, 1, 1, 1]), 4, (4,), 64, 8)["steps"] == 5


def test_roofline_decode_work_for_stated_lengths():
  """roofline.decode_work by hand: the static engine's row chunks each run to their longest row rounded up to the
  exit chunk and read the whole P + L cache; the continuous one replays engine.simulate and prefills B prompts;
  without lengths, the all-rows-to-L bound the roofline always used."""
  from grpo_jax.config import config_lib
  from grpo_jax.perf import roofline
  from grpo_jax.rl import memory_plan
  c = memory_plan.workload_config("tiny", 2, 2, 4, 10, dict(data=1, fsdp=1, tensor=1), rollout_chunks=2)
  c.sampling.exit_chunk = 4
  lengths = np.array([3, 10, 2, 5])
  # chunk 0 = rows 0, 2 (longest 3: 2 decode steps -> 4); chunk 1 = rows 1, 3 (longest 10: 9 steps, capped at L - 1)
  w = roofline.decode_work(c, lengths)
  assert w == dict(steps=9, row_steps=4 * 2 + 9 * 2, kv_read=26 * 14, prefill_rows=4, tokens=20)
  assert roofline.decode_work(c) == dict(steps=10, row_steps=40, kv_read=40 * 14, prefill_rows=4, tokens=40)
  # the static sampler emits token k at decode step k, so a longest row of 5 tokens is seen done after step 4 (the
  # second chunk: 8 steps), rows of 1 token after step 0 (4 steps), as tests/test_sampling.py's early-exit tests
  # measure it (the roofline counted 4 and 0)
  assert roofline.decode_work(c, np.array([5, 10, 1, 5]))["row_steps"] == 8 * 2 + 9 * 2
  assert roofline.decode_work(c, np.array([1, 1, 1, 1]))["steps"] == 4
  cc = config_lib.override(c, {"sampling.engine": "continuous", "sampling.slots": 4, "sampling.compaction": 2})
  sim = E.simulate(lengths, 4, (4, 2), 10, 10)
  w = roofline.decode_work(cc, lengths)
  assert w == dict(steps=sim["steps"], row_steps=sim["row_steps"], kv_read=sim["kv_read"] + sim["row_steps"] * 4,
                   prefill_rows=2, tokens=20)
  assert sim["steps"] == 9 and sim["row_steps"] < 26  # 4 slots, then 2 once two rows are left
  # on 2 devices each schedules its own rows in 2 slots: rows 0, 1 (lengths 3, 10) and rows 2, 3 (2, 5). After 2
  # steps rows 2 and 0 have ended, each device has 1 live row and compacts to 1 slot; row 1 needs 7 steps more
  c2 = config_lib.override(cc, {"mesh.fsdp": 2})
  sim2 = E.simulate(lengths, 4, (4, 2), 10, 10, split=2)
  assert roofline.decode_work(c2, lengths)["row_steps"] == sim2["row_steps"] == 2 * 4 + 7 * 2
  assert sim2["steps"] == 9
  flops = roofline.analytic_flops(cc, "cpu", lengths)
  assert flops["rollout decode"] < roofline.analytic_flops(c, "cpu", lengths)["rollout decode"]


def test_vmapped_rl_steps_with_the_continuous_engine_equal_the_static_ones():
  """studies/vmapped_runs.py: two runs (seeds, and a traced temperature each) in one vmapped RL program, the
  continuous engine's batched while predicates running until both runs are done: the same params and metrics as the
  static engine's program after a step."""
  from grpo_jax.config import config_lib
  from grpo_jax.studies import vmapped_runs as seeds_lib
  from tests import test_seeds as ts
  c, mesh, mcfg, spec, tok = ts._setup()
  out = {}
  for eng in ("static", "continuous"):
    # compaction 1: one decode phase (the unresolved default, config_lib.COMPACTION, compiled 4 for the 8 rows, the
    # step's host reward callback keeping it out of the persistent cache); vmapped compaction phases are
    # test_vmapped_runs_each_get_their_own_samples' subject
    ce = config_lib.override(c, {"sampling.engine": eng, "sampling.slots": 8, "sampling.compaction": 1})
    states = seeds_lib.init_states(ce, mcfg, [0, 1], hparams={"sampling.temperature": [1.0, 0.7]})
    step = seeds_lib.make_steps(ce, mesh, mcfg, spec, tok, compiler_options=seeds_lib.FAST_COMPILE)
    ms = []
    for b in ts.BATCHES[:1]:
      states, m = step(states, b)
      ms.append(seeds_lib.host_scalars(m))
    out[eng] = jax.device_get(states["params"]), ms
  for a, b in zip(jax.tree.leaves(out["static"][0]), jax.tree.leaves(out["continuous"][0])):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  for ms, mc in zip(out["static"][1], out["continuous"][1]):
    for k in ("train/loss", "train/reward_mean", "train/completion_len_mean", "train/kl"):
      np.testing.assert_allclose(mc[k], ms[k], atol=1e-5, rtol=1e-5, err_msg=k)
  assert out["continuous"][1][0]["train/completion_len_mean"][0] != out["continuous"][1][0][
      "train/completion_len_mean"][1] or out["continuous"][1][0]["train/loss"][0] != out["continuous"][1][0][
      "train/loss"][1]  # the two runs really differ
