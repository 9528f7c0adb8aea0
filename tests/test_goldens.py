"""Goldens: three updates of each algorithm family from a fixed seed, pinned per step.

GRPO (rl_step, μ=2 × 2 minibatches), PPO (ppo_step, separate critic, 2 minibatches), SFT (sft_step, linear
warm-up), and the CISPO, SAPO and Lite PPO presets (rl_step with their own objective, clip range, aggregation and
advantage; μ=2 × 2 minibatches, so the ratio leaves 1) on tiny self-contained configs: their own tokenizer, reward and batches, so a change elsewhere (tasks,
benchmark workload) cannot move them. Pinned: loss and gradient norm (the step's metrics), the optimizer update
(the step's `train/update_norm` where it reports one, and the norm of the params' change), the params' norm and sum
after the step, KL / reward / length for RL, value loss and the critic's sum for PPO.

Tolerance rtol=1e-4, atol=1e-6: XLA:CPU fp32 results differ in the last bits with the CPU's vector width / FMA and
the thread count (reduction order), and three Adam steps amplify that to ~1e-6 relative; any change of sampling,
init, loss, advantage or optimizer moves these numbers by far more.

Re-record ONLY for an intended numeric change, named with its reason in the commit message (e.g. "PPO whitens with
the shared masked whitening"), and only the family it concerns. The failure message prints the new values; or run
  JAX_PLATFORMS=cpu python tests/test_goldens.py
and paste its output over GOLDEN below.
"""
import os
import sys

if __name__ == "__main__":  # the recording run compiles under the same XLA flags as pytest (tests/conftest.py)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import conftest  # noqa: F401

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.config import config_lib
from grpo_jax.rl import families
from grpo_jax.model import model as model_lib
from grpo_jax.config import presets
from grpo_jax.rl import ppo_step
from grpo_jax.rl import reward_spec
from grpo_jax.rl import rl_step
from grpo_jax.rl import sft_step
from grpo_jax.infra import sharding

RTOL, ATOL = 1e-4, 1e-6
V, P, L, B, G, STEPS = 32, 6, 8, 4, 4, 3
PAD, EOS = 0, 1


class _Tok:
  """Ids only: 0 pad (also bos), 1 EOS, the rest plain tokens."""
  pad_id, bos_id, eos_id, vocab_size, tag_ids = PAD, PAD, EOS, V, {}

  @staticmethod
  def decode(ids) -> str:
    return " ".join(map(str, ids))


def _low_ids(tokens_NxL, mask_NxL, batch, ctx):
  """Fraction of completion tokens with an id below V/2: a random model scores varied rewards, so updates move."""
  m_NxL = mask_NxL.astype(jnp.float32)
  low_NxL = (tokens_NxL >= 2) & (tokens_NxL < V // 2)
  return reward_spec.outcome(jnp.sum(low_NxL * m_NxL, -1) / jnp.maximum(m_NxL.sum(-1), 1.0))



# Presets pinned with their own settings (objective, clip range, aggregation, β): only the budget is set here.
PRESET_FAMILIES = ("cispo", "sapo", "lite_ppo")


def _config(algo: str):
  c = presets.apply(config_lib.base_config(), algo)
  c.model.update(vocab_size=V, hidden=32, layers=1, heads=4, kv_heads=2, inter=64, max_len=P + L + 4,
                 tie_embeddings=True, qkv_bias=True, dtype="float32", remat="none")
  c.sampling.update(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=L)
  c.task.prompt_len = P
  c.optim.update(lr=1e-3, warmup_steps=0, b1=0.9, b2=0.99, weight_decay=0.0, grad_clip=1.0)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  c.train.num_samples_logged = 1
  if algo in PRESET_FAMILIES:
    c.rl.update(G=G, prompts_per_step=B, mu=2, minibatches=2)
    return c
  # The preset's settings (group std with ddof=1), with the others these goldens were first recorded under pinned
  # (PPO: its KL stays k1 in the per-token reward, as the ppo preset has it).
  c.rl.update(G=G, prompts_per_step=B, eps_low=0.2, eps_high=0.2, std_eps=1e-4,
              loss_agg="seq_mean_token_mean", mu=2 if algo == "grpo" else 1, minibatches=2)
  c.rl.beta = 0.04
  if algo == "grpo":
    c.rl.update(kl_estimator="k3", kl_in="loss")
  c.ppo.update(critic="separate", gamma=1.0, lam=0.95, value_clip=0.2, vf_coef=0.5, critic_lr=1e-2)
  c.optim.update(lr=1e-3, warmup_steps=0, b1=0.9, b2=0.99, weight_decay=0.0, grad_clip=1.0)
  c.sft.update(lr=3e-3, warmup_steps=2)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  c.train.num_samples_logged = 1
  return c


def _rl_batches():
  rng = np.random.default_rng(7)
  for _ in range(STEPS):
    n_NxP = rng.integers(2, P + 1, B)
    mask = (np.arange(P)[None, :] >= P - n_NxP[:, None]).astype(np.int32)  # left padding
    yield {"prompt_NxP": np.where(mask > 0, rng.integers(2, V, (B, P)), PAD).astype(np.int32),
           "prompt_mask_NxP": mask}


def _sft_batches():
  rng = np.random.default_rng(8)
  N, T = 8, P + L
  for _ in range(STEPS):
    n_N = rng.integers(P + 2, T + 1, N)
    mask = (np.arange(T)[None, :] < n_N[:, None]).astype(np.int32)  # right padding
    yield {"tokens_NxT": np.where(mask > 0, rng.integers(2, V, (N, T)), PAD).astype(np.int32),
           "positions_NxT": np.broadcast_to(np.arange(T, dtype=np.int32), (N, T)).copy(), "mask_NxT": mask,
           "loss_mask_NxT": mask * (np.arange(T)[None, :] >= P)}


def _host(tree) -> list[np.ndarray]:
  return [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(tree))]


