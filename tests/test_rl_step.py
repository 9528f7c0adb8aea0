"""The one-graph GRPO step on the peers' workload: on-policy ratio, no retrace, golden metrics, reward paths."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.rl import advantages
from grpo_jax.config import config_lib
from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.rl import rewards
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.rl import state as state_lib
from grpo_jax.infra import sharding
from grpo_jax.rl import update as update_lib
from grpo_jax.run import validate
from grpo_jax.tasks import digits
from tests import noise

TINY = dict(hidden=32, layers=2, heads=4, kv=2, inter=64, vocab=64, prompts=4, G=4, L=12)
# One layer where a claim does not depend on depth: the training pass unrolls its layer scan (model.layer_unroll
# auto), so each layer is traced, lowered and compiled again.
TINY1 = dict(TINY, layers=1)


def _setup(spec=None, **over):
  c = digits.bench_config(**{**TINY, **over})
  c.optim.lr = 1e-3  # large enough that one update visibly moves a random model
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = spec or digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  return c, mesh, mcfg, step


def _batches(c, n=3):
  """Single-digit answers: a random 64-token model hits them sometimes, so groups have reward variance."""
  bs = list(digits.make_batches(c.rl.prompts_per_step, n, seed=1))
  for b in bs:
    b["answer_ids_NxA"][:, 1:] = -1
  return bs


@pytest.fixture(scope="module")
def three_steps():
  c, mesh, mcfg, step = _setup()
  state = rl_step.init(c, mesh, mcfg, seed=0)
  p0 = jax.device_get(state["params"])
  ms, ps = [], []
  for b in _batches(c):
    state, m = step(state, b)
    ms.append(jax.device_get(m))
    ps.append(jax.device_get(state["params"]))
  return dict(c=c, step=step, state=state, p0=p0, metrics=ms, params=ps)


def test_on_policy_ratio_is_one_and_params_move(three_steps):
  for m in three_steps["metrics"]:
    # Sampler log-probs and the training forward agree in fp32: ρ = 1 at μ = 1.
    assert abs(m["train/ratio_max"] - 1.0) < 1e-5
    assert abs(m["train/ratio_mean"] - 1.0) < 1e-5
    assert m["train/kl"] >= 0.0
    assert m["train/grad_norm"] > 0.0
  p1 = jax.device_get(three_steps["state"]["params"])
  diffs = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(three_steps["p0"]), jax.tree.leaves(p1))]
  assert max(diffs) > 0


def test_no_retrace_over_three_steps(three_steps):
  assert three_steps["step"].traces() == 1
  assert int(three_steps["state"]["step"]) == 3


def test_reference_stays_frozen(three_steps):
  ref = jax.device_get(three_steps["state"]["ref_params"])
  for a, b in zip(jax.tree.leaves(three_steps["p0"]), jax.tree.leaves(ref)):
    np.testing.assert_array_equal(a, b)


def test_prorl_reference_reset():
  """rl.ref_reset_every=2: after update 1 the reference is still the start and the optimizer has one update in it;
  after update 2 the reference IS the updated policy and the optimizer state is a fresh init (moments 0, counts 0)
  with the learning rate kept; update 3 samples from a policy equal to its reference, so its KL is 0 (as step 1's)."""
  c = config_lib.override(digits.bench_config(**TINY1), {"rl.ref_reset_every": 2, "optim.lr": 1e-3})
  validate.validate_rl(c, num_devices=1)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  state = rl_step.init(c, mesh, mcfg, seed=0)
  p0 = jax.device_get(state["params"])
  resets, kls, states = [], [], []
  for b in _batches(c):
    state, m = step(state, b)
    resets.append(float(m["train/ref_reset"]))
    kls.append(float(m["train/kl"]))
    states.append(jax.device_get(state))
  assert resets == [0.0, 1.0, 0.0]
  leaves = lambda t: jax.tree.leaves(t)
  for a, b in zip(leaves(states[0]["ref_params"]), leaves(p0)):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(leaves(states[1]["ref_params"]), leaves(states[1]["params"])):
    np.testing.assert_array_equal(a, b)
  assert max(np.abs(a - b).max() for a, b in zip(leaves(states[1]["params"]), leaves(p0))) > 0
  opt1, opt2 = states[0]["opt_state"], states[1]["opt_state"]
  fresh = jax.device_get(jax.jit(rl_step.optimizer(c).tx.init)(state["params"]))  # one program, not one per op
  for a, b in zip(leaves(opt2), leaves(fresh)):  # every moment and count as a fresh init ...
    np.testing.assert_array_equal(a, b)
  assert int(opt1.count) == 1 and max(np.abs(x).max() for x in leaves(opt1.inner_state)) > 0
  assert float(opt2.hyperparams["learning_rate"]) == pytest.approx(1e-3)  # ... the learning rate kept
  assert abs(kls[0]) < 1e-9 and abs(kls[2]) < 1e-9 and kls[1] > 1e-6, kls


def test_golden_first_step(three_steps):
  """Fixed seed → known metrics. Update these numbers only for an intended change of sampling, init or loss
  (run this test, read the new values, and say in the commit why they moved)."""
  m = three_steps["metrics"][0]
  got = {k: round(float(m[k]), 4) for k in ("train/reward_mean", "train/completion_len_mean", "train/kl",
                                               "train/truncation_rate", "train/frac_zero_std_groups")}
  np.testing.assert_allclose([m["train/loss"], m["train/grad_norm"]], GOLDEN_LOSS_GRAD, rtol=1e-4, atol=1e-6)
  assert got["train/kl"] == 0.0  # policy == reference before the first update
  assert got == GOLDEN, got


GOLDEN = {"train/reward_mean": 0.0625, "train/completion_len_mean": 11.5, "train/kl": 0.0,
          "train/truncation_rate": 0.875, "train/frac_zero_std_groups": 0.75}
# ρ = 1: the surrogate is Σ A = 0 per group, the gradient is not. The gradient was 0.29769 with the population std
# (ddof=0); ddof=1 scales the advantages, so the gradient, by √((G−1)/G) = √(3/4): 0.25781.
GOLDEN_LOSS_GRAD = [0.0, 0.25781]


def test_dynamic_sampling_keeps_varied_groups_and_updates():
  """DAPO dynamic sampling: of 2·B prompts the B groups kept are those with reward variance first (the rest fill
  up), and the update is applied (the per-term reward status is not gathered with the rows; when it was, every
  step came back skipped)."""
  c = digits.bench_config(**TINY1)
  c.optim.lr = 1e-3
  c.rl.update(dynamic_sampling=True, oversample=2)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
  state = rl_step.init(c, mesh, mcfg, seed=0)
  p0 = jax.device_get(state["params"])
  batch = next(digits.make_batches(2 * c.rl.prompts_per_step, 1, seed=1))
  batch["answer_ids_NxA"][:, 1:] = -1
  state, m = step(state, batch)
  assert int(state["step"]) == 1 and int(m["train/skipped_updates"]) == 0
  assert (np.asarray(m["reward_status"]) == reward_spec.OK).all()
  kept, B = int(m["train/dynamic_sampling_kept"]), c.rl.prompts_per_step
  assert 0 < kept <= B
  assert float(m["train/frac_zero_std_groups"]) == pytest.approx((B - kept) / B)
  moved = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(state["params"])))]
  assert max(moved) > 0


