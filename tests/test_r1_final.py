"""R1's final stage: each reward term's share of the advantage (rl_step.term_shares, the stage-5 diagnosis metric)
against hand-computed and independent NumPy values, and the forbidden word that stage 4's general text carries."""
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.rl import rl_step
from grpo_jax.rl import rollout as rollout_lib
from grpo_jax.r1 import rejection
from grpo_jax.tasks import data as data_lib
from grpo_jax.tasks import tokenizer_factory as tok_lib

L = 6


def _rollout(r_NxK, w_K, names, lengths, old_lp=-1.0, ref_lp=-1.0):
  r_NxK, w_K = np.asarray(r_NxK, np.float32), np.asarray(w_K, np.float32)
  mask = (np.arange(L)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)
  fields = dict(r_N=jnp.asarray(r_NxK @ w_K), terms_NxK=jnp.asarray(r_NxK), term_w_K=jnp.asarray(w_K),
                per_term={n: jnp.asarray(r_NxK[:, k]) for k, n in enumerate(names)}, mask_NxL=jnp.asarray(mask),
                old_logp_NxL=jnp.asarray(old_lp * mask), ref_logp_NxL=jnp.asarray(ref_lp * mask))
  return rollout_lib.Rollout(**{**dict.fromkeys(rollout_lib.Rollout._fields), **fields})


def _config(preset, **kw):
  return config_lib.override(presets.apply(config_lib.base_config(), preset), {"rl.G": 2, **kw})


def _np_shares(parts_NxK, adv_N):
  return parts_NxK.T @ adv_N / (adv_N @ adv_N)


def test_shares_hand_case_summed_reward():
  # Group 0: accuracy 1, 0 and brevity 0.5, 0.3 -> centred 0.5/-0.5 and 0.1/-0.1, their sum 0.6/-0.6: whatever the
  # group's scale, accuracy carries 0.5/0.6 of the advantage and brevity 0.1/0.6. Group 1: only brevity varies, and
  # GRPO's std scales it up to the same ±0.707 as group 0: over both groups brevity's share is far above its 1/6.
  r = [[1.0, 0.5], [0.0, 0.3], [1.0, 0.4], [1.0, 0.2]]
  ro = _rollout(r, [1.0, 1.0], ("accuracy", "brevity"), [3, 4, 2, 5])
  one = rl_step.term_shares(_config("grpo"), _rollout(r[:2], [1.0, 1.0], ("accuracy", "brevity"), [3, 4]))
  np.testing.assert_allclose([one["accuracy"], one["brevity"]], [0.5 / 0.6, 0.1 / 0.6], rtol=1e-5)
  got = rl_step.term_shares(_config("grpo"), ro)
  # GRPO (ddof=1, eps 1e-4): group g's scale is 1 / (std_g + eps); the centred terms are as above.
  c = np.asarray([[0.5, 0.1], [-0.5, -0.1], [0.0, 0.1], [0.0, -0.1]])
  s = np.repeat([1 / (np.std([1.5, 0.3], ddof=1) + 1e-4), 1 / (np.std([1.4, 1.2], ddof=1) + 1e-4)], 2)
  parts = c * s[:, None]
  want = _np_shares(parts, parts.sum(1))
  np.testing.assert_allclose([got["accuracy"], got["brevity"]], want, rtol=1e-5)
  np.testing.assert_allclose(want, [0.5 / 0.6 / 2, 1 - 0.5 / 0.6 / 2], rtol=1e-3)  # each group holds half of |A|²
  # No group varies: no advantage to share, and every share is 0 (not 1/K, not NaN) as docs/metrics.md says.
  flat = rl_step.term_shares(_config("grpo"),
                             _rollout([[1.0, 0.5]] * 4, [1.0, 1.0], ("accuracy", "brevity"), [3, 4, 2, 5]))
  assert [float(flat["accuracy"]), float(flat["brevity"])] == [0.0, 0.0]
  assert abs(sum(got.values()) - 1.0) < 1e-5


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "rloo", "gdpo"])
def test_shares_sum_to_one_and_match_numpy(preset):
  """Independent NumPy decomposition per estimator: the parts sum to the advantage the step trains on."""
  rng = np.random.default_rng(1)
  r = np.concatenate([rng.integers(0, 2, (8, 1)), rng.random((8, 1)), rng.integers(0, 2, (8, 1))], 1)
  r[6:8] = [1.0, 0.25, 1.0]  # a group without signal
  w = np.asarray([1.0, 0.2, 0.5])
  ro = _rollout(r, w, ("accuracy", "brevity", "harmless"), [6, 3, 1, 4, 2, 5, 6, 6])
  c = _config(preset)
  got = rl_step.term_shares(c, ro)
  adv = np.asarray(rl_step.compute_advantages(c, ro))[:, 0]
  rg = r.reshape(4, 2, 3)
  if preset == "gdpo":
    z = np.zeros_like(rg)
    for b in range(4):
      for k in range(3):
        if rg[b, :, k].max() > rg[b, :, k].min():
          z[b, :, k] = (rg[b, :, k] - rg[b, :, k].mean()) / (rg[b, :, k].std(ddof=1) + 1e-4)
    parts = (z * w).reshape(8, 3)
    tot = parts.sum(1)
    parts = parts / (tot.std(ddof=1) + 1e-4)
  else:
    cen = (rg - rg.mean(1, keepdims=True)) * w
    tot = cen.sum(2)
    scale = {"grpo": 1 / (np.std(tot, axis=1, ddof=1) + 1e-4), "dr_grpo": np.ones(4), "rloo": np.full(4, 2.0)}[preset]
    scale = np.where(np.ptp(tot, axis=1) > 0, scale, 0.0)
    parts = (cen * scale[:, None, None]).reshape(8, 3)
  np.testing.assert_allclose(parts.sum(1), adv, rtol=1e-4, atol=1e-5)  # the decomposition is of the real advantage
  np.testing.assert_allclose([got[n] for n in ("accuracy", "brevity", "harmless")], _np_shares(parts, adv),
                             rtol=1e-4, atol=1e-6)
  assert abs(sum(got.values()) - 1.0) < 1e-5