def _norm(leaves) -> float:
  return float(np.sqrt(sum(np.sum(x * x) for x in leaves)))


def _run(family: str) -> list[dict[str, float]]:
  """STEPS steps of one family from seed 0: the pinned numbers per step."""
  c = _config(family if family in PRESET_FAMILIES else "ppo" if family == "ppo" else "grpo")
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  spec = reward_spec.RewardSpec(("low",), (1.0,), (_low_ids,), {}, reward_spec.Context("golden", _Tok()))
  module = {"ppo": ppo_step, "sft": sft_step}.get(family, rl_step)
  args = () if family == "sft" else (spec, spec.ctx.tokenizer)
  state = module.init(c, mesh, mcfg, seed=0)
  step = families.make_step(c, mesh, mcfg, *args, family=module)
  batches = _sft_batches() if family == "sft" else _rl_batches()
  prev, out = _host(state["params"]), []
  for batch in batches:
    state, m = step(state, batch)
    m, params = jax.device_get(m), _host(state["params"])
    row = {"loss": m["train/loss"], "grad_norm": m["train/grad_norm"],
           "delta_norm": _norm([a - b for a, b in zip(params, prev)]), "param_norm": _norm(params),
           "param_sum": sum(float(np.sum(x)) for x in params)}
    if family != "sft":
      row.update(update_norm=m["train/update_norm"], reward_mean=m["train/reward_mean"],
                 completion_len_mean=m["train/completion_len_mean"])
      if "train/kl" in m:  # β > 0
        row["kl"] = m["train/kl"]
    if family == "ppo":
      row.update(value_loss=m["train/value_loss"], critic_sum=sum(float(np.sum(x)) for x in
                                                                  _host(state["critic_params"])))
    out.append({k: float(v) for k, v in row.items()})
    prev = params
  return out


