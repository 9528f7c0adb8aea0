"""Attention paths against the einsum path (values and gradients, fp32) and against an independent NumPy attention
(odd shapes), the `auto` rule, and O(T) memory."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.model import attention as A
from grpo_jax.model import model as M
from grpo_jax.run import validate
from tests.jit_call import jit_call

# (heads, kv heads): GQA groups of 1, 2 and 7
GROUPS = {"g1": (2, 2), "g2": (4, 2), "g7": (7, 1)}
N, DH = 4, 8


def inputs(h, kv, t, seed=0):
  """Rows: 5 left pads; none; all pad; left pads + pads after the last token (a completion ended by EOS)."""
  rng = np.random.default_rng(seed)
  q = jnp.asarray(rng.standard_normal((N, t, h, DH)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((N, t, kv, DH)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((N, t, kv, DH)), jnp.float32)
  mask = np.ones((N, t), np.int32)
  mask[0, :5] = 0
  mask[2] = 0
  mask[3, :3] = 0
  mask[3, t - 4:] = 0
  # cotangent: random at real query positions, 0 at pads (whose outputs no caller reads)
  w = jnp.asarray(rng.standard_normal((N, t, h, DH)), jnp.float32) * (mask > 0)[:, :, None, None]
  return q, k, v, jnp.asarray(mask), w


PATHS = {
    # block 16 at T=37: three blocks, the last one padded
    "blockwise": (37, lambda q, k, v, m: A.blockwise(q, k, v, m, block=16)),
    # T=300 pads to 384 = three 128-tiles of the kernel (interpret mode: the TPU kernel's code, run on the CPU)
    "splash": (300, lambda q, k, v, m: A.splash(q, k, v, m, interpret=True)),
    # the cuDNN path's roll + sequence lengths, with XLA's implementation (cuDNN itself needs a GPU: test below)
    "seq_lengths": (37, lambda q, k, v, m: A.seq_lengths(q, k, v, m, implementation=None)),
}


_VALUE_AND_GRADS = {}


def value_and_grads(f, q, k, v, mask, w):
  """The value and (q, k, v) gradients of <f(q, k, v, mask), w>. One jitted program per path f, the mask and the
  cotangent its arguments (not constants baked into it): the einsum reference and each path compile once per shape,
  shared by the calls with another cotangent (w, then all ones) and by the paths of the same T (blockwise and
  seq_lengths both compare against the einsum at T = 37)."""
  if f not in _VALUE_AND_GRADS:
    _VALUE_AND_GRADS[f] = jax.jit(jax.value_and_grad(lambda q, k, v, mask, w: jnp.vdot(f(q, k, v, mask), w),
                                                     argnums=(0, 1, 2)))
  return _VALUE_AND_GRADS[f](q, k, v, mask, w)


@pytest.mark.parametrize("group", sorted(GROUPS))
@pytest.mark.parametrize("path", sorted(PATHS))
def test_path_equals_einsum_at_real_positions(path, group):
  t, f = PATHS[path]
  q, k, v, mask, w = inputs(*GROUPS[group], t)
  real = np.asarray(mask) > 0
  want_o = np.asarray(jax.jit(A.einsum)(q, k, v, mask))
  got_o = np.asarray(jax.jit(f)(q, k, v, mask))
  assert got_o.shape == want_o.shape and got_o.dtype == np.float32
  assert np.abs(got_o - want_o)[real].max() <= 1e-5
  assert np.abs(want_o[real]).max() > 0.5  # not vacuous
  _, want_g = value_and_grads(A.einsum, q, k, v, mask, w)
  _, got_g = value_and_grads(f, q, k, v, mask, w)
  for name, a, b in zip("qkv", got_g, want_g):
    assert np.abs(np.asarray(a) - np.asarray(b)).max() <= 1e-5, name
    assert np.abs(np.asarray(b)).max() > 1e-2, name
  # The fully padded row (2): finite values (0), and no gradient even when its outputs get a cotangent.
  assert np.isfinite(got_o).all() and np.all(got_o[~real] == 0.0)
  w_all = jnp.ones_like(w)
  _, g_all = value_and_grads(f, q, k, v, mask, w_all)
  for name, g in zip("qkv", g_all):
    g = np.asarray(g)
    assert np.isfinite(g).all() and np.all(g[2] == 0.0), name
    # pad keys get no gradient anywhere; pad queries (zero output) pass none either
    assert np.all(g[~real] == 0.0), name


@pytest.mark.skipif(jax.default_backend() != "gpu",
                    reason="cuDNN flash attention needs an NVIDIA GPU and this machine has none (run with "
                    "JAX_PLATFORMS=cuda on one); its roll + sequence-length logic is checked on the CPU above "
                    "(path seq_lengths)")
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_cudnn_equals_einsum_on_gpu(group):
  # cuDNN has no fp32 kernel: bf16 inputs against the einsum path on the same (bf16-rounded) inputs in fp32.
  q, k, v, mask, w = inputs(*GROUPS[group], 256)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  real = np.asarray(mask) > 0
  up = lambda *xs: [x.astype(jnp.float32) for x in xs]
  want_o = np.asarray(A.einsum(*up(q, k, v), mask))
  got_o = np.asarray(jax.jit(lambda q, k, v: A.seq_lengths(q, k, v, mask, "cudnn"))(q, k, v), np.float32)
  assert np.abs(got_o - want_o)[real].max() <= 2e-2 and np.isfinite(got_o).all()
  _, want_g = value_and_grads(A.einsum, *up(q, k, v), mask, w)
  _, got_g = value_and_grads(lambda q, k, v, m: A.seq_lengths(q, k, v, m, "cudnn"), q, k, v, mask,
                             w.astype(jnp.bfloat16))
  for a, b in zip(got_g, want_g):
    scale = np.abs(np.asarray(b)).max()
    assert np.abs(np.asarray(a, np.float32) - np.asarray(b)).max() <= 3e-2 * scale


def test_blockwise_under_vmap_and_bf16():
  """seeds.py vmaps whole steps: the custom_vjp and its loops batch; bf16 inputs stay close to the fp32 result."""
  q, k, v, mask, w = inputs(4, 2, 37)
  f = lambda q, k, v: A.blockwise(q, k, v, mask, block=16)
  g = jax.jit(jax.vmap(jax.grad(lambda q, k, v, w: jnp.vdot(f(q, k, v), w)), in_axes=(None, None, None, 0)))
  gq = np.asarray(g(q, k, v, jnp.stack([w, 2 * w])))
  _, (want, _, _) = value_and_grads(A.einsum, q, k, v, mask, w)
  np.testing.assert_allclose(gq[0], np.asarray(want), atol=1e-5)
  np.testing.assert_allclose(gq[1], 2 * np.asarray(want), atol=2e-5)
  bf = jax.jit(f)(*(x.astype(jnp.bfloat16) for x in (q, k, v)))
  assert bf.dtype == jnp.bfloat16
  real = np.asarray(mask) > 0
  err = np.abs(np.asarray(bf, np.float32) - np.asarray(jit_call(A.einsum, q, k, v, mask)))[real].max()
  assert 1e-4 < err < 5e-2, err  # bf16 really used, and still close


def test_blockwise_traces_under_x64():
  """Under jax_enable_x64 a bare jnp.arange is int64 while the key-block bounds are int32: fori_loop refused the
  mixed bounds (values and gradients now as in 32-bit mode). Runs themselves refuse x64 (preflight.check_precision)."""
  with jax.enable_x64(True):
    q, k, v, mask, w = inputs(2, 2, 37)
    got, got_g = value_and_grads(lambda q, k, v, m: A.blockwise(q, k, v, m, block=16), q, k, v, mask, w)
    want, want_g = value_and_grads(A.einsum, q, k, v, mask, w)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)
  for a, b in zip(got_g, want_g):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


def test_blockwise_skips_key_blocks_before_the_segments_of_a_query_block():
  """first_key_block: a query block starts at the block of its earliest real query's segment start (packed rows:
  near the diagonal), a block of pads only gets no key block, the minimum is over rows, and an id that appears in two
  runs starts at its first. The skipped blocks are fully masked: blockwise still equals the einsum path there."""
  seg = np.zeros((2, 64), np.int32)  # blocks of 16
  seg[0, :20], seg[0, 20:40], seg[0, 40:48] = 1, 2, 3   # row 0: three samples, then pads (block 3: pad only)
  seg[1, 36:60] = 5                                      # row 1: pads, one sample in blocks 2-3
  # first_key_block as one program per shape, as blockwise runs it (eagerly, each of its ~20 ops its own program)
  assert jit_call(A.first_key_block, seg, 16).tolist() == [0, 0, 1, 2]
  assert jit_call(A.first_key_block, seg[:1], 16).tolist() == [0, 0, 1, 4]  # block 3: no real query
  split = seg.copy()
  split[0, 50:60] = 1  # id 1 again after id 3: visible to its first run's keys
  assert jit_call(A.first_key_block, split[:1], 16).tolist() == [0, 0, 1, 0]
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, 64, h, DH)), jnp.float32) for h in (4, 2, 2))
  # jitted with the segment ids an argument (as the model runs them): one program per path for both layouts, where
  # eager execution compiled ~100 single ops (blockwise reads the ids only as traced values, no Python branch on them)
  einsum, blockwise = jax.jit(A.einsum), jax.jit(lambda q, k, v, m: A.blockwise(q, k, v, m, block=16))
  for m in (seg, split):
    real = m > 0
    want = np.asarray(einsum(q, k, v, jnp.asarray(m)))
    got = np.asarray(blockwise(q, k, v, jnp.asarray(m)))
    assert np.abs(got - want)[real].max() <= 1e-5


def test_auto_rule(monkeypatch):
  f32 = jnp.float32
  assert A.platform() == "cpu"
  # CPU: einsum below the measured crossover while its scores fit the budget, blockwise otherwise
  assert A.choose("auto", 8, A.CPU_BLOCKWISE_MIN_T - 1, 4, f32) == "xla"
  assert A.choose("auto", 8, A.CPU_BLOCKWISE_MIN_T, 4, f32) == "blockwise"
  t = 256
  n_over = A.EINSUM_MAX_SCORE_BYTES // (4 * t * t * 4) + 1  # rows whose [N, 4, T, T] fp32 scores exceed it
  assert A.choose("auto", n_over - 1, t, 4, f32) == "xla" and A.choose("auto", n_over, t, 4, f32) == "blockwise"
  for name in A.IMPLEMENTATIONS[1:]:
    assert A.choose(name, 1 << 20, 1 << 20, 64, f32) == name  # explicit choices are kept
  assert A.choose("auto", 1, 16, 4, f32, plat="tpu") == "splash"
  monkeypatch.setattr(A, "platform", lambda: "tpu")
  assert A.choose("auto", 1, 16, 4, f32) == "splash"
  monkeypatch.setattr(A, "platform", lambda: "gpu")
  assert A.choose("auto", 1, 16, 4, jnp.bfloat16) == "cudnn" and A.choose("auto", 1, 16, 4, f32) == "blockwise"


def test_platform_follows_the_mesh():
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
  with jax.set_mesh(mesh):
    assert A.platform() == "cpu"


def test_config_choices_and_errors():
  assert validate.ATTENTION == A.IMPLEMENTATIONS
  assert M.ModelConfig().attention == "auto"
  with pytest.raises(ValueError, match="model.attention='cudnn' needs model.dtype='bfloat16'"):
    M.ModelConfig(attention="cudnn")
  assert M.ModelConfig(attention="cudnn", dtype="bfloat16").attention == "cudnn"
  with pytest.raises(ValueError, match="model.attention='flash'"):
    M.ModelConfig(attention="flash")


def _big_2d_shapes(hlo: str, t: int) -> set[str]:
  """Array shapes in an HLO text with at least two dimensions >= t."""
  out = set()
  for dims in re.findall(r"\b(?:f32|bf16|f16|s32|u32|pred|s8|u8)\[([\d,]+)\]", hlo):
    if sum(int(x) >= t for x in dims.split(",") if x) >= 2:
      out.add(dims)
  return out


def test_compiled_cpu_training_step_holds_no_txt_buffer():
  """The model's compiled forward+backward at T=2048 (auto and blockwise) has no array with two dims >= T; the einsum
  path's has (so the check can see one)."""
  t = 2048
  base = M.ModelConfig(vocab_size=64, hidden=32, layers=2, heads=4, kv_heads=2, inter=64, max_len=t, remat="full")
  tokens = jnp.zeros((1, t), jnp.int32)
  mask = jnp.ones((1, t), jnp.int32).at[0, :7].set(0)
  pos = jnp.maximum(jnp.cumsum(mask, 1) - 1, 0)
  params = jax.eval_shape(lambda: M.init_params(base, jax.random.PRNGKey(0)))

  def hlo(mcfg):
    loss = lambda p: (M.token_logprobs(mcfg, p, tokens, pos, mask)[0] * mask).sum()
    return jax.jit(jax.grad(loss)).lower(params).compile().as_text()

  for impl in ("auto", "blockwise"):
    assert not _big_2d_shapes(hlo(dataclasses.replace(base, attention=impl)), t), impl
  assert _big_2d_shapes(hlo(dataclasses.replace(base, attention="xla")), t)