def test_one_registered_function_is_a_new_algorithm():
  """The recipe of docs/architecture.md: one registered estimator plus one preset entry is a new rl.algo that the
  family registry runs with rl_step, and every valid token of a row gets the row's advantage (hand-computed: r −
  group median)."""
  name = "test_median_baseline"

  @advantages.register(name)
  def _median_baseline(r_BxG, ctx):
    return r_BxG - jnp.median(r_BxG, axis=1, keepdims=True)

  presets.PRESETS[name] = {**presets.GRPO, "rl.advantage": name}
  try:
    c = presets.apply(digits.bench_config(**TINY), name)
    c.rl.G = 4
    assert name in families.algos() and families.for_config(c) is rl_step
    validate.validate_algorithm(c)
    r_N = jnp.asarray([1.0, 0.0, 0.0, 3.0, 2.0, 2.0, 2.0, 2.0])  # medians 0.5 and 2
    mask_NxL = jnp.asarray(np.tril(np.ones((8, 3)), 1)[[0, 1, 2, 2, 1, 0, 0, 1]], jnp.float32)
    zeros_NxL = jnp.zeros((8, 3))
    ro = rollout_lib.Rollout(seq=None, tokens_NxL=None, mask_NxL=mask_NxL, lengths_N=None, truncated_N=None, r_N=r_N,
                         per_term={}, terms_NxK=r_N[:, None], term_w_K=jnp.ones((1,)), steps=None,
                         old_logp_NxL=zeros_NxL, ref_logp_NxL=zeros_NxL, status=None, fallbacks=None, ds_kept=None)
    want_N = np.array([0.5, -0.5, -0.5, 2.5, 0.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(rl_step.compute_advantages(c, ro), want_N[:, None] * np.asarray(mask_NxL))
  finally:
    advantages.ESTIMATORS.pop(name)
    presets.PRESETS.pop(name)
  with pytest.raises(ValueError, match=f"config.rl.algo='{name}'"):
    families.for_config(c)


class _Switchable:
  """One Python reward whose misbehaviour (or the task's own reward, "contains") is chosen per call, so all cases
  share one compiled step."""
  kind = "ok"

  def __call__(self, texts, ids, batch):
    if self.kind == "contains":
      return digits.contains_answer_py(texts, ids, batch)
    if self.kind == "raise":
      raise KeyError("answer")
    if self.kind == "nan":
      return [float("nan")] * len(texts)
    if self.kind == "short":
      return [1.0] * (len(texts) - 1)
    if self.kind == "type":
      return "1.0"
    return [0.5] * len(texts)


@pytest.fixture(scope="module")
def switchable_step():
  fn = _Switchable()
  fn.__name__ = "my_reward"
  tok = digits.Tokenizer(TINY["vocab"])
  spec = rewards.build((("bad", 1.0),), reward_spec.Context(digits.TASK, tok), {"bad": fn})
  c, mesh, mcfg, step = _setup(spec=spec)
  return fn, spec, c, mesh, mcfg, step


def test_python_reward_path_matches_in_graph(three_steps, switchable_step):
  """The same reward through jax.pure_callback gives the same rewards, losses and updated params. (The callback
  step is switchable_step's, its Python term set to the task's own reward: one uncacheable compile, not two.)"""
  fn, spec, c, mesh, mcfg, step = switchable_step
  fn.kind = "contains"
  state = rl_step.init(c, mesh, mcfg, seed=0)
  state, m1 = step(state, _batches(c, 1)[0])
  m0, p0 = three_steps["metrics"][0], three_steps["params"][0]
  np.testing.assert_array_equal(m0["samples/r_N"], m1["samples/r_N"])
  for k in ("train/reward_mean", "train/loss", "train/grad_norm"):
    np.testing.assert_allclose(m0[k], m1[k], rtol=1e-6, atol=1e-7)
  assert m0["train/reward_mean"] > 0
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(state["params"]))):
    np.testing.assert_allclose(a, b, atol=1e-7)


