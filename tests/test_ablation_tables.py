"""The training tables' toy base model and cells, and table c's compiled-memory column, at tiny sizes."""
import jax
import ml_collections
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.studies.ablations import memory_table
from grpo_jax.studies.ablations import toy
from grpo_jax.studies.ablations import train_table
from grpo_jax.tasks import digits


def test_base_documents_follow_their_spec():
  d = digits.base_documents(4000, L=8, vocab=32, p_correct=0.3, rng=np.random.default_rng(0))
  P = digits.TOY_PROMPT_LEN
  comp, mask = d["tokens_NxT"][:, P:], d["loss_mask_NxT"][:, P:]
  assert (d["loss_mask_NxT"][:, :P] == 0).all()
  n = mask.sum(1)
  assert n.min() == 2 and n.max() == 8                                     # answer + 0..6 fillers + EOS
  assert (comp[np.arange(len(n)), n - 1] == digits.EOS).all()
  assert ((comp >= digits.DIGIT0) & (comp < digits.DIGIT0 + 10))[:, 0].all()
  fill = comp[:, 1:][mask[:, 1:] > 0]
  assert ((fill >= digits.FILLER0) | (fill == digits.EOS)).all()
  assert (comp[mask == 0] == digits.PAD).all()
  a, b = comp.shape[0], P
  answer = d["tokens_NxT"][:, 2] + d["tokens_NxT"][:, 4] - digits.DIGIT0       # DIGIT0 + a + b
  right = comp[:, 0] == answer
  # P(right) = 0.3 + 0.7/10 (a random digit can be right too).
  assert abs(right.mean() - 0.37) < 0.03, (a, b)
  # Lengths are independent of correctness: equal mean length for right and wrong (within sampling error).
  assert abs(n[right].mean() - n[~right].mean()) < 0.2


@pytest.fixture(scope="module")
def tiny_cfg():
  c = train_table.table_config("small", (("grpo", presets.overrides("grpo")), ("ppo", presets.overrides("ppo"))))
  c.seeds, c.steps, c.eval_every, c.base_steps = 2, 2, 1, 40
  c.run = config_lib.override(c.run, {"rl.prompts_per_step": 2, "rl.G": 4, "sampling.max_new_tokens": 4,
                                      "model.hidden": 16, "model.inter": 32})
  return c


def test_base_model_learns_the_documents(tiny_cfg):
  """The pre-trained base answers right more often than a random init does (greedy, training prompts)."""
  mcfg = model_lib.ModelConfig.from_config(train_table.build_config(tiny_cfg, {}).model)
  p0 = model_lib.init_params(mcfg, jax.random.PRNGKey(0))
  L = tiny_cfg.run.sampling.max_new_tokens
  base_params = toy.base_params(mcfg, L, 300, 1.0)
  ev = toy.make_eval(mcfg, L, digits.train_set())
  stacked = jax.tree.map(lambda a, b: np.stack([a, b]), p0, base_params)
  acc0, acc1 = np.asarray(ev(stacked))
  assert acc1 > acc0 and acc1 >= 0.4, (acc0, acc1)


def test_ppo_train_cell_runs_from_the_base(tiny_cfg):
  """Table d's PPO cell (critic, own optimizer state) through train_table; the GRPO-family path is the vmapped
  rl_step that tests/test_seeds.py checks against separate runs."""
  cell = train_table.run_cell(tiny_cfg, "ppo", [0, 1])
  for m, v in cell["scalars"].items():
    assert len(v) == 2, m
  acc = cell["curves"]["greedy accuracy on the training prompts"]
  assert acc["x"] == [0, 1, 2] and np.asarray(acc["y"]).shape == (2, 3)
  # Both seeds start from the same base: identical greedy accuracy at step 0.
  assert acc["y"][0][0] == acc["y"][1][0]


def test_compiled_memory_counts_the_state_and_batch():
  """XLA's argument bytes for the compiled step = state pytree bytes + batch bytes, exactly; a separate critic adds
  its params and AdamW moments."""
  cfg = ml_collections.ConfigDict(dict(vocab=64, compile_sizes=("32x1",), workload=dict(
      prompts=2, G=2, prompt_len=4, L=4)))
  out = {a: memory_table.run_cell(cfg, f"32x1 {a}", [0])["scalars"] for a in ("grpo", "ppo_separate")}
  batch_mb = 3 * 2 * 4 * 4 / 1e6   # prompt, prompt mask (2×4), answer ids (2×4): int32
  for a, s in out.items():
    state_mb = s["trainable_MB"][0] + s["frozen_ref_MB"][0] + 12 / 1e6  # + step (int32) + rng (2×uint32)
    np.testing.assert_allclose(s["xla_args_MB"][0], state_mb + batch_mb, rtol=1e-6, err_msg=a)
    assert s["xla_temp_MB"][0] > 0
  assert out["ppo_separate"]["xla_args_MB"][0] > out["grpo"]["xla_args_MB"][0]
