"""GRPO on GSM8K from a Hugging Face Qwen2.5(-Math) checkpoint (R1-Zero style: reward on the checked answer).

Intended real run (not run here: no TPU, no weights, no GSM8K download on this machine):

  python -m grpo_jax.main --config=configs/gsm8k_qwen.py --workdir=gs://BUCKET/gsm8k_qwen \\
      --config.train.init_from=hf:/data/Qwen2.5-Math-1.5B --config.task.data_dir=/data/tfds
  # on a pod: launch/ runs the same command on every worker with GRPO_JAX_DISTRIBUTED=1

- model: a local HF Qwen2.5-Math-1.5B (or Qwen2.5-1.5B) directory, read by grpo_jax/hf_io.py through
  `train.init_from=hf:<dir>` (policy and reference both start from it). config.model must equal the checkpoint's
  config.json (below: Qwen2.5-Math-1.5B); a mismatch stops the run before training, naming the field.
- tokenizer: `task.tokenizer='init_from'` reads the checkpoint directory's own `tokenizer.json` through the
  `tokenizers` package (tasks/hf_tokenizer.py): Qwen's byte-level BPE, eos = pad = `<|endoftext|>` (also put before
  each prompt, as Qwen has no BOS), ids 151,665..151,935 (embedding padding) decode to ''. `hf:<dir>` or a path
  to a tokenizer.json names another one.
- data: TFDS `gsm8k` prepared in `task.data_dir` (train 7473, test 1319).
- GRPO as in DeepSeekMath (the grpo preset: β=0.04 with k3 in the loss, ε=0.2, group std, 1/|o| per answer; another
  preset with `:algo=<name>`): G=8 samples per question, 64 questions per step (512 completions), lr 1e-6 constant,
  μ=1, temperature 1.0, 512 new tokens, bfloat16 params, remat 'dots'.
- mesh: a 16-chip slice (e.g. v5e-16) as fsdp=-1 (params, grads and Adam moments sharded over all chips); docs/scale.md
  has the TPU-compiled per-device memory of Qwen2.5-0.5B and planner estimates for 1.5B.
- reward: `math_accuracy` (gsm8k.make_math_reward: the <think>/<answer> format, checked on the decoded text since
  Qwen2.5's tags are several tokens each, then math_answer.equal against '####').
- eval: every 100 steps, the first 1280 test questions: greedy accuracy, format rate, and over 4 samples at
  temperature 1 pass@1, pass@4, cons@4, scored on the host by the same gsm8k.grade as the reward.

Small variant (`:small`): a random 1-layer model with the shipped tokenizer on mock GSM8K records
(tests/test_gsm8k_run.py supplies them through tfds.testing.mock_data), 2 GRPO steps, the Python math reward
through jax.pure_callback, held-out eval (host-verified) at steps 0 and 2. Measured on the shared 2-core CPU
(`JAX_PLATFORMS=cpu python -m pytest tests/test_gsm8k_run.py`): 2026-11-29 without eval, load ~8: 34 s, 30 s of it
compiling; 2026-11-30 with the two evals (two more programs to compile), load ~12: 108 s wall, 34 s CPU.
"""
from grpo_jax import config_lib
from grpo_jax import presets

# Qwen2.5-Math-1.5B config.json (hidden_size 1536, 28 layers, 12 heads, 2 kv heads, intermediate 8960,
# vocab 151936, rope_theta 10000, max_position_embeddings 4096, tied embeddings, rms_norm_eps 1e-6).
QWEN25_MATH_1P5B = dict(vocab_size=151_936, hidden=1536, layers=28, heads=12, kv_heads=2, head_dim=0, inter=8960,
                        rope_theta=10_000.0, qkv_bias=True, tie_embeddings=True, max_len=4096, rms_eps=1e-6)


def get_config(arg: str | None = None):
  args = config_lib.parse_arg(arg, small=False, algo="grpo")
  small = args.small
  c = presets.apply(config_lib.base_config(), args.algo)  # grpo: DeepSeekMath's settings (grpo_jax/presets.py)
  c.job = "grpo"
  c.model.update(dtype="bfloat16", remat="dots", **QWEN25_MATH_1P5B)
  c.task.update(name="gsm8k", language="a", prompt_len=256, data_dir="", test_size=1319, tokenizer="init_from")
  c.sampling.update(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=512)
  c.rewards = (("math_accuracy", 1.0),)
  c.rl.update(G=8, prompts_per_step=64, mu=1, minibatches=4)
  c.optim.update(lr=1e-6, warmup_steps=0, grad_clip=1.0, weight_decay=0.0)
  c.sft.steps = 0
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  c.train.update(steps=1000, log_every=1, eval_every=100, ckpt_every=100, plot_every=100, sample_every=20)
  c.eval.update(size=1280, batch=64, n_samples=4, pass_k=(1, 4))
  if small:
    c.model.update(vocab_size=512, hidden=32, layers=1, heads=2, kv_heads=1, head_dim=0, inter=64, max_len=160,
                   dtype="float32", remat="none")
    c.task.update(prompt_len=96, test_size=4, tokenizer="")  # the shipped sentencepiece tokenizer
    c.sampling.max_new_tokens = 16
    c.rl.update(G=2, prompts_per_step=2, minibatches=1)
    c.optim.lr = 1e-3
    c.mesh.update(data=-1, fsdp=1)
    c.train.update(steps=2, eval_every=2, ckpt_every=2, plot_every=0, sample_every=2)
    c.eval.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))
    c.log.tensorboard = False
  return c