@pytest.mark.parametrize("kind,status", [("raise", reward_spec.RAISED), ("nan", reward_spec.NONFINITE),
                                         ("short", reward_spec.WRONG_LENGTH), ("type", reward_spec.WRONG_TYPE)])
def test_bad_python_reward_skips_update_and_names_function(switchable_step, kind, status):
  fn, spec, c, mesh, mcfg, step = switchable_step
  fn.kind = kind
  state = rl_step.init(c, mesh, mcfg, seed=0)
  p0 = jax.device_get(state["params"])
  state, m = step(state, _batches(c, 1)[0])
  assert int(np.max(m["reward_status"])) == status
  assert int(state["step"]) == 0  # the state came back untouched
  for a, b in zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(state["params"]))):
    np.testing.assert_array_equal(a, b)
  msg = spec.python_terms["bad"].error_message(int(np.max(m["reward_status"])))
  assert "my_reward" in msg and "reward_fallback" in msg
  fn.kind = "ok"
  state, m = step(state, _batches(c, 1)[0])
  assert int(np.max(m["reward_status"])) == reward_spec.OK and int(state["step"]) == 1
  assert step.traces() == 1


def test_reward_fallback_is_counted():
  """With a fallback the bad scores are replaced per sample and counted; the host-side path alone."""
  term = rewards.PythonTerm("bad", lambda t, i, b: [1.0, float("nan"), "x"], digits.Tokenizer(8),
                            fallback=-1.0)
  r, status, fb = term.host(np.ones((3, 2), np.int32) * 5, np.ones((3, 2), np.int32), {})
  assert int(status) == reward_spec.OK and int(fb) == 2
  np.testing.assert_array_equal(r, [1.0, -1.0, -1.0])
  term = rewards.PythonTerm("bad", lambda t, i, b: 1 / 0, digits.Tokenizer(8), fallback=0.0)
  r, status, fb = term.host(np.ones((3, 2), np.int32), np.ones((3, 2), np.int32), {})
  assert int(status) == reward_spec.OK and int(fb) == 3 and "ZeroDivisionError" in term.last_error


