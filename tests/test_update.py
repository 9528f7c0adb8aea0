"""The update pieces every family shares: the optimizer's injected lr and warm-up, the skip of a non-finite update
(loss, gradient or optimizer update), the minibatch scan and the metrics tail, on tiny hand-checked inputs."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from grpo_jax.rl import update


def _optim(**over):
  return ml_collections.ConfigDict(dict(dict(lr=0.1, warmup_steps=0, b1=0.9, b2=0.99, eps=1e-8, weight_decay=0.0,
                                             grad_clip=0.0), **over))


def _quadratic(params, batch):
  """(Σ (p − batch)², aux): its gradient is 2 (p − batch)."""
  (p,) = params
  return jnp.sum(jnp.square(p - batch)), {"aux_metric": jnp.float32(7.0)}


def test_optimizer_matches_plain_adamw_and_reports_its_warmup_lr():
  opt = update.make_optimizer(_optim(warmup_steps=4))
  ref = optax.adamw(optax.join_schedules([optax.linear_schedule(0.0, 0.1, 4), optax.constant_schedule(0.1)], [4]),
                    b1=0.9, b2=0.99, weight_decay=0.0)
  p = q = jnp.asarray([1.0, -2.0, 3.0])
  s, r = opt.tx.init(p), ref.init(q)
  lrs = []
  for i in range(6):
    lrs.append(float(opt.lr(s)))
    g = jnp.sin(p * (i + 1))
    u, s = opt.tx.update(g, s, p)
    v, r = ref.update(jnp.sin(q * (i + 1)), r, q)
    p, q = optax.apply_updates(p, u), optax.apply_updates(q, v)
    np.testing.assert_array_equal(p, q)  # bit for bit
  np.testing.assert_allclose(lrs, [0.0, 0.025, 0.05, 0.075, 0.1, 0.1], rtol=1e-6)
  assert float(s.hyperparams[update.LR]) == pytest.approx(0.1)  # the lr lives in the state (vmappable per run)


def test_weight_decay_reaches_weights_but_not_norm_scales_or_biases():
  """optim.weight_decay > 0 shrank every leaf, norm scales (towards 0, not their init 1) and biases included;
  standard practice (nanoGPT, Hugging Face Trainer) decays only the weights. With a zero gradient the Adam part
  is 0, so one update is exactly -lr·wd·p on the decayed leaves and 0 elsewhere. The rule goes by leaf name, not
  rank: stacked biases [L, heads, head_dim] have 3 axes."""
  lr, wd = 0.1, 0.5
  opt = update.make_optimizer(_optim(lr=lr, weight_decay=wd, grad_clip=1.0))
  rng = np.random.default_rng(0)
  leaf = lambda *shape: jnp.asarray(rng.normal(size=shape) + 1.0, jnp.float32)
  params = {"embed": {"embedding": leaf(8, 4)}, "final_norm": {"scale": leaf(4)},
            "layers": {"attn_norm": {"scale": leaf(2, 4)}, "q": {"kernel": leaf(2, 4, 2, 2), "bias": leaf(2, 2, 2),
                                                                "lora_a": leaf(2, 4, 3), "lora_b": leaf(2, 3, 2, 2)}},
            "value_head": {"kernel": leaf(4, 1), "bias": leaf(1)}}
  u, _ = jax.jit(opt.tx.update)(jax.tree.map(jnp.zeros_like, params), opt.tx.init(params), params)  # one program
  decayed = {"embedding", "kernel", "lora_a", "lora_b"}
  for (path, x), got in zip(jax.tree_util.tree_leaves_with_path(params), jax.tree.leaves(u)):
    want = -lr * wd * np.asarray(x) if path[-1].key in decayed else np.zeros(x.shape)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, atol=0, err_msg=jax.tree_util.keystr(path))
  # weight_decay = 0 (the default): no mask node in the state, so its structure (goldens, checkpoints) is as it was
  masked = lambda st: any(isinstance(x, optax.MaskedState)
                          for x in jax.tree.leaves(st, is_leaf=lambda x: isinstance(x, optax.MaskedState)))
  assert masked(opt.tx.init(params)) and not masked(update.make_optimizer(_optim()).tx.init(params))


def _sqrt_loss(params, batch):
  """Finite at p = 0, but its gradient 1 / (2√p) is inf there."""
  return jnp.sum(jnp.sqrt(params[0])), {"aux_metric": jnp.float32(7.0)}


@pytest.mark.parametrize("what", ["loss", "gradient", "update"])
def test_a_non_finite_loss_gradient_or_update_is_skipped_and_counted(what):
  """A NaN loss; a finite loss with an inf gradient; a finite loss and gradient whose optimizer update is inf (an
  inf learning rate): each leaves params and optimizer state as they were, reports update_norm 0 and counts one."""
  opt = update.make_optimizer(_optim(lr=float("inf") if what == "update" else 0.1))
  loss_fn, params, batch = _quadratic, (jnp.asarray([1.0, 2.0]),), jnp.asarray([0.0, 0.5])
  if what == "loss":
    batch = jnp.asarray([0.0, jnp.nan])
  elif what == "gradient":
    loss_fn, params = _sqrt_loss, (jnp.asarray([0.0, 1.0]),)
  opt_states = (opt.tx.init(params[0]),)
  new_p, new_s, m = jax.jit(lambda p, s, b: update.gradient_step(loss_fn, (opt,), p, s, b))(params, opt_states, batch)
  assert np.isfinite(float(m["loss"])) == (what != "loss")
  assert np.isfinite(float(m["grad_norm"])) == (what == "update")
  np.testing.assert_array_equal(new_p[0], params[0])
  for a, b in zip(jax.tree.leaves(new_s), jax.tree.leaves(opt_states)):
    np.testing.assert_array_equal(a, b)
  assert int(m["nonfinite"]) == 1 and float(m["update_norm"]) == 0.0 and float(m["aux_metric"]) == 7.0


def test_a_finite_update_moves_and_a_second_set_can_veto_it():
  """One finite update moves the params by lr·sign(g) (Adam's first step); a non-finite gradient in a second
  param set (PPO's critic) skips the update of both."""
  opt = update.make_optimizer(_optim())
  p = (jnp.asarray([1.0, -1.0]),)
  new_p, _, m = update.gradient_step(_quadratic, (opt,), p, (opt.tx.init(p[0]),), jnp.zeros(2))
  np.testing.assert_allclose(new_p[0], [0.9, -0.9], rtol=1e-5)
  assert int(m["nonfinite"]) == 0 and float(m["grad_norm"]) == pytest.approx(np.sqrt(8.0))
  assert float(m["update_norm"]) == pytest.approx(0.1 * np.sqrt(2.0), rel=1e-5)

  def two_sets(params, batch):
    return _quadratic(params[:1], batch)[0] + jnp.sum(params[1] * jnp.inf), {}
  ps = (jnp.asarray([1.0, -1.0]), jnp.asarray([1.0]))
  new_ps, _, m = update.gradient_step(two_sets, (opt, opt), ps, tuple(opt.tx.init(x) for x in ps), jnp.zeros(2))
  np.testing.assert_array_equal(new_ps[0], ps[0])
  assert int(m["nonfinite"]) == 1


def test_minibatch_scan_visits_every_row_once_per_epoch():
  """μ=3 epochs × 2 minibatches over 6 rows: each update sees 3 distinct rows, each epoch all 6; metrics come
  back stacked over the 6 updates."""
  data = {"x_N": jnp.arange(6.0), "y_Nx2": jnp.arange(12.0).reshape(6, 2)}

  def upd(carry, mb):
    return carry + jnp.sum(mb["x_N"]), {"n_rows": jnp.float32(mb["x_N"].shape[0]), "rows": mb["x_N"]}
  total, m = update.minibatch_scan(upd, jnp.float32(0), data, jax.random.PRNGKey(0), mu=3, minibatches=2)
  assert float(total) == 3 * 15.0 and m["n_rows"].shape == (6,) and (m["n_rows"] == 3).all()
  rows = np.asarray(m["rows"]).reshape(3, 6)
  for epoch in rows:
    assert sorted(epoch.tolist()) == list(range(6))
  assert not np.array_equal(rows[0], rows[1])  # a fresh permutation per epoch
  _, m1 = update.minibatch_scan(upd, jnp.float32(0), data, jax.random.PRNGKey(0), mu=1, minibatches=1)
  np.testing.assert_array_equal(m1["rows"], np.arange(6.0))  # one on-policy update keeps the row order


@pytest.mark.parametrize("mu, minibatches, match", [(1, 4, "rl.minibatches=4: must be a positive integer dividing "
                                                     "the update's 6 rows"), (1, 0, "rl.minibatches=0"),
                                                    (0, 1, "rl.mu=0: must be an integer >= 1")])
def test_minibatch_scan_refuses_counts_that_do_not_cut_the_rows(mu, minibatches, match):
  """A step built without validation: 4 minibatches of 6 rows was a reshape TypeError, 0 a ZeroDivisionError, and
  μ = 0 ran no update at all, silently."""
  with pytest.raises(ValueError, match=match):
    update.minibatch_scan(lambda c, mb: (c, {}), jnp.float32(0), {"x_N": jnp.arange(6.0)}, jax.random.PRNGKey(0),
                          mu=mu, minibatches=minibatches)


def test_step_metrics_reduce_over_updates_and_count_skips():
  um = {"loss": jnp.asarray([1.0, 3.0]), "ratio_max": jnp.asarray([1.5, 1.2]), "ratio_min": jnp.asarray([0.5, 0.7]),
        "nonfinite": jnp.asarray([0, 1], jnp.int32), "surrogate": jnp.asarray([9.0, 9.0])}
  params = {"w": jnp.asarray([3.0, 4.0])}
  m = update.step_metrics(um, params)
  assert float(m["train/loss"]) == 2.0 and float(m["train/ratio_max"]) == 1.5 and float(m["train/ratio_min"]) == 0.5
  assert int(m["train/nonfinite_updates"]) == 1 and int(m["train/skipped_updates"]) == 1
  assert float(m["train/param_norm"]) == pytest.approx(5.0) and "train/surrogate" not in m
  failed = update.step_metrics(um, params, reward_ok=jnp.asarray(False))
  assert int(failed["train/skipped_updates"]) == 2  # a failed reward skips every update, once each