def test_rl_step_temp_grows_linearly_with_completion_length():
  """XLA:CPU temp of the compiled RL step (tiny preset, 2 prompts × G2, 32+L tokens, fp32, remat=full, one device)
  at L=512 and 1024, model.attention=auto. Measured under these test flags: 37.4 → 70.5 MiB (×1.89); the einsum
  path's 141.6 → 471.8 MiB (×3.33). docs/scale.md has L up to 4096 under default flags."""
  from grpo_jax.perf import aot
  from grpo_jax.rl import memory_plan
  one = dict(data=1, fsdp=1, tensor=1)
  temp = {}
  for L in (512, 1024):
    cfg = memory_plan.workload_config("tiny", prompts=2, G=2, prompt_len=32, L=L, dtype="float32", remat="full")
    compiled, _ = aot.compile_step(cfg, jax.devices()[:1], one)
    m = compiled.memory_analysis()
    temp[L] = m.temp_size_in_bytes
    # The planner's O(T) (blockwise) model agrees with XLA:CPU here as at L = 2048 and 4096 (docs/scale.md).
    xla = m.argument_size_in_bytes + m.temp_size_in_bytes
    assert abs(memory_plan.plan(cfg, one, plat="cpu").total_bytes / xla - 1) < 0.15, (L, xla)
  assert temp[1024] / temp[512] <= 2.6, temp


