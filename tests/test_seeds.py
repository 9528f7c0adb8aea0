"""vmap over seeds and over one hyper-parameter equals separate runs (fp32, 1e-5), on the peers' tiny workload."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import model as model_lib
from grpo_jax import peer_workload
from grpo_jax import rewards
from grpo_jax import rl_step
from grpo_jax import seeds as seeds_lib
from grpo_jax import sharding
from grpo_jax import state as state_lib

TINY = dict(hidden=32, layers=1, heads=2, kv=1, inter=64, vocab=32, prompts=2, G=4, L=6)
STEPS = 2
KEYS = ("train/reward_mean", "train/kl", "train/loss", "train/grad_norm", "train/entropy",
        "train/completion_len_mean", "train/adv_std")


def _digit_fraction(tokens_NxL, mask_NxL, batch, ctx):
  """Fraction of completion tokens that are digits: a random model gets varied rewards, so updates are non-zero."""
  is_digit = (tokens_NxL >= peer_workload.DIGIT0) & (tokens_NxL < peer_workload.DIGIT0 + 10)
  m = mask_NxL.astype(jnp.float32)
  return rewards.outcome(jnp.sum(is_digit * m, -1) / jnp.maximum(m.sum(-1), 1.0))


def _setup(**rl):
  c = peer_workload.bench_config(**TINY)
  c.optim.lr = 3e-3
  c.rl.update(**rl)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  tok = peer_workload.BenchTokenizer(c.model.vocab_size)
  spec = rewards.RewardSpec(("digits",), (1.0,), (_digit_fraction,), {}, rewards.Context("bench", tok))
  return c, mesh, mcfg, spec, tok


BATCHES = list(peer_workload.make_batches(TINY["prompts"], STEPS, seed=3))


def _separate(c, mesh, mcfg, spec, tok, seed, tx):
  step = rl_step.make_rl_step(c, mesh, mcfg, tx, spec, tok)
  st = state_lib.create_state(mesh, mcfg, tx, seed)
  ms = []
  for b in BATCHES:
    st, m = step(st, b)
    ms.append({k: float(m[k]) for k in KEYS})
  return jax.device_get(st["params"]), ms


def _vmapped(c, mesh, mcfg, spec, tok, tx, seed_list, **kw):
  states = seeds_lib.init_states(mcfg, tx, seed_list, **kw)
  step = seeds_lib.make_rl_steps(c, mesh, mcfg, tx, spec, tok)
  ms = []
  for b in BATCHES:
    states, m = step(states, b)
    ms.append(seeds_lib.host_scalars(m))
  assert step.jitted._cache_size() == 1  # one program for all runs and steps
  return jax.device_get(states["params"]), ms


def _assert_run_equal(vm_params, vm_metrics, i, params, metrics):
  for a, b in zip(jax.tree.leaves(seeds_lib.unstack(vm_params, i)), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  for t in range(STEPS):
    for k in KEYS:
      assert vm_metrics[t][k][i] == pytest.approx(metrics[t][k], abs=1e-5, rel=1e-5), (i, t, k)


def test_init_states_match_create_state():
  c, mesh, mcfg, spec, tok = _setup()
  tx = state_lib.make_optimizer(c.optim, 10)
  st = seeds_lib.init_states(mcfg, tx, [4, 9])
  one = state_lib.create_state(mesh, mcfg, tx, 9)
  for a, b in zip(jax.tree.leaves(seeds_lib.unstack(st, 1)), jax.tree.leaves(one)):
    np.testing.assert_array_equal(a, b)
  shared = seeds_lib.init_states(mcfg, tx, [4, 9], init_seeds=[9, 9])
  leaf = jax.tree.leaves(shared["params"])[0]
  np.testing.assert_array_equal(leaf[0], leaf[1])
  assert not np.array_equal(shared["rng"][0], shared["rng"][1])
  with pytest.raises(ValueError, match="hparams key 'rl.G'"):
    seeds_lib.init_states(mcfg, tx, [0], hparams={"rl.G": [4]})


def test_vmap_over_three_seeds_equals_separate_runs():
  c, mesh, mcfg, spec, tok = _setup()
  tx = state_lib.make_optimizer(c.optim, 10)
  seed_list = [0, 1, 2]
  vp, vm = _vmapped(c, mesh, mcfg, spec, tok, tx, seed_list)
  finals = []
  for i, s in enumerate(seed_list):
    p, m = _separate(c, mesh, mcfg, spec, tok, s, tx)
    _assert_run_equal(vp, vm, i, p, m)
    finals.append(jax.tree.leaves(p)[0])
    assert m[0]["train/adv_std"] > 0 and m[1]["train/kl"] > 0  # real updates happened
  assert not np.allclose(finals[0], finals[1])  # and the seeds really differ


def test_vmap_over_lr_and_beta_equals_separate_runs():
  """Two runs, same seed, each with its own (lr, β): lr from the optimizer state, β traced into the loss."""
  lrs, betas = [1e-3, 1e-2], [0.0, 2.0]
  c, mesh, mcfg, spec, tok = _setup()
  tx = seeds_lib.make_tx(c.optim)
  vp, vm = _vmapped(c, mesh, mcfg, spec, tok, tx, [5, 5], hparams={"optim.lr": lrs, "rl.beta": betas})
  for i, (lr, beta) in enumerate(zip(lrs, betas)):
    ci, mesh, mcfg, spec, tok = _setup(beta=beta)
    ci.optim.lr = lr
    p, m = _separate(ci, mesh, mcfg, spec, tok, 5, state_lib.make_optimizer(ci.optim, 10))  # the ordinary path
    _assert_run_equal(vp, vm, i, p, m)
  assert vm[1]["train/loss"][0] != pytest.approx(vm[1]["train/loss"][1], abs=1e-6)
