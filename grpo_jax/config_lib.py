"""The one base config every experiment overrides; `configs/*.py` start from `base_config()`.

Every key a step or loop reads is declared here, so `--config.x.y=v` on an unknown key fails at parse time and
`validate.py` can check every value before anything compiles.
"""
import ml_collections


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.job = "grpo"  # grpo | sft | pretrain | r1_pipeline

  c.model = ml_collections.ConfigDict(dict(
      vocab_size=512, hidden=64, layers=2, heads=4, kv_heads=2, head_dim=0, inter=192,
      rope_theta=10_000.0, qkv_bias=True, tie_embeddings=True, max_len=160, dtype="float32",
      rms_eps=1e-6, remat="none",
      attention="xla",        # or "dot_product" / "cudnn" (jax.nn.dot_product_attention; GPU/TPU)
      layer_unroll="auto"))   # "all" / "none": unroll the training/prefill layer scan; auto = all up to 8 layers

  c.task = ml_collections.ConfigDict(dict(
      name="arith", max_digits=2, ops="+-", num_numbers=4, max_number=20, max_target=100,
      language="a", prompt_len=24, data_dir="", train_size=20_000, test_size=500,
      tokenizer=""))  # "" = the shipped sentencepiece model; "hf:<dir>", a .model path, or "init_from"

  c.sampling = ml_collections.ConfigDict(dict(
      temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48))

  c.rl = ml_collections.ConfigDict(dict(
      algo="grpo",               # grpo | dr_grpo | rloo | reinforce_pp | reinforce_pp_baseline | gspo | ppo
      G=8, prompts_per_step=8,
      eps_low=0.2, eps_high=0.2,
      beta=0.04, kl_estimator="k3", kl_in="loss",
      std_eps=1e-4, std_ddof=0,  # population std (ddof=0) as in TRL/DeepSeekMath; eps added to the std
      mu=1, minibatches=1,
      loss_agg="seq_mean_token_mean",
      process_weight=0.0,        # weight of process (step) advantages; 0 = outcome only
      dynamic_sampling=False, oversample=2,
      overlong_cache=0,          # DAPO soft overlong punishment window (tokens); 0 = off
      gspo_eps_low=3e-4, gspo_eps_high=4e-4,
      max_nonfinite_in_row=3,
      reward_fallback="",        # "" = raise on bad Python reward output; else a float used per bad sample
      reward_timeout_s=60.0))

  c.ppo = ml_collections.ConfigDict(dict(
      critic="separate", gamma=1.0, lam=0.95, value_clip=0.2, vf_coef=0.5, critic_lr=1e-4))

  # (name, weight) pairs; names from grpo_jax.rewards.REGISTRY.
  c.rewards = (("accuracy", 1.0), ("format", 0.2))

  c.optim = ml_collections.ConfigDict(dict(
      lr=1e-5, warmup_steps=0, b1=0.9, b2=0.99, weight_decay=0.0, grad_clip=1.0))

  c.sft = ml_collections.ConfigDict(dict(
      steps=0, batch=32, lr=3e-3, warmup_steps=20, loss_on="completion", mistake_frac=0.0, init_from=""))

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1))

  c.train = ml_collections.ConfigDict(dict(
      steps=20, log_every=1, eval_every=10, ckpt_every=10, keep_checkpoints=3, plot_every=10,
      sample_every=10, num_samples_logged=3, init_from=""))

  c.eval = ml_collections.ConfigDict(dict(
      size=500, batch=100, n_samples=4, pass_k=(1, 4)))

  c.log = ml_collections.ConfigDict(dict(tensorboard=True, wandb_project=""))
  return c