def np_attention(q, k, v, seg, do):
  """Independent reference in float64, from the formula: o = softmax(q·kᵀ/√d + mask)·v with query head h on kv head
  h // (H/K), a key visible when causal, in the query's segment and not pad; a pad query (or one that sees nothing)
  gives 0. Also the analytic gradients of <o, do>: dv = pᵀ·do, ds = p ∘ (do·vᵀ − rowsum(p ∘ do·vᵀ)),
  dq = ds·k/√d, dk = dsᵀ·q/√d (summed over a kv head's query heads)."""
  q, k, v, do = (np.asarray(x, np.float64) for x in (q, k, v, do))
  seg = np.asarray(seg)
  n, t, h, d = q.shape
  g = h // k.shape[2]
  kr, vr = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
  ok = (np.tril(np.ones((t, t), bool))[None] & (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0))[:, None]
  s = np.where(ok, np.einsum("nthd,nshd->nhts", q, kr) / np.sqrt(d), -np.inf)
  mx = np.where(ok.any(-1, keepdims=True), s.max(-1, keepdims=True), 0.0)
  e = np.where(ok, np.exp(s - mx), 0.0)
  p = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
  o = np.einsum("nhts,nshd->nthd", p, vr)
  dp = np.einsum("nthd,nshd->nhts", do, vr)
  ds = p * (dp - (p * dp).sum(-1, keepdims=True)) / np.sqrt(d)
  fold = lambda x: x.reshape(n, t, -1, g, d).sum(3)  # [N, T, H, D] -> [N, T, K, D]
  return o, (np.einsum("nhts,nshd->nthd", ds, kr), fold(np.einsum("nhts,nthd->nshd", ds, q)),
             fold(np.einsum("nhts,nthd->nshd", p, do)))