class _RaisesMidway:
  def __len__(self):
    return 3

  def __iter__(self):
    yield 1.0
    raise RuntimeError("the scorer broke")


@pytest.mark.parametrize("out,status", [
    ([1e39, 0.0, 0.0], reward_spec.NONFINITE),        # finite in Python, inf in float32: was taken as inf
    ([10 ** 400, 0.0, 0.0], reward_spec.NONFINITE),   # float() raises OverflowError: crossed the callback
    (np.array(1.0), reward_spec.WRONG_TYPE),          # len() of a 0-d array raises: crossed the callback
    ({0: 1.0, 1: 1.0, 2: 1.0}, reward_spec.WRONG_TYPE),  # a dict was read as its keys (0, 1, 2)
    (bytearray(b"\x01\x00\x01"), reward_spec.WRONG_TYPE),  # bytes-like: read as the byte values [1, 0, 1]
    (memoryview(b"\x01\x00\x01"), reward_spec.WRONG_TYPE),
    (b"\x01\x00\x01", reward_spec.WRONG_TYPE),
    ("101", reward_spec.WRONG_TYPE),
    ({1.0, 0.0, 0.5}, reward_spec.WRONG_TYPE),          # a set: its scores in no order
    (_RaisesMidway(), reward_spec.WRONG_TYPE),         # len() 3, then iteration raises after one score
    ((x for x in [1.0, 0.0, 0.0]), reward_spec.WRONG_TYPE),  # a generator: no len()
])
def test_python_reward_outputs_the_step_cannot_hold_are_named_never_raised(out, status):
  term = rewards.PythonTerm("bad", lambda t, i, b: out, digits.Tokenizer(8))
  r, st, fb = term.host(np.ones((3, 2), np.int32), np.ones((3, 2), np.int32), {})
  assert int(st) == status and int(fb) == 0 and np.all(r == 0) and "\n" not in term.last_error
  assert len(term.last_error) < 200
  term = rewards.PythonTerm("bad", lambda t, i, b: out, digits.Tokenizer(8), fallback=-1.0)
  r, st, fb = term.host(np.ones((3, 2), np.int32), np.ones((3, 2), np.int32), {})
  assert int(st) == reward_spec.OK and np.all(np.isfinite(r)) and int(fb) >= 1


def test_counted_fallbacks_say_why_in_the_log_once(monkeypatch):
  """A fallback score was counted (train/reward_fallbacks) but its reason was logged nowhere."""
  import types
  from grpo_jax.run import train
  term = rewards.PythonTerm("bad", lambda t, i, b: [1.0, float("nan"), "x"], digits.Tokenizer(8), fallback=-1.0)
  spec = types.SimpleNamespace(python_terms={"bad": term}, env=None)
  logged = []
  monkeypatch.setattr(train.logging, "warning", lambda msg, *a: logged.append(msg % a))
  seen = set()
  for _ in range(3):
    term.host(np.ones((3, 2), np.int32), np.ones((3, 2), np.int32), {})
    train.log_fallbacks(spec, {"train/reward_fallbacks": np.float32(2)}, seen)
  assert len(logged) == 1 and "train/reward_fallbacks" in logged[0] and "reward term 'bad': score 2 is str" in logged[0]
  train.log_fallbacks(spec, {"train/reward_fallbacks": np.float32(0)}, set())
  assert len(logged) == 1  # no fallback this step: nothing said


