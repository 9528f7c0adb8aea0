"""GRPO on GSM8K from a Hugging Face checkpoint (Qwen2.5 / Qwen2.5-Math / Llama-3.x): reward on the checked answer.

Intended real run (not run here: no accelerator, no weights, no internet on this machine):

  python -m grpo_jax.main --config=configs/gsm8k.py --workdir=/mnt/BUCKET/gsm8k \\
      --config.train.init_from=hf:/data/Qwen2.5-Math-1.5B --config.task.data_dir=/data/gsm8k
  python -m grpo_jax.export /mnt/BUCKET/gsm8k /data/Qwen2.5-Math-1.5B-gsm8k-grpo     # a HF dir to serve or push
  # an instruct model with its own chat template: configs/gsm8k.py:prompt=chat and an -Instruct init_from
  # on a pod: launch/ runs the same command on every worker with GRPO_JAX_DISTRIBUTED=1 (/mnt/BUCKET: the bucket
  # mounted with gcsfuse on every worker; a gs:// workdir is refused, docs/reliability.md section 3)

Args (`configs/gsm8k.py:<arg>,...`):
- `model=checkpoint` (default): every model field (shape, RoPE θ and llama3 scaling, norm eps, tying, biases,
  vocab, max_len) is read from the checkpoint's config.json (grpo_jax/hf/model_source.py); `--config.model.X=...`
  still sets X, and must then agree with the checkpoint (all disagreements are listed in one error before anything
  is built). `model=<preset>` (grpo_jax/model/model_presets.py: qwen2.5-0.5b ... llama-3.1-8b) pins the shape instead:
  the checkpoint must match it. `model=tiny`: a random 1-layer model with the shipped tokenizer (no checkpoint).
- `prompt=r1_zero` (default): DeepSeek-R1's R1-Zero template, completions in `<think>…</think> <answer>…</answer>`;
  `prompt=chat`: the tokenizer's own chat template (system: "Please reason step by step, and put your final answer
  within \\boxed{}.", then the question as the user turn), for -Instruct checkpoints.
- `small`: 2 GRPO steps on a tiny slice (model defaults to `tiny`, which yields to a checkpoint: with
  `--config.train.init_from=hf:DIR` the model is the checkpoint's, and its tokenizer when DIR has one;
  `small,model=checkpoint` says so explicitly; tests/test_hf_cli_llama.py, tests/test_hf_cli_qwen.py).

Pieces: tokenizer = the checkpoint's own (`task.tokenizer=init_from`: tokenizer.json through `tokenizers`, EOS ids
from generation_config.json too); data = `task.data_dir` with GSM8K's train.jsonl/test.jsonl (the
openai/grade-school-math files) or TFDS `gsm8k` prepared there (`python -m grpo_jax.tasks.gsm8k --data_dir=DIR`);
rewards = `math_accuracy` (the final answer has the reference value: `<answer>` body, else `\\boxed{}`, else the
last number of an ended completion; tasks/gsm8k.py) + 0.2 × `math_format` (the format the prompt asked for);
GRPO as in DeepSeekMath (the grpo preset: β=0.04 with k3 in the loss, ε=0.2, group std, 1/|o| per answer; another
preset with `:algo=<name>`): G=8, 64 questions per step, lr 1e-6, μ=1, temperature 1,
512 new tokens, bfloat16 compute, remat 'dots', fsdp over all chips (docs/scale.md: Qwen2.5-1.5B/7B TPU compiles);
eval every 100 steps on the first 1280 test questions (greedy accuracy, format rate, pass@1/4, cons@4).

Small variant (`:small`, model tiny, mock GSM8K from tests): 2 GRPO steps + evals at steps 0 and 2: 37 s on the
shared 2-core CPU at load ~7 (tests/test_gsm8k_run.py fixture, 2026-11-30). `:small,model=checkpoint` from a tiny
HF directory through the CLI, plus export: 60 s at load ~7 (tests/test_hf_cli_llama.py fixture).
"""
from grpo_jax.config import config_lib
from grpo_jax.model import model_presets
from grpo_jax.config import presets

TINY = dict(vocab_size=512, hidden=32, layers=1, heads=2, kv_heads=1, head_dim=0, inter=64, max_len=384,
            rope_theta=10_000.0, qkv_bias=True, tie_embeddings=True, rms_eps=1e-6, **model_presets.NO_SCALING)


def get_config(arg: str | None = None):
  a = config_lib.parse_arg(arg, small=False, model="", prompt="r1_zero", algo="grpo")
  model = a.model or ("tiny" if a.small else model_presets.CHECKPOINT)
  if a.prompt not in ("r1_zero", "chat"):
    raise config_lib.ConfigError(f"config arg prompt={a.prompt!r}: use r1_zero or chat.")
  c = presets.apply(config_lib.base_config(), a.algo)  # the algorithm's settings first: this file's override them
  c.job = "grpo"
  c.model.update(dtype="bfloat16", remat="dots")
  if model == "tiny":
    c.model.update(TINY, yield_to_checkpoint=not a.model)  # `:small` alone: a default an hf: init_from replaces
  else:
    model_presets.apply(c.model, model)
  c.task.update(name="gsm8k", language="a", prompt_len=320, data_dir="", test_size=1319,
                tokenizer="" if model == "tiny" else "init_from", prompt_format=a.prompt)
  c.sampling.update(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=512)
  if model == "tiny" and not a.small:  # the full-length prompts and completions (TINY's 384 fit `small`'s only)
    c.model.max_len = c.task.prompt_len + c.sampling.max_new_tokens
  c.rewards = (("math_accuracy", 1.0), ("math_format", 0.2))
  c.rl.update(G=8, prompts_per_step=64, mu=1, minibatches=4)
  c.optim.update(lr=1e-6, warmup_steps=0, grad_clip=1.0, weight_decay=0.0)
  c.sft.steps = 0
  c.mesh.update(data=1, fsdp=-1, tensor=1)
  c.train.update(steps=1000, log_every=1, eval_every=100, ckpt_every=100, plot_every=100, sample_every=20)
  c.eval.update(size=1280, batch=64, n_samples=4, pass_k=(1, 4))
  if a.small:
    c.model.update(dtype="float32", remat="none")
    c.task.update(prompt_len=256, test_size=4)
    c.sampling.max_new_tokens = 16
    c.rl.update(G=2, prompts_per_step=2, minibatches=1)
    c.optim.lr = 1e-3
    c.mesh.update(data=-1, fsdp=1)
    c.train.update(steps=2, eval_every=2, ckpt_every=2, plot_every=0, sample_every=2)
    c.eval.update(size=4, batch=4, n_samples=2, pass_k=(1, 2))
    c.log.tensorboard = False
  return c