ODD = {
    # T=1: a single token per row (one block of 8 for blockwise); GQA groups 2
    "t1_g2": (1, 4, 2),
    # T=19, blocks of 8: the last block 3/8 real; MQA (group 4, not in GROUPS); packed rows with a one-token sample
    "t19_g4": (19, 4, 1),
}
ODD_PATHS = {"xla": A.einsum, "dot_product": A.dot_product, "blockwise": lambda q, k, v, m: A.blockwise(q, k, v, m, 8)}


_ODD_JITTED = {}


def _odd_value_and_vjp(path):
  """One jitted (value, vjp) program per path (eagerly, every op of the loops compiled on its own: ~8 s a case)."""
  if path not in _ODD_JITTED:
    def run(q, k, v, seg, do):
      o, vjp = jax.vjp(lambda q, k, v: ODD_PATHS[path](q, k, v, seg), q, k, v)
      return o, vjp(do)
    _ODD_JITTED[path] = jax.jit(run)
  return _ODD_JITTED[path]


@pytest.mark.parametrize("shape", sorted(ODD))
@pytest.mark.parametrize("path", sorted(ODD_PATHS))
def test_paths_equal_an_independent_numpy_attention(path, shape):
  """Values and (q, k, v) gradients against `np_attention` (float64) on shapes the einsum comparison above does not
  take: a single token, a length that is not a multiple of the block, MQA, and rows that are left-padded, all pad
  (finite, no gradient), packed (a one-token sample) and right-padded."""
  t, h, kv = ODD[shape]
  rng = np.random.default_rng(t)
  q, k, v = (rng.standard_normal((4, t, x, DH)).astype(np.float32) for x in (h, kv, kv))
  seg = np.ones((4, t), np.int32)
  seg[1] = 0  # all pad
  if t > 1:
    seg[0, :5] = 0  # left pads
    seg[2, 7], seg[2, 8:15], seg[2, 15:] = 2, 3, 0  # packed: sample 1 (7 tokens), a one-token sample, one more, pads
    seg[3, -2:] = 0  # right pads after the last token
  do = rng.standard_normal((4, t, h, DH)) * (seg > 0)[:, :, None, None]
  want_o, want_g = np_attention(q, k, v, seg, do)
  o, got_g = _odd_value_and_vjp(path)(q, k, v, seg, do.astype(np.float32))
  real = seg > 0
  o = np.asarray(o)
  assert np.isfinite(o).all() and np.abs(o - want_o)[real].max() <= 2e-6
  for name, a, b in zip("qkv", got_g, want_g):
    a = np.asarray(a)
    assert np.isfinite(a).all() and np.abs(a - b).max() <= 2e-5 * max(1.0, np.abs(b).max()), name
    assert np.all(a[1] == 0.0), name  # the all-pad row passes no gradient