def test_hanging_python_reward_times_out():
  import time

  def slow(texts, ids, batch):
    time.sleep(5)
    return [0.0] * len(texts)
  term = rewards.PythonTerm("slow", slow, digits.Tokenizer(8), timeout_s=0.2)
  r, status, fb = term.host(np.zeros((2, 3), np.int32), np.ones((2, 3), np.int32), {})
  assert int(status) == reward_spec.TIMEOUT
  assert "timed out" in term.error_message(int(status))


# ------------------------------------------------------------------------------------ rollout chunks and β = 0


def _rollout(c, chunks, ref=True, tokenizer=None, **over):
  """One rollout (jitted rollout_fn) of TINY on a fixed batch and key, with `chunks` row chunks (`over`: more
  config overrides)."""
  c = config_lib.override(c, {"rl.rollout_chunks": chunks, **over})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  fn = rollout_lib.make_rollout_fn(c, mcfg, spec, tokenizer or spec.ctx.tokenizer)
  st = rl_step.init(c, mesh, mcfg, seed=0)
  n_prompts = c.rl.prompts_per_step * (c.rl.oversample if c.rl.dynamic_sampling else 1)
  batch = next(digits.make_batches(n_prompts, 1, seed=1))
  with sharding.mesh_context(mesh):
    return jax.device_get(jax.jit(fn)(st["params"], st["ref_params"] if ref else None, batch,
                                      jax.random.PRNGKey(3)))


class _ManyEos(digits.Tokenizer):
  """EOS = 26 of the 64 ids: the random model ends its rows after a few tokens, at lengths that vary per step."""
  eos_ids = (digits.EOS,) + tuple(range(39, 64))


def test_chunked_early_exit_bucketed_rollout_gives_the_same_samples_and_logprobs():
  """Each row's uniforms are drawn for all rows at once, so 4 chunks of 4 rows sample exactly the tokens of one
  16-row rollout, also when each chunk's decode exits early (sampling.exit_chunk=2) and the reference and (bf16)
  old-log-prob forwards run in chunks on the shortest of 3 training lengths covering every row (rl.train_buckets);
  the log-probs agree to rounding with the full-length, unchunked ones. Dynamic sampling chunks the 32 sampled and
  then the 16 kept rows. (fp32 without dynamic sampling: the whole-step tests.)"""
  c = digits.bench_config(**{**TINY1, "dtype": "bfloat16"})
  c.rl.update(dynamic_sampling=True, oversample=2)
  tok = _ManyEos(c.model.vocab_size)
  one = _rollout(c, 1, tokenizer=tok, **{"sampling.exit_chunk": 0})
  four = _rollout(c, 4, tokenizer=tok, **{"sampling.exit_chunk": 2, "rl.train_buckets": 3})
  np.testing.assert_array_equal(one.tokens_NxL, four.tokens_NxL)
  np.testing.assert_array_equal(one.mask_NxL, four.mask_NxL)
  assert 0 < one.mask_NxL.sum() < one.mask_NxL.size  # some rows end early: EOS handling is compared too
  np.testing.assert_array_equal(one.r_N, four.r_N)
  for f in ("old_logp_NxL", "ref_logp_NxL"):
    np.testing.assert_allclose(getattr(one, f), getattr(four, f), atol=2e-6, rtol=0)
  assert np.abs(one.ref_logp_NxL).sum() > 0
  assert int(one.ds_kept) == int(four.ds_kept)
  # the early exit and the cut really happened: fewer decode steps, a training length below L = 12
  L = c.sampling.max_new_tokens
  assert int(one.decode_steps) == L - 1 and int(four.decode_steps) < L - 1, int(four.decode_steps)
  assert int(one.bucket) == 0 and (3, 6, 12)[int(four.bucket)] == min(
      b for b in (3, 6, 12) if b >= one.mask_NxL.sum(1).max()) < L


