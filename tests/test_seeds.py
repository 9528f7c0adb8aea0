"""vmap over seeds and over one hyper-parameter equals separate runs (fp32, 1e-5), on the peers' tiny workload."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rl_step
from grpo_jax.studies import vmapped_runs as seeds_lib
from grpo_jax.infra import sharding
from grpo_jax.tasks import digits

TINY = dict(hidden=32, layers=1, heads=2, kv=1, inter=64, vocab=32, prompts=2, G=4, L=6)
STEPS = 2
KEYS = ("train/reward_mean", "train/kl", "train/loss", "train/grad_norm", "train/entropy",
        "train/completion_len_mean", "train/adv_std")


def _digit_fraction(tokens_NxL, mask_NxL, batch, ctx):
  """Fraction of completion tokens that are digits: a random model gets varied rewards, so updates are non-zero."""
  is_digit = (tokens_NxL >= digits.DIGIT0) & (tokens_NxL < digits.DIGIT0 + 10)
  m = mask_NxL.astype(jnp.float32)
  return reward_spec.outcome(jnp.sum(is_digit * m, -1) / jnp.maximum(m.sum(-1), 1.0))


def _setup(weight=1.0, **rl):
  c = digits.bench_config(**TINY)
  c.optim.lr = 3e-3
  c.rl.update(**rl)
  c.rewards = (("digits", weight),)
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  tok = digits.Tokenizer(c.model.vocab_size)
  spec = reward_spec.RewardSpec(("digits",), (weight,), (_digit_fraction,), {}, reward_spec.Context(digits.TASK, tok))
  return c, mesh, mcfg, spec, tok


BATCHES = list(digits.make_batches(TINY["prompts"], STEPS, seed=3))
SEEDS = [0, 1, 2, 2]  # runs 0-2: three seeds; run 3: seed 2 with its own lr, β, entropy bonus, temperature, weight
LRS, BETAS, ENT = [3e-3, 3e-3, 3e-3, 1e-2], [0.04, 0.04, 0.04, 2.0], [0.0, 0.0, 0.0, 0.5]
TEMPS, WEIGHTS = [1.0, 1.0, 1.0, 0.7], [(1.0,), (1.0,), (1.0,), (2.5,)]


def _plain_state(params, rng, tx):
  """A state as rl_step.init builds it (checked in test_init_states_match_init), for the ordinary tx."""
  return dict(params=params, ref_params=jax.tree.map(jnp.copy, params), opt_state=tx.init(params), step=jnp.zeros((), jnp.int32), rng=rng)


def _plain_init(tx):
  """_plain_state as one program (not ~60 eager ops), built once per tx: the three base runs share its trace."""
  return jax.jit(lambda p, r: _plain_state(p, r, tx))


def _separate(step, start, init):
  st = init(start["params"], start["rng"])
  ms = []
  for b in BATCHES:
    st, m = step(st, b)
    ms.append({k: float(m[k]) for k in KEYS})
  return jax.device_get(st["params"]), ms


def _plain_step(c, mesh, mcfg, spec, tok):
  """families.make_step's program (jit of build_step, the state in and out in the family's state shardings, as
  sharding.jit_step pins it), compiled with the same fast XLA options; not donated (the runs' starts are read again).
  A state built on the host is placed in those shardings first, so the second step takes what the first returned:
  one trace (unplaced, the first step's inputs differed from its outputs and the step was traced and compiled twice)."""
  shardings = rl_step.state_spec(c, mesh, mcfg)[1]
  counted = sharding.count_traces(rl_step.build_step(c, mcfg, spec, tok))
  jitted = jax.jit(counted, out_shardings=(shardings, sharding.replicated(mesh)),
                   compiler_options=seeds_lib.FAST_COMPILE)

  def run(state, batch):
    with sharding.mesh_context(mesh):
      return jitted(jax.device_put(state, shardings), batch)
  run.traces = counted.traces
  return run


@pytest.fixture(scope="module")
def runs():
  """ONE vmapped program for 4 runs (seeds, lr in the optimizer state, β, the entropy bonus, temperature and the
  reward weight traced), and the separate runs (runs 0-2 with no entropy bonus in their program at all)."""
  c, mesh, mcfg, spec, tok = _setup()
  states = seeds_lib.init_states(c, mcfg, SEEDS, hparams={"optim.lr": LRS, "rl.beta": BETAS,
                                                          "rl.entropy_coef": ENT, "sampling.temperature": TEMPS,
                                                          "rewards": WEIGHTS})
  # every run's start sliced in one program (eagerly, each leaf's slice and squeeze compiled alone)
  starts = jax.jit(lambda st: [seeds_lib.unstack(st, i) for i in range(len(SEEDS))])(states)
  step = seeds_lib.make_steps(c, mesh, mcfg, spec, tok, compiler_options=seeds_lib.FAST_COMPILE)
  vm = []
  for b in BATCHES:
    states, m = step(states, b)
    vm.append(seeds_lib.host_scalars(m))
  assert step.traces() == 1  # one program for all runs and steps
  out = dict(c=c, mesh=mesh, mcfg=mcfg, vp=jax.device_get(states["params"]), vm=vm, starts=starts)
  # Separate runs through the ordinary path: the step of families.make_step with the config's own values.
  base_tx = rl_step.optimizer(c).tx
  base_step = _plain_step(c, mesh, mcfg, spec, tok)
  base_init = _plain_init(base_tx)
  out["sep"] = [_separate(base_step, starts[i], base_init) for i in range(3)]
  c3, _, _, spec3, _ = _setup(weight=WEIGHTS[3][0], beta=BETAS[3])
  c3.optim.lr, c3.sampling.temperature, c3.rl.entropy_coef = LRS[3], TEMPS[3], ENT[3]
  tx3 = rl_step.optimizer(c3).tx
  step3 = _plain_step(c3, mesh, mcfg, spec3, tok)
  out["sep"].append(_separate(step3, starts[3], _plain_init(tx3)))
  assert base_step.traces() == 1 and step3.traces() == 1  # each separate program compiled once for all its steps
  return out


def _assert_run_equal(r, i):
  params, metrics = r["sep"][i]
  for a, b in zip(jax.tree.leaves(seeds_lib.unstack(r["vp"], i)), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  for t in range(STEPS):
    for k in KEYS:
      assert r["vm"][t][k][i] == pytest.approx(metrics[t][k], abs=1e-5, rel=1e-5), (i, t, k)


def test_init_states_match_init(runs):
  one = rl_step.init(runs["c"], runs["mesh"], runs["mcfg"], seed=2)
  for k in ("params", "ref_params", "rng", "step"):
    for a, b in zip(jax.tree.leaves(runs["starts"][2][k]), jax.tree.leaves(one[k])):
      np.testing.assert_array_equal(a, b)
  shared = seeds_lib.init_states(runs["c"], runs["mcfg"], [4, 9, 1, 2], init_seeds=[9, 9, 9, 9])
  leaf = jax.tree.leaves(shared["params"])[0]
  np.testing.assert_array_equal(leaf[0], leaf[1])
  np.testing.assert_array_equal(leaf[1], leaf[3])
  assert not np.array_equal(shared["rng"][0], shared["rng"][1])
  with pytest.raises(ValueError, match="hparams key 'rl.G'"):
    seeds_lib.init_states(runs["c"], runs["mcfg"], [0], hparams={"rl.G": [4]})


def test_vmap_over_three_seeds_equals_separate_runs(runs):
  for i in range(3):
    _assert_run_equal(runs, i)
    assert runs["sep"][i][1][0]["train/adv_std"] > 0 and runs["sep"][i][1][1]["train/kl"] > 0  # real updates
  leaf = jax.tree.leaves(runs["vp"])[0]
  assert not np.allclose(leaf[0], leaf[1])  # and the seeds really differ


def test_vmap_over_lr_beta_temperature_and_weight_equals_separate_runs(runs):
  """Run 3 = seed 2 with lr 1e-2, β 2, entropy bonus 0.5, temperature 0.7, reward weight 2.5: equals a separate run
  configured so, and differs from run 2."""
  _assert_run_equal(runs, 3)
  assert runs["vm"][1]["train/loss"][3] != pytest.approx(runs["vm"][1]["train/loss"][2], abs=1e-6)


def test_a_run_has_the_state_of_a_main_run(runs):
  """Run 3's state (its own lr in the optimizer state) has exactly the structure, shapes and dtypes of the state
  `main` builds and restores for the same config: a sweep point's checkpoint resumes with `main`."""
  main_abstract, _ = rl_step.state_spec(runs["c"], runs["mesh"], runs["mcfg"])
  run = {k: v for k, v in runs["starts"][3].items() if k != "hparams"}
  assert jax.tree.structure(run) == jax.tree.structure(main_abstract)
  for a, b in zip(jax.tree.leaves(run), jax.tree.leaves(main_abstract)):
    assert (a.shape, a.dtype) == (b.shape, b.dtype)
  assert float(run["opt_state"].hyperparams["learning_rate"]) == pytest.approx(LRS[3])


class _Flaky:
  """A Python reward term that scores 0 (no effect on the advantages), or raises on the n-th call once armed."""
  def __init__(self):
    self.calls, self.raise_on = [], None

  def __call__(self, texts, ids, batch):  # 'sequential' under vmap: one call per run
    self.calls.append(len(texts))
    if len(self.calls) == self.raise_on:
      raise RuntimeError("boom")
    return [0.0] * len(texts)


@pytest.fixture(scope="module")
def beta_zero_step():
  """ONE β = 0 two-run vmapped step for the β = 0 test and the failing-Python-reward test: the digit reward plus a
  Python term (_Flaky) that scores 0 until a test arms it. Its host callback keeps the step out of the compilation
  cache, so each of the two tests compiled its own (~5 s each); the β = 0 claims do not depend on a 0-valued term."""
  from grpo_jax.rl import rewards
  c, mesh, mcfg, spec, tok = _setup(beta=0.0)
  flaky = _Flaky()
  term = rewards.PythonTerm("flaky", flaky, tok)
  spec = spec._replace(names=("digits", "flaky"), weights=(1.0, 1.0), fns=spec.fns + (term.in_graph(),),
                       python_terms={"flaky": term})
  c.rewards = (("digits", 1.0), ("flaky", 1.0))
  step = seeds_lib.make_steps(c, mesh, mcfg, spec, tok, compiler_options=seeds_lib.FAST_COMPILE)
  yield c, mcfg, step, flaky
  term.close()
  assert step.traces() == 1  # one program for both tests


def test_beta_zero_sweep_keeps_no_reference(beta_zero_step):
  """β = 0 runs (config or every run's hparam) keep no reference model, and the vmapped step runs without one: no
  train/kl, finite updates. One run with β > 0 keeps the reference for all (the state tree is shared)."""
  c, mcfg, step, flaky = beta_zero_step
  assert c.rl.beta == 0.0
  states = seeds_lib.init_states(c, mcfg, [0, 1])
  assert "ref_params" not in states
  assert "ref_params" not in jax.eval_shape(lambda: seeds_lib.init_states(c, mcfg, [0, 1],
                                                                         hparams={"rl.beta": [0.0, 0.0]}))
  assert "ref_params" in jax.eval_shape(lambda: seeds_lib.init_states(c, mcfg, [0, 1],
                                                                     hparams={"rl.beta": [0.0, 0.04]}))
  p0 = jax.device_get(states["params"])
  flaky.calls, flaky.raise_on = [], None
  states, m = step(states, BATCHES[0])
  m = seeds_lib.host_scalars(m)
  assert flaky.calls == [8, 8]  # the 0-valued term was scored, once per run
  assert "train/kl" not in m and np.isfinite(m["train/loss"]).all() and (m["train/grad_norm"] > 0).all()
  moved = [np.abs(a - b).max(axis=tuple(range(1, a.ndim))) for a, b in
           zip(jax.tree.leaves(p0), jax.tree.leaves(jax.device_get(states["params"])))]
  assert (np.max(moved, axis=0) > 0).all()  # both runs updated


@pytest.mark.parametrize("preset", presets.names())
def test_every_traceable_knob_traces_in_every_preset(preset):
  """Each family's step traced (not compiled) with EVERY knob of seeds.TRACEABLE differing per run: a knob used in
  Python control flow would raise here. β varies only among values of its own side of 0 (β = 0 is another
  program)."""
  c, mesh, mcfg, spec, tok = _setup()
  c = presets.apply(c, preset)
  c.rewards = (("digits", 1.0),)
  beta = [0.0, 0.0] if c.rl.beta == 0 else [0.04, 0.1]
  hp = {"optim.lr": [1e-3, 2e-3], "ppo.critic_lr": [1e-3, 3e-3], "rl.beta": beta, "rl.eps_low": [0.2, 0.1],
        "rl.eps_high": [0.2, 0.28], "rl.std_eps": [1e-4, 1e-6], "rl.dual_clip": [0.0, 3.0], "rl.kl_clamp": [0.0, 10.0],
        "rl.entropy_coef": [0.0, 0.01], "sampling.temperature": [1.0, 0.7], "rewards": [(1.0,), (0.5,)]}
  assert set(hp) == set(seeds_lib.TRACEABLE)
  states = jax.eval_shape(lambda: seeds_lib.init_states(c, mcfg, [0, 1], hparams=hp))
  step = seeds_lib.make_steps(c, mesh, mcfg, spec, tok)
  with sharding.mesh_context(mesh):
    out, m = jax.eval_shape(step.jitted, states, BATCHES[0])
  assert step.traces() == 1 and m["train/loss"].shape == (2,)
  assert jax.tree.structure(out) == jax.tree.structure(states)


def test_a_python_reward_failing_in_one_run_leaves_every_run_at_its_step(beta_zero_step):
  """A Python reward term that fails in one run of a vmapped group: the host stops the group and saves every run at
  that step (run/train.py's rl_loop), so no run may have advanced. The other run took its update and was saved one
  step ahead of its label: a resume trained it on the same batch twice (and a rollout carry admitted its prompts
  twice). Now the step is skipped in every run, as in one run's failure. At β = 0 (the skip does not depend on β):
  the module's beta_zero_step, its Python term armed to raise on its second call (the second run's)."""
  c, mcfg, step, flaky = beta_zero_step
  states = seeds_lib.init_states(c, mcfg, [0, 1])
  start = jax.device_get(states["params"])
  flaky.calls, flaky.raise_on = [], 2
  states, m = step(states, BATCHES[0])
  status = np.asarray(m["reward_status"])  # [runs, terms]
  assert len(flaky.calls) == 2 and sorted(status[:, 1].tolist()) == [reward_spec.OK, reward_spec.RAISED], status
  assert np.asarray(states["step"]).tolist() == [0, 0]
  for a, b in zip(jax.tree.leaves(jax.device_get(states["params"])), jax.tree.leaves(start)):
    np.testing.assert_array_equal(a, b)


def test_unstack_takes_one_run_of_every_leaf_and_refuses_a_run_outside_the_stack():
  """One compiled program for the whole tree, the run an argument (no compile per leaf or per run): each leaf's run i,
  dtypes kept (a PRNG key's too), and a run outside [0, S) an IndexError (a traced index would clamp to the last or
  first run)."""
  tree = {"w": jnp.arange(24.0).reshape(3, 2, 4), "n": jnp.arange(3, dtype=jnp.int32),
          "key": jax.random.split(jax.random.PRNGKey(0), 3)}
  for i in range(3):
    got = seeds_lib.unstack(tree, i)
    for k in tree:
      np.testing.assert_array_equal(got[k], np.asarray(tree[k])[i])
      assert got[k].dtype == tree[k].dtype
  for bad in (3, -1):
    with pytest.raises(IndexError, match="stack of"):
      seeds_lib.unstack(tree, bad)
