"""Algorithm presets: each is complete, used by every config's `algo=`, precedence preset < file < flags, no half
presets, the docs' table is the code's, and `grpo_arith.py:algo=dr_grpo` runs Dr.GRPO's loss on a hand case."""
import os
import re

import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags
from ml_collections import config_flags

from grpo_jax.config import config_lib
from grpo_jax.rl import losses
from grpo_jax.config import presets
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.run import validate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ("grpo_arith.py", "gsm8k.py", "r1_pipeline.py", "r1_zero.py")
BUDGET = ("rl.G", "rl.prompts_per_step", "rl.mu", "rl.minibatches", "rl.oversample", "optim.lr",
          "sampling.max_new_tokens", "task.prompt_len", "train.steps")


def _load(rel, arg=None):
  return config_lib.load_config(os.path.join(REPO, "configs", rel), arg)


def _get(c, key):
  for part in key.split("."):
    c = c[part]
  return c


def test_base_config_holds_the_grpo_preset():
  base = config_lib.base_config()
  assert presets.apply(base, "grpo").to_dict() == base.to_dict()


@pytest.mark.parametrize("name", presets.names())
def test_each_preset_sets_every_algorithm_setting_and_no_budget(name):
  keys = set(presets.PRESETS[name])
  want = set(presets.SETTINGS) if name == "ppo" else set(presets.RL_SETTINGS)
  assert keys == want, sorted(keys ^ want)
  assert not keys & set(BUDGET)


def test_a_preset_after_another_leaves_nothing_of_the_first():
  base = config_lib.base_config()
  alone = {b: presets.apply(base, b).to_dict() for b in presets.names()}
  for a in presets.names():
    first = presets.apply(base, a)
    for b in presets.names():
      assert presets.apply(first, b).to_dict() == alone[b], (a, b)


@pytest.mark.parametrize("rel", CONFIGS)
@pytest.mark.parametrize("name", presets.names())
def test_every_config_algo_arg_resolves_to_the_whole_preset(rel, name):
  """A config file's `:algo=<name>` yields exactly the preset's settings: the files set only budget keys."""
  c = _load(rel, f"algo={name}")
  assert (c.rl.algo, c.rl.preset) == (name, name)
  for key, value in presets.PRESETS[name].items():
    assert _get(c, key) == value, (rel, name, key)
  assert presets.check(c) is None


def test_unknown_algo_arg_is_one_line():
  with pytest.raises(config_lib.ConfigError, match=r"algo='grpoo' is not a preset; choose one of \['grpo'"):
    _load("grpo_arith.py", "algo=grpoo")


def _parse(*argv):
  fv = flags.FlagValues()
  # config_flags reads the overrides from sys_argv, as main does from sys.argv.
  config_flags.DEFINE_config_file("config", None, "", flag_values=fv, lock_config=True, sys_argv=["prog", *argv])
  fv(["prog", *argv])
  return fv.config


def test_precedence_preset_then_config_file_then_flags():
  c = _parse(f"--config={REPO}/configs/grpo_arith.py:algo=dapo", "--config.rl.eps_high=0.3", "--config.rl.G=4")
  assert c.rl.loss_agg == "token_mean" and c.rl.dynamic_sampling      # the preset
  assert c.rl.prompts_per_step == 16 and c.optim.lr == 1e-4           # the file (over the base)
  assert (c.rl.eps_high, c.rl.G) == (0.3, 4)                          # the flags (over preset and file)
  validate.validate_rl(c, num_devices=1)


def test_switching_algorithm_by_flag_alone_is_refused():
  """--config.rl.algo=dapo on a config built with the grpo preset would keep GRPO's loss, clip range and KL under
  DAPO's name: validation refuses it and names the config arg that applies the whole preset."""
  c = _parse(f"--config={REPO}/configs/grpo_arith.py", "--config.rl.algo=dapo")
  assert c.rl.loss_agg == "seq_mean_token_mean"  # what would silently have run
  with pytest.raises(validate.ConfigError) as e:
    validate.validate_rl(c, num_devices=1)
  assert "--config=<file>.py:algo=dapo" in str(e.value) and "\n" not in str(e.value)


def test_docs_algorithms_table_is_the_code():
  with open(os.path.join(REPO, "docs", "algorithms.md")) as f:
    doc = f.read()
  m = re.search(r"<!-- presets table: python -m grpo_jax.config.presets -->\n(.*?)<!-- end presets table -->", doc, re.S)
  assert m, "docs/algorithms.md lost its generated presets table markers"
  assert m.group(1) == presets.markdown_table(), "regenerate it: python -m grpo_jax.config.presets"
  for name in presets.names():
    assert f"`{name}`" in doc