def test_rollout_chunks_must_divide_the_rows():
  c = config_lib.override(digits.bench_config(**TINY), {"rl.rollout_chunks": 3})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  fn = rollout_lib.make_rollout_fn(c, mcfg, spec, spec.ctx.tokenizer)
  abstract, _ = rl_step.state_spec(c, mesh, mcfg)
  batch = next(digits.make_batches(c.rl.prompts_per_step, 1, seed=1))
  with sharding.mesh_context(mesh), pytest.raises(
      ValueError, match="config.rl.rollout_chunks=3: must be a positive integer dividing the 16"):
    jax.eval_shape(fn, abstract["params"], abstract["ref_params"], batch, jax.random.PRNGKey(3))
  with pytest.raises(validate.ConfigError, match="config.rl.rollout_chunks: 3 must split prompts_per_step\\*G=16"):
    validate.validate_rl(c, 1)


def test_beta_zero_keeps_no_reference():
  """β = 0 (dr_grpo): no ref_params in the state, no reference forward (fewer FLOPs than the same step handed a
  reference), no train/kl; its loss and gradient equal the β = 0 loss computed with reference log-probs. Also with
  training-length buckets and early exit (their β = 0 path skips the reference forward's switch)."""
  c = config_lib.override(presets.apply(digits.bench_config(**TINY1), "dr_grpo"),
                          {"rl.train_buckets": 2, "sampling.exit_chunk": 4})
  assert c.rl.beta == 0 and not state_lib.uses_reference(c)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  abstract, _ = rl_step.state_spec(c, mesh, mcfg)
  state = rl_step.init(c, mesh, mcfg, seed=0)
  assert "ref_params" not in abstract and "ref_params" not in state
  with_ref = dict(state, ref_params=state["params"])
  batch = _batches(c, 1)[0]
  step = rl_step.build_step(c, mcfg, spec, spec.ctx.tokenizer)
  with sharding.mesh_context(mesh):
    lowered = [jax.jit(step).lower(st, batch) for st in (state, with_ref)]  # one trace each: FLOPs and outputs
  flops = [lo.cost_analysis()["flops"] for lo in lowered]
  (_, m0), (_, m1) = (lo.out_info for lo in lowered)
  assert flops[0] < flops[1]
  assert "train/kl" not in m0 and "train/kl_clamp_frac" not in m0 and "train/kl" in m1
  assert "train/train_len" in m0 and "train/decode_steps" in m0
  # The loss without reference log-probs equals the β = 0 loss with them (same value, same gradient).
  rng = np.random.default_rng(0)
  n, P, L = 4, 3, c.sampling.max_new_tokens
  T = P + L
  mb = dict(seq=(jnp.asarray(rng.integers(1, 60, (n, T)), jnp.int32), jnp.tile(jnp.arange(T), (n, 1)),
                 jnp.ones((n, T), jnp.int32)),
            old_logp_NxL=jnp.asarray(-rng.random((n, L)), jnp.float32),
            adv_NxL=jnp.asarray(rng.normal(size=(n, L)), jnp.float32),
            mask_NxL=jnp.asarray(rng.random((n, L)) < 0.8, jnp.float32))
  loss_fn = rl_step.make_loss_fn(c, mcfg, P)
  g = jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b)[0]))  # compiled: op by op it compiled ~190 programs
  (l0, g0), (l1, g1) = g(state["params"], mb), g(state["params"], dict(mb, ref_logp_NxL=mb["old_logp_NxL"] - 0.3))
  assert float(l0) != 0 and abs(float(l0) - float(l1)) < 1e-7
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(a, b, atol=1e-7)
  # A state without a reference cannot run a β > 0 config.
  c2 = config_lib.override(c, {"rl.beta": 0.04})
  with pytest.raises(ValueError, match="config.rl.beta=0.04: the state has no reference params"):
    jax.eval_shape(rl_step.build_step(c2, mcfg, spec, spec.ctx.tokenizer), state, batch)