# Recorded 2026-11-30 with `python tests/test_goldens.py` (see the module docstring for when to re-record).
GOLDEN = {
    'grpo': {
        'loss': [-0.02255075, -0.01052349, -0.008858893],
        'grad_norm': [1.160131, 0.9164547, 1.198082],
        'delta_norm': [0.2771634, 0.1993103, 0.174315],
        'param_norm': [10.01778, 10.03684, 10.05406],
        'param_sum': [100.4414, 100.5953, 100.671],
        'update_norm': [0.0766197, 0.05244186, 0.04526561],
        'kl': [1.150962e-14, 0.0007525834, 0.002151224],
        'reward_mean': [0.46875, 0.4642857, 0.4125],
        'completion_len_mean': [7.5625, 7.1875, 6.75],
    },
    'ppo': {
        'loss': [0.1779506, 0.2540898, 0.3267111],
        'grad_norm': [1.693554, 1.63636, 1.887928],
        'delta_norm': [0.1596974, 0.1053878, 0.08799459],
        'param_norm': [10.0097, 10.01283, 10.01539],
        'param_sum': [100.2013, 100.2612, 100.3265],
        'update_norm': [0.08733332, 0.05589712, 0.04557839],
        'kl': [1.150962e-14, 0.0002273475, 0.0004417062],
        'reward_mean': [0.46875, 0.4460565, 0.4125],
        'completion_len_mean': [7.5625, 6.875, 6.75],
        'value_loss': [0.09343998, 0.04731548, 0.0840283],
        'critic_sum': [100.2845, 101.5038, 100.8368],
    },
    'sft': {
        'loss': [3.446957, 3.480918, 3.460222],
        'grad_norm': [1.317774, 1.411973, 1.295349],
        'delta_norm': [0, 0.1082915, 0.1756843],
        'param_norm': [10.00584, 10.00397, 10.00116],
        'param_sum': [99.8655, 99.6348, 99.09993],
    },
    # Recorded 2026-12-05 (the cispo, sapo and lite_ppo presets, μ=2 × 2 minibatches, their own settings).
    'cispo': {
        'loss': [-0.09834291, -0.1299916, -0.1740635],
        'grad_norm': [0.8207757, 0.9634176, 0.8754951],
        'delta_norm': [0.2802748, 0.2001411, 0.1738469],
        'param_norm': [10.01726, 10.0374, 10.05589],
        'param_sum': [100.1572, 100.4562, 100.7623],
        'update_norm': [0.07703188, 0.05264743, 0.04515713],
        'reward_mean': [0.46875, 0.4460565, 0.428125],
        'completion_len_mean': [7.5625, 6.875, 6.75],
    },
    'sapo': {
        'loss': [-0.05795257, -0.0467742, -0.04543478],
        'grad_norm': [1.160438, 0.9168148, 1.198229],
        'delta_norm': [0.2771735, 0.1993364, 0.1743826],
        'param_norm': [10.01778, 10.03685, 10.05412],
        'param_sum': [100.4413, 100.5953, 100.6717],
        'update_norm': [0.07662254, 0.05244771, 0.04528075],
        'reward_mean': [0.46875, 0.4642857, 0.4125],
        'completion_len_mean': [7.5625, 7.1875, 6.75],
    },
    'lite_ppo': {
        'loss': [-0.1408581, -0.07643768, -0.1814303],
        'grad_norm': [0.7785138, 0.7646832, 0.8045647],
        'delta_norm': [0.2800296, 0.2004814, 0.1754491],
        'param_norm': [10.0195, 10.0392, 10.05884],
        'param_sum': [100.5713, 100.6763, 100.8192],
        'update_norm': [0.07806106, 0.05216358, 0.04519991],
        'reward_mean': [0.46875, 0.4642857, 0.4203125],
        'completion_len_mean': [7.5625, 7.1875, 6.75],
    },
}


@pytest.fixture(scope="module", params=["grpo", "ppo", "sft", *PRESET_FAMILIES])
def family_run(request):
  return request.param, _run(request.param)


def test_three_updates_match_golden(family_run):
  family, got = family_run
  want = GOLDEN[family]
  assert len(got) == STEPS and sorted(got[0]) == sorted(want), (family, sorted(got[0]))
  for k, w in want.items():
    np.testing.assert_allclose(
        [row[k] for row in got], w, rtol=RTOL, atol=ATOL,
        err_msg=(f"{family} {k} per step moved from the golden. If this is an INTENDED numeric change (sampling, "
                 "init, loss, advantages, optimizer), re-record this family only and name the change in the commit "
                 f"message; its new values:\n    {family!r}: {_literal(got)},"))


def test_updates_really_move(family_run):
  """The pinned run is not degenerate: every step changes the params and has a non-zero gradient."""
  family, got = family_run
  for t, row in enumerate(got):
    assert row["grad_norm"] > 1e-4, (family, row)
    if family == "sft" and t == 0:
      assert row["delta_norm"] == 0.0  # the linear warm-up starts at lr 0: the first update is a no-op
    else:
      assert row["delta_norm"] > 1e-4, (family, t, row)
  if family != "sft":
    assert got[-1].get("kl", 1.0) > 0 and any(0 < r["reward_mean"] < 1 for r in got)


def _literal(rows: list[dict[str, float]]) -> str:
  """Per-step rows as GOLDEN's {metric: [step 1, step 2, step 3]} literal."""
  lines = "".join(f"        {k!r}: [{', '.join(f'{r[k]:.7g}' for r in rows)}],\n" for k in rows[0])
  return "{\n" + lines + "    }"


if __name__ == "__main__":
  print("GOLDEN = {")
  for fam in ("grpo", "ppo", "sft", *PRESET_FAMILIES):
    print(f"    {fam!r}: {_literal(_run(fam))},")
  print("}")