# -------------------------------------------------------------------- the acceptance hand case: Dr.GRPO's loss


def _hand_case(config):
  """One group of G=2, rewards (1, 0), lengths 1 and 3 tokens, on-policy (ρ = 1), reference = policy: the advantage
  and the loss come from the resolved config through rl_step's own functions."""
  L = config.sampling.max_new_tokens
  mask = np.zeros((2, L), np.float32)
  mask[0, :1], mask[1, :3] = 1, 1
  lp = jnp.asarray(np.where(mask > 0, -1.0, 0.0), jnp.float32)
  ro = rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **dict(
      r_N=jnp.array([1.0, 0.0]), mask_NxL=jnp.asarray(mask), old_logp_NxL=lp, ref_logp_NxL=lp,
      terms_NxK=jnp.array([[1.0], [0.0]]), term_w_K=jnp.ones(1), steps=None)})
  c = config_lib.override(config, {"rl.G": 2})
  adv = rl_step.compute_advantages(c, ro)
  loss, _ = losses.policy_loss(lp, lp, lp, adv, jnp.asarray(mask), **rl_step.policy_loss_kwargs(c))
  return np.asarray(adv), float(loss), L


def test_grpo_arith_dr_grpo_runs_the_constant_normaliser():
  c = _load("grpo_arith.py", "algo=dr_grpo")
  assert (c.rl.advantage, c.rl.loss_agg, c.rl.beta) == ("dr_grpo", "seq_mean_token_sum_norm", 0.0)
  adv, loss, L = _hand_case(c)
  # Dr.GRPO: A = r − mean = ±0.5 (no std); loss = −(1/G) Σ_i Σ_t A_i / L = −(0.5·1 − 0.5·3) / (2·72) = 1/144.
  np.testing.assert_allclose(adv[:, :3], [[0.5, 0, 0], [-0.5, -0.5, -0.5]])
  assert L == 72 and loss == pytest.approx(1 / 144, rel=1e-6)
  # GRPO on the same case: 1/|o| makes each answer's mean ±A, so the loss is 0 whatever the lengths.
  adv, loss, _ = _hand_case(_load("grpo_arith.py"))
  np.testing.assert_allclose(adv[0, 0], 0.5 / (np.sqrt(0.5) + 1e-4), rtol=1e-6)
  assert loss == pytest.approx(0.0, abs=1e-7)
  # DAPO: one token mean over the 4 tokens: −(a − 3a)/4 = a/2 with GRPO's a.
  adv, loss, _ = _hand_case(_load("grpo_arith.py", "algo=dapo"))
  assert loss == pytest.approx(adv[0, 0] / 2, rel=1e-6)


def test_critic_algos_is_the_one_place_a_preset_gets_a_critic(monkeypatch):
  """A second critic preset, added to presets.CRITIC_ALGOS only, is PPO everywhere the algorithm picks a family:
  families.for_config, the memory planner, validation (GAE needs the critic) and the resume check (a change across
  the critic boundary changes the state tree). With `rl.algo == "ppo"` literals any of these would miss it."""
  from grpo_jax.rl import families
  from grpo_jax.rl import memory_plan
  from grpo_jax.rl import ppo_step
  from grpo_jax.run import run_config
  monkeypatch.setitem(presets.PRESETS, "ppo_twin", dict(presets.PRESETS["ppo"]))
  monkeypatch.setattr(presets, "CRITIC_ALGOS", ("ppo", "ppo_twin"))
  c = memory_plan.workload_config("tiny", algo="ppo_twin")
  assert families.for_config(c) is ppo_step
  one = dict(data=1, fsdp=1, tensor=1)
  assert memory_plan.plan(c, one).resident["critic"] == memory_plan.plan(c, one).resident["policy"]
  validate.validate_algorithm(c)  # GAE with a critic preset: accepted
  with pytest.raises(validate.ConfigError, match="config.rl.advantage"):
    validate.validate_algorithm(config_lib.override(c, {"rl.algo": "grpo", "rl.preset": "grpo"}))  # GAE, no critic
  assert run_config.structural(["rl.algo"], {"rl.algo": "grpo"}, {"rl.algo": "ppo_twin"}) == ["rl.algo"]
  assert run_config.structural(["rl.algo"], {"rl.algo": "ppo"}, {"rl.algo": "ppo_twin"}) == []