# ------------------------------------------------------------------------------ training-length buckets


FULL = {"rl.rollout_chunks": 1, "sampling.exit_chunk": 0, "rl.train_buckets": 1}
FAST = {"rl.rollout_chunks": 2, "sampling.exit_chunk": 2, "rl.train_buckets": 2}  # lengths 6, 12 at L = 12


def _bucket_run(over: dict, n_steps: int = 3):
  c = config_lib.override(digits.bench_config(**TINY1), {"optim.lr": 1e-3, **over})
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = families.make_step(c, mesh, mcfg, spec, _ManyEos(c.model.vocab_size))
  state = rl_step.init(c, mesh, mcfg, seed=0)
  # A policy away from its reference: the KL gradient is a real signal from the first step. (At the reference with
  # no reward signal the true gradient is 0, and AdamW would scale the chunked forward's 1e-9 rounding up to lr.)
  # (one compiled program, one normal draw over all leaves: tests/noise.py; eagerly, a few compiles per leaf)
  state = dict(state, params=noise.perturbed(state["params"], jax.random.PRNGKey(7), 0.05))
  ms, ps = [], []
  p0 = jax.device_get(state["params"])
  for b in _batches(c, n_steps):
    state, m = step(state, b)
    ms.append(jax.device_get(m))
    ps.append(jax.device_get(state["params"]))
  return dict(c=c, step=step, metrics=ms, params=ps, p0=p0)


def _l2(a, b) -> float:
  return float(np.sqrt(sum(np.sum((np.float64(x) - y) ** 2) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))))


@pytest.fixture(scope="module")
def bucket_runs():
  """Two compiled steps, 3 steps each: full length, one chunk, no early exit; and 2 row chunks + early exit +
  2 training lengths (the fewest that show a change of length: each is a forward+backward to compile)."""
  return {"full": _bucket_run(FULL), "fast": _bucket_run(FAST)}


