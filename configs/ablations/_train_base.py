"""Shared knobs of the training ablations (tables d, e, f) on grpo_jax/ablations/toy.py."""
import ml_collections


def base(arg: str | None, variants: tuple) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.table = "train_table"
  c.seeds = 5
  c.model = ml_collections.ConfigDict(dict(hidden=32, layers=2, heads=2, kv=1, inter=64, vocab=32))
  c.prompts, c.G, c.L = 8, 8, 8
  # RL starts from a shared pre-trained base (toy.base_params: answers right ~35% of the time, lengths 1..L), as
  # in practice; lr 1e-3 measured stable for GRPO from it (3e-3 collapsed within 80 steps on 2 of 3 seeds).
  c.base_steps, c.p_correct = 300, 0.35
  c.lr, c.beta, c.critic_lr = 1e-3, 0.04, 1e-3
  c.steps, c.eval_every = 100, 20
  c.fast_compile = True
  c.variants = variants
  if arg == "small":
    c.seeds = 3
    c.model.layers = 1
    c.steps, c.eval_every = 40, 10
  elif arg:
    raise ValueError(f"config arg {arg!r}: use nothing (default) or 'small'.")
  return c
