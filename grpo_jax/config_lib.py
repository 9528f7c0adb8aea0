"""The one base config every experiment overrides; `configs/*.py` start from `base_config()`.

Every key a step or loop reads is declared here, so `--config.x.y=v` on an unknown key fails at parse time and
`validate.py` can check every value before anything compiles.
"""
import ml_collections

from grpo_jax.r1 import layout


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

  # R1-Zero and R1's five stages (job r1_pipeline; grpo_jax/r1, docs/r1.md): each stage's knobs and reward mix.
  c.r1 = ml_collections.ConfigDict(dict(
      stages=layout.STAGES,  # those to run, in this order (configs/r1_zero.py: base, r1_zero)
      # Forbidden words: the harmlessness proxy of stage 5; pre-training noise writes them (noise_frac).
      forbidden=("ugh",),
      pretrain=dict(steps=500, batch=32, lr=3e-3, warmup_steps=20,
                    template_frac=0.3,  # documents that are chat transcripts with the R1-Zero prompt
                    tag_frac=0.35,      # ... of which use the <think>/<answer> tags (web-like): 10.5% of documents
                    mix_frac=0.25,      # documents whose solution switches language mid-way
                    mistake_frac=0.2,   # documents with one wrong step, a re-check phrase and the fix
                    noise_frac=0.1),    # documents carrying a forbidden word
      zero=dict(steps=100, rewards=(("format", 1.0), ("accuracy", 1.0))),
      cold_start=dict(examples=256, steps=40, batch=32, lr=1e-3, warmup_steps=10, mistake_frac=0.1),
      grpo=dict(steps=30, rewards=(("accuracy", 1.0), ("format", 0.5), ("language", 0.5))),
      rejection=dict(prompts=256, n=8, temperature=1.0, keep_per_prompt=1, general_frac=0.25),
      sft2=dict(steps=100, batch=32, lr=1e-3, warmup_steps=10),
      final=dict(steps=20, rewards=(("accuracy", 1.0), ("format", 0.5), ("language", 0.5), ("brevity", 0.2),
                                    ("harmless", 0.5))),
      # Held-out comparison of every model (r1/heldout.py): like `eval`, on its own sizes.
      report=dict(size=256, batch=128, n_samples=4, pass_k=(1, 4)),
  ))
  return c