def test_chunks_early_exit_and_buckets_equal_full_length_training_without_recompiles(bucket_runs):
  """Row chunks whose decodes exit early, and an update (and reference forward) on the shorter of 2 lengths
  covering the longest completion of all rows, chosen in-graph: one trace while the length changes, the same
  samples, and the same losses, gradients and params as the unchunked full-length step (fp32: the masked tail only
  changes reduction order). Params: AdamW moves a weight whose gradient is at rounding level (~1e-10, here from
  the chunked reference forward's last-bit differences) by up to lr·g/ε ≈ 1e-5, so they agree within 2e-5 (2% of
  one step's lr = 1e-3 move; observed 9e-6) and their distance is < 1e-3 of how far training moved them (observed
  1e-4)."""
  full, fast = bucket_runs["full"], bucket_runs["fast"]
  L = fast["c"].sampling.max_new_tokens
  assert rollout_lib.train_lengths(fast["c"]) == (6, 12) and rollout_lib.train_lengths(full["c"]) == (12,)
  lens = [int(m["train/train_len"]) for m in fast["metrics"]]
  longest = [int(m["train/completion_len_max"]) for m in fast["metrics"]]
  assert lens == [6 if x <= 6 else 12 for x in longest], (lens, longest)
  assert len(set(lens)) == 2, lens  # the length really changed, and really was cut
  # each chunk stops at the first 2-step boundary after its rows are done (the last step, 11, runs alone)
  steps = [int(m["train/decode_steps"]) for m in fast["metrics"]]
  assert steps == [min(-(-x // 2) * 2, L - 1) for x in longest] and min(steps) < L - 1, (steps, longest)
  assert fast["step"].traces() == 1
  assert all(int(m["train/train_len"]) == 12 and int(m["train/decode_steps"]) == L - 1 for m in full["metrics"])
  for m1, m3 in zip(full["metrics"], fast["metrics"]):
    np.testing.assert_array_equal(m1["samples/tokens_NxL"], m3["samples/tokens_NxL"])
    for k in ("train/reward_mean", "train/completion_len_mean", "train/loss", "train/grad_norm", "train/kl",
              "train/entropy"):
      np.testing.assert_allclose(m3[k], m1[k], rtol=1e-5, atol=1e-7, err_msg=k)
  for p1, p3 in zip(full["params"], fast["params"]):
    for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p3)):
      np.testing.assert_allclose(b, a, rtol=0, atol=2e-5)
    assert _l2(p3, p1) < 1e-3 * _l2(p1, full["p0"]), (_l2(p3, p1), _l2(p1, full["p0"]))


def _conds(jaxpr, n: int) -> int:
  """lax.switch/cond equations with n branches anywhere in a (closed) jaxpr."""
  count = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "cond" and len(eqn.params["branches"]) == n:
      count += 1
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        inner = getattr(sub, "jaxpr", None)
        if inner is not None:
          count += _conds(getattr(inner, "jaxpr", inner), n)
  return count


def test_bucket_index_is_reduced_over_vmapped_runs():
  """Under seeds.py's vmap the bucket index is the max over runs, so the switch stays a switch: a per-run index
  becomes a select running every branch (the toy below, traced with and without the axis name, shows the count
  tells them apart). The step in row chunks with early exit keeps its two 2-branch switches under the runs vmap."""
  sizes = (6, 12)
  toy = lambda lengths_N, x: update_lib.by_length(update_lib.bucket_index(lengths_N, sizes), sizes,
                                                  lambda Lb, x: x[:Lb].sum(), x)
  args = (jnp.asarray([[3, 5], [4, 9]]), jnp.ones(12))
  assert _conds(jax.make_jaxpr(jax.vmap(toy, (0, None), axis_name=update_lib.RUNS_AXIS))(*args).jaxpr, 2) == 1
  assert _conds(jax.make_jaxpr(jax.vmap(toy, (0, None)))(*args).jaxpr, 2) == 0
  from grpo_jax.studies import vmapped_runs as seeds_lib
  c = config_lib.override(digits.bench_config(**TINY1), FAST)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = digits.reward_spec(c.model.vocab_size)
  step = rl_step.build_step(c, mcfg, spec, _ManyEos(c.model.vocab_size))
  states = jax.eval_shape(lambda: seeds_lib.init_states(c, mcfg, [0, 1]))
  named = jax.make_jaxpr(jax.vmap(step, in_axes=(0, None), axis_name=update_lib.RUNS_AXIS))(states, _batches(c, 1)[0])
  assert _conds(named.jaxpr, 2) == 2  # reference log-probs (in row chunks) and the update
  # seeds.py's runs vmap names that axis
  assert "axis_name=update_lib.RUNS_AXIS" in inspect.getsource(seeds_lib.make_vmapped_step)


def test_entropy_bonus_in_the_full_step_with_mu_and_minibatches():
  """rl.entropy_coef through the whole step (families.make_step) with μ = 2 and 2 minibatches (4 updates), token_mean:
  each update's loss is its policy loss − c·(its minibatch's token-mean entropy, what train/entropy averages), so
  for the same rollout (same seed and batch) train/loss(c = 1) ≈ train/loss(0) − train/entropy, up to the
  policy-loss drift of the two runs' later updates (lr 1e-3); finite, nothing skipped."""
  out = {}
  for coef in (0.0, 1.0):
    c = digits.bench_config(**TINY1)
    c.optim.lr = 1e-3
    c.rl.update(mu=2, minibatches=2, loss_agg="token_mean", entropy_coef=coef)
    mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
    mcfg = model_lib.ModelConfig.from_config(c.model)
    spec = digits.reward_spec(c.model.vocab_size)
    step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    _, m = step(rl_step.init(c, mesh, mcfg, seed=0), _batches(c, 1)[0])
    out[coef] = {k: float(v) for k, v in jax.device_get(m).items() if np.ndim(v) == 0}
  m0, m1 = out[0.0], out[1.0]
  assert m0["train/reward_mean"] == m1["train/reward_mean"]  # the same rollout
  h = m1["train/entropy"]
  assert 3.0 < h < np.log(64) + 1e-4
  assert abs((m0["train/loss"] - m1["train/loss"]) - h) < 2e-3 * h, (m0["train/loss"], m1["train/loss"], h)
  assert m1["train/nonfinite_updates"] == 0