def test_kl_folded_into_the_reward_is_a_term_and_per_token_estimators_have_none():
  r = [[1.0], [0.0], [1.0], [1.0]]
  # Rows with different lengths have different sequence KL, so the penalty varies inside group 1 too.
  ro = _rollout(r, [1.0], ("accuracy",), [1, 4, 2, 6], old_lp=-1.0, ref_lp=-1.5)
  c = _config("grpo", **{"rl.kl_in": "reward", "rl.kl_estimator": "k1", "rl.beta": 0.1})
  got = rl_step.term_shares(c, ro)
  assert set(got) == {"accuracy", "kl_penalty"}
  assert got["kl_penalty"] > 0 and abs(got["accuracy"] + got["kl_penalty"] - 1.0) < 1e-5
  # In group 1 only the penalty varies: drop it and the accuracy group alone remains.
  assert got["accuracy"] < 1.0
  assert rl_step.term_shares(_config("reinforce_pp"), ro) == {}


def test_general_text_carries_the_forbidden_word_at_its_rate():
  from configs import r1_pipeline
  c = r1_pipeline.get_config("small")
  tok = tok_lib.for_config(c)
  task = data_lib.make_task(c.task)
  examples = data_lib.load_examples(c.task, "train")[:400]
  for frac, lo, hi in ((0.0, 0.0, 0.0), (0.5, 0.4, 0.6), (1.0, 0.95, 1.0)):
    c.r1.rejection.general_noise_frac = frac
    recs = rejection._general_records(c, task, tok, examples, 200)
    dirty = [" ugh " in " " + r["text"] + " " for r in recs]
    # Every record is still a tag-free worked solution whose steps are intact.
    assert all("<think>" not in r["text"] and r["prompt_ids"] == [] for r in recs)
    assert lo <= np.mean(dirty) <= hi, frac
    clean = [r["text"].replace(" ugh", "") for r in recs]
    c.r1.rejection.general_noise_frac = 0.0
    assert clean == [r["text"] for r in rejection._general_records(c, task, tok, examples, 200)]


def test_final_stage_knobs_reach_only_the_final_stage():
  from configs import r1_pipeline
  from grpo_jax.r1 import stage_config
  c = r1_pipeline.get_config("small")
  default = stage_config.for_stage(c, "r1_5_final")
  assert (default.optim.lr, default.rl.beta) == (1e-4, 0.2)  # the recipe's own stage-5 lr and β (docs/r1.md)
  c.r1.final.update(lr=0.0, beta=-1.0)
  same = stage_config.for_stage(c, "r1_5_final")
  assert (same.optim.lr, same.rl.beta, same.rl.reward_norm) == (c.optim.lr, c.rl.beta, c.rl.reward_norm)  # inherit
  c.r1.final.update(lr=3e-5, beta=0.5, reward_norm="per_term")
  f = stage_config.for_stage(c, "r1_5_final")
  assert (f.optim.lr, f.rl.beta, f.rl.reward_norm) == (3e-5, 0.5, "per_term")
  for stage in ("r1_zero", "r1_2_grpo"):
    g = stage_config.for_stage(c, stage)
    assert (g.optim.lr, g.rl.beta, g.rl.reward_norm) == (c.optim.lr, c.rl.beta, c.rl.reward_norm), stage
  c.r1.final.beta = 0.0  # β = 0 is a value, not "inherit"
  assert stage_config.for_stage(c, "r1_5_final").rl.beta == 0.0


@pytest.mark.parametrize("key,value,needle", [("lr", -1e-4, "r1.final.lr"), ("beta", -0.5, "r1.final.beta"),
                                              ("reward_norm", "bogus", "r1.final.lr / beta / reward_norm")])
def test_final_stage_knobs_bad_values_are_one_line(key, value, needle):
  from configs import r1_pipeline
  from grpo_jax.run import validate as validate_lib
  from grpo_jax.r1 import stage_config
  c = r1_pipeline.get_config("small")
  c.r1.final[key] = value
  with pytest.raises(validate_lib.ConfigError) as e:
    stage_config.validate(c, ("r1_5_final",))
  assert needle in str(e.value) and "\n" not in str(e.value)
