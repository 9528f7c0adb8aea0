"""Seconds per GRPO step on the peers' workload (grpo_jax/tasks/digits.py: the peers' TRL GRPO bench), same flags.

Random-init Qwen2-shaped model with tied embeddings, prompts "what is A + B =", reward 1 if the answer's digits
appear in the completion, β=0.04 (k3 in the loss), μ=1, lr 1e-5, temperature 1, L new tokens always decoded.
The first (compiling) step is excluded; the update is never skipped, and the script checks that params changed and
that the step compiled exactly once.

  python benchmarks/grpo_step.py --hidden 64 --layers 2 --heads 4 --kv 2 --inter 128 --vocab 512 --prompts 8 --G 8 --L 64
  python benchmarks/grpo_step.py ... --vs-trl /tmp/trlenv/bin/python --vs-tunix /tmp/tunixenv/bin/python
  python benchmarks/grpo_step.py ... --scaling docs/scaling_tiny.png
  python benchmarks/grpo_step.py --hidden 256 --layers 4 --heads 8 --kv 4 --inter 1024 --vocab 2048 --L 256 --early-exit
  python benchmarks/grpo_step.py --model-dir DIR --prompts 8 --G 8 --L 128 --vs-trl ... --vs-tunix ...
  python benchmarks/grpo_step.py --model-dir DIR --workload tail --L 512 ... --vs-vllm PYTHON   (tail_bench.py)

Realistic lengths (--model-dir DIR, a checkpoint of benchmarks/make_stop_checkpoint.py that answers and stops): every
side loads DIR's weights (ours with hf_io, TRL with GRPOTrainer(model=DIR), tunix with its safetensors loader) and
tokenizer, samples from the same prompts in the same order (peers/stop_prompts.py) and stops at EOS; ours runs with
early exit (--exit-chunk, --train-buckets). The shape flags come from DIR/config.json. Each side reports its mean
completion length (tokens incl. EOS) and reward over the timed steps.

Peers run between two halves of our steps (same compiled program), so both sides see the same machine load.
Also printed: model FLOP/s (grpo_jax/perf/flops.py: analytic, real tokens, no recompute) over the whole step and over the
update alone (policy forward+backward and reference forward, timed as separate programs) against an fp32 matmul
peak measured in this run; decode tokens/s; on a GPU/TPU, MFU and the decode HBM-bandwidth fraction.
"""
import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

from grpo_jax.tasks import digits

PEERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers")
FLAGS = dict(hidden=64, layers=2, heads=4, kv=2, inter=128, vocab=512, prompts=8, G=8, L=64, steps=6)
SHAPE = ("hidden", "layers", "heads", "kv", "inter", "vocab")  # --model-dir: taken from the checkpoint


def bench_config(a):
  c = digits.bench_config(hidden=a.hidden, layers=a.layers, heads=a.heads, kv=a.kv, inter=a.inter,
                                 vocab=a.vocab, prompts=a.prompts, G=a.G, L=a.L, dtype=a.dtype, remat=a.remat)
  c.model.attention = a.attention
  c.train.num_samples_logged = a.prompts * a.G  # every row's mask comes back: FLOPs count real tokens
  if getattr(a, "model_dir", ""):
    from grpo_jax.hf import hf_io
    m = hf_io.read_config(a.model_dir)  # the fields bench_config does not set from the shape flags
    c.model.update(head_dim=m.head_dim, rope_theta=m.rope_theta, rms_eps=m.rms_eps, qkv_bias=m.qkv_bias,
                   tie_embeddings=m.tie_embeddings)
    if a.exit_chunk is not None:  # else the config's auto (-1): the shipped default
      c.sampling.exit_chunk = a.exit_chunk
    if a.train_buckets is not None:
      c.rl.train_buckets = a.train_buckets
  for key, value in getattr(a, "overrides", {}).items():  # main's --engine / --packing / --config-override
    import tail_bench  # benchmarks/ (the script's directory); it imports this module
    tail_bench.set_key(c, key, value)
  return c


def check_flags(a) -> None:
  """The workload flags a run cannot honour, in one line: --steps below 2 ran 2 timed steps of ours anyway (one per
  half) and left the peers, which drop their first (compiling) step from the median, no step to count."""
  if a.steps < 2:
    raise SystemExit(f"--steps {a.steps}: the peers drop their first (compiling) step from the median; use --steps "
                     ">= 2.")


def shape_from_checkpoint(a) -> None:
  """--model-dir: the shape flags are the checkpoint's (a flag given with another value is an error); else the
  defaults of FLAGS."""
  if not a.model_dir:
    for k in SHAPE:
      setattr(a, k, FLAGS[k] if getattr(a, k) is None else getattr(a, k))
    return
  from grpo_jax.hf import hf_io
  m = hf_io.read_config(a.model_dir)
  ck = dict(hidden=m.hidden, layers=m.layers, heads=m.heads, kv=m.kv_heads, inter=m.inter, vocab=m.vocab_size)
  bad = [f"--{k} {getattr(a, k)} (checkpoint: {v})" for k, v in ck.items() if getattr(a, k) not in (None, v)]
  if bad:
    raise SystemExit(f"--model-dir {a.model_dir}: {', '.join(bad)}; leave the shape flags out in this mode.")
  for k, v in ck.items():
    setattr(a, k, v)


def stop_batches(tokenizer, prompts: int, steps: int, rows: list[dict] | None = None):
  """`rows` (default peers/stop_prompts.rows) in order, `prompts` per batch, tokenized with the checkpoint's
  tokenizer and left-padded to the workload's prompt length (what TRL and tunix feed their models, up to left
  padding)."""
  sys.path.insert(0, PEERS)
  import stop_prompts
  P, A = digits.BENCH_PROMPT_LEN, 4
  rows = stop_prompts.rows(prompts * steps) if rows is None else rows
  for s in range(steps):
    prompt = np.full((prompts, P), tokenizer.pad_id, np.int32)
    pmask = np.zeros((prompts, P), np.int32)
    ans = np.full((prompts, A), -1, np.int32)
    for i, r in enumerate(rows[s * prompts:(s + 1) * prompts]):
      ids, d = tokenizer.encode(r["prompt"]), tokenizer.encode(r["answer"])
      if len(ids) > P or len(d) > A:
        raise SystemExit(f"{r}: {len(ids)} prompt / {len(d)} answer tokens; the workload allows {P} / {A}. Is the "
                         "tokenizer the one make_stop_checkpoint.py wrote?")
      prompt[i, P - len(ids):], pmask[i, P - len(ids):], ans[i, :len(d)] = ids, 1, d
    yield {"prompt_NxP": prompt, "prompt_mask_NxP": pmask, "answer_ids_NxA": ans}


def check_fingerprint(mcfg, params, tokenizer) -> float:
  """stop_prompts.fingerprint of our logits after its CHECK_PROMPT: the peers print theirs from what they loaded."""
  from grpo_jax.model import model as model_lib
  sys.path.insert(0, PEERS)
  import stop_prompts
  ids = np.asarray([tokenizer.encode(stop_prompts.CHECK_PROMPT)], np.int32)
  pos = np.arange(ids.shape[1], dtype=np.int32)[None]
  return stop_prompts.fingerprint(np.asarray(model_lib.forward(mcfg, params, ids, pos, np.ones_like(ids)))[0, -1])


class Ours:
  """The jitted step on the workload, compiled once; `run(k)` times k more steps on it. A subclass changes the
  config (make_config), the shared prompts (rows) or what is timed per batch (_one)."""
  make_config = staticmethod(bench_config)

  def rows(self, n: int) -> list[dict] | None:
    return None  # stop_batches' default: peers/stop_prompts.rows

  def __init__(self, a):
    import jax
    from grpo_jax.model import model as model_lib
    from grpo_jax.rl import auto
    from grpo_jax.rl import families
    from grpo_jax.rl import rl_step
    from grpo_jax.infra import sharding
    from grpo_jax.run import validate
    self.a, self.jax = a, jax
    c = self.make_config(a)
    validate.validate_rl(c, jax.device_count())
    mesh = sharding.make_mesh(c.mesh)
    # the shipped defaults: every `auto` knob resolved as `python -m grpo_jax.main` resolves it (rl/auto.py)
    c, chosen = auto.resolve_here(c, mesh, log=False)
    self.resolved = {k: v.split(" (")[0] for k, v in chosen.items()}
    print("grpo_jax auto: " + (", ".join(f"{k}={v}" for k, v in sorted(self.resolved.items())) or "nothing to resolve"),
          flush=True)
    self.mcfg = model_lib.ModelConfig.from_config(c.model)
    if a.model_dir:  # the shared checkpoint: its weights, its tokenizer (EOS, pad), the shared prompts in order
      from grpo_jax.hf import hf_io
      from grpo_jax.tasks import hf_tokenizer
      tokenizer, params = hf_tokenizer.load(a.model_dir), hf_io.load_params(a.model_dir, self.mcfg)
      n = a.steps + 2  # compile step + both halves
      if c.rl.get("partial_rollouts", False):  # the carry's first step takes max_staleness batches more
        n += int(c.rl.max_staleness)
      self.batches = stop_batches(tokenizer, a.prompts, n, self.rows(a.prompts * n))
      self.fingerprint = check_fingerprint(self.mcfg, params, tokenizer)
    else:
      tokenizer, params = digits.Tokenizer(a.vocab), None
      self.batches = digits.make_batches(a.prompts, 10_000)
    self.config, self.mesh, self.tokenizer, self.spec = c, mesh, tokenizer, digits.reward_spec(a.vocab)
    from grpo_jax.rl import rollout as rollout_lib
    from grpo_jax.rollout import carry as carry_lib
    with carry_lib.batch_fields(digits.BATCH_FIELDS):  # rl.partial_rollouts: what the carry holds per prompt
      self.step = families.make_step(c, mesh, self.mcfg, self.spec, tokenizer)
      self.state = rl_step.init(c, mesh, self.mcfg, seed=0, params=params)
      self.carry = rollout_lib.carry_spec(c)
    if self.carry is not None:  # the first step fills the carry's table (carry.host_stream): Q/B batches
      listed = list(itertools.islice(self.batches, 10_000 if not a.model_dir else None))
      self.batches = carry_lib.host_stream(lambda k: iter(listed[k:]), self.carry, 0)
    self.lags, self.mismatch = [], []
    self.p0 = jax.device_get(self.state["params"])
    self.times, self.rewards, self.prompt_lens, self.completion_lens = [], [], [], []
    self.decode_steps, self.train_lens, self.grad_norms, self.skipped = [], [], [], []
    t0 = time.perf_counter()
    self._one()
    self.compile_s = time.perf_counter() - t0

  def _one(self) -> float:
    return self._step(next(self.batches))

  def _step(self, batch: dict) -> float:
    t0 = time.perf_counter()
    self.state, m = self.step(self.state, batch)
    self.jax.block_until_ready(self.state["params"])
    dt = time.perf_counter() - t0
    self.rewards.append(float(m["train/reward_mean"]))
    self.prompt_lens.append(np.repeat(batch["prompt_mask_NxP"].sum(1), self.a.G))
    self.completion_lens.append(np.asarray(m["samples/mask_NxL"]).sum(1))
    self.decode_steps.append(int(m["train/decode_steps"]))
    self.train_lens.append(int(m["train/train_len"]))
    self.grad_norms.append(float(m["train/grad_norm"]))
    self.skipped.append(int(m["train/skipped_updates"]))
    if "train/version_lag_mean" in m:
      self.lags.append((float(m["train/version_lag_mean"]), int(m["train/version_lag_max"])))
    if "train/mismatch_kl" in m:  # rollout correction on: k3 of the behaviour against the pre-update log-probs
      self.mismatch.append(float(m["train/mismatch_kl"]))
    return dt

  def run(self, k: int) -> list[float]:
    ts = [self._one() for _ in range(k)]
    self.times += ts
    return ts

  def finish(self) -> dict:
    jax = self.jax
    p1 = jax.device_get(self.state["params"])
    self.zero_gradient = False
    if all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(self.p0), jax.tree.leaves(p1))):
      # On a checkpoint every group may get equal rewards (a small model rarely writes the right sum): zero
      # advantages and, with the policy still equal to the reference, zero gradient, so AdamW moves nothing although
      # the update ran (TRL logs loss 0, grad_norm 0 then). Accept that only with every update applied.
      self.zero_gradient = bool(self.a.model_dir) and max(self.skipped) == 0 and max(self.grad_norms) == 0.0
      if not self.zero_gradient:
        raise SystemExit("benchmark error: params did not change; the update must never be skipped.")
    compiles = self.step.traces()
    if compiles != 1:
      raise SystemExit(f"benchmark error: the step was traced {compiles} times; it must compile once.")
    return dict(compile_s=self.compile_s, times=self.times, median=statistics.median(self.times),
                nparams=sum(x.size for x in jax.tree.leaves(p1)), reward=float(np.mean(self.rewards)),
                recompiles=compiles - 1, prompt_lens=np.concatenate(self.prompt_lens[1:]),
                completion_lens=np.concatenate(self.completion_lens[1:]),
                reward_timed=float(np.mean(self.rewards[1:])), decode_steps=self.decode_steps[1:],
                train_lens=self.train_lens[1:], zero_gradient=self.zero_gradient,
                fingerprint=getattr(self, "fingerprint", None))


class EndsEarly(digits.Tokenizer):
  """The workload's tokenizer with an EOS set of a sixth of the vocabulary: a random model (near-uniform next-token
  distribution) ends each row after ~6 tokens; P(a row of 64 passes 64 tokens) ≈ 64·(5/6)^64 < 1e-3. The compute per
  decoded token is the workload's; only where rows stop changes (the mode checks that every row ended by L/4)."""

  def __init__(self, vocab: int):
    super().__init__(vocab)
    self.eos_ids = (digits.EOS,) + tuple(range(vocab - vocab // 6, vocab))


def early_exit_programs(a, tokenizer, train_buckets: int):
  """(step, rollout, state): the jitted GRPO step with rl.train_buckets and the early-exit decode, its sampling
  alone as a separate program, and a fresh state."""
  import jax
  from grpo_jax.model import model as model_lib
  from grpo_jax.rl import families
  from grpo_jax.rl import rl_step
  from grpo_jax.rl import rollout as rollout_lib
  from grpo_jax.rollout import sampling
  from grpo_jax.infra import sharding
  c = bench_config(a)
  c.rl.train_buckets = train_buckets
  c.sampling.exit_chunk = a.exit_chunk
  c.sampling.engine, c.rl.packing = "static", "off"  # the padded early-exit path this mode measures
  mesh = sharding.make_mesh(c.mesh, jax.devices()[:1])
  mcfg = model_lib.ModelConfig.from_config(c.model)
  step = families.make_step(c, mesh, mcfg, digits.reward_spec(a.vocab), tokenizer)
  scfg = sampling.SamplingConfig.from_config(c.sampling, eos_id=getattr(tokenizer, "eos_ids", tokenizer.eos_id),
                                             pad_id=tokenizer.pad_id)
  jitted = jax.jit(lambda params, b, rng: sampling.sample(mcfg, params, b["prompt_NxP"], b["prompt_mask_NxP"], rng,
                                                          scfg))

  def rollout(params, batch, rng):
    with sharding.mesh_context(mesh):
      return jitted(params, rollout_lib.tile_batch(batch, a.G), rng)
  return step, rollout, rl_step.init(c, mesh, mcfg, seed=0)


def early_exit_bench(a, reps: int) -> tuple[list[str], dict]:
  """Rollout and update of a batch whose completions all end by L/4 (EndsEarly) against the same step with every
  row running to L (the workload's EOS, which a random model almost never draws), interleaved in one process.
  rollout = the sampling program alone; update = the step's time minus its rollout (reference log-probs,
  advantages, the policy's forward+backward and AdamW). Also the compile time of the step with rl.train_buckets
  lengths against one."""
  import jax
  progs, compile_s = {}, {}
  batches = digits.make_batches(a.prompts, 10_000)
  for name, tok in (("early", EndsEarly(a.vocab)), ("full", digits.Tokenizer(a.vocab))):
    step, rollout, state = early_exit_programs(a, tok, a.train_buckets)
    b = next(batches)
    t0 = time.perf_counter()
    state, m = step(state, b)
    jax.block_until_ready(m)
    compile_s[name] = time.perf_counter() - t0
    jax.block_until_ready(rollout(state["params"], b, jax.random.PRNGKey(0)))
    progs[name] = dict(step=step, rollout=rollout, state=state, roll_t=[], step_t=[], len_max=[], train_len=[],
                       decode_steps=[])
  if a.train_buckets > 1:
    step1, _, state1 = early_exit_programs(a, digits.Tokenizer(a.vocab), 1)
    t0 = time.perf_counter()
    jax.block_until_ready(step1(state1, next(batches)))
    compile_s["one_bucket"] = time.perf_counter() - t0
  for r in range(reps):
    b = next(batches)
    for name, p in progs.items():
      t0 = time.perf_counter()
      ro = p["rollout"](p["state"]["params"], b, jax.random.PRNGKey(r))
      jax.block_until_ready(ro)
      p["roll_t"].append(time.perf_counter() - t0)
      p["decode_steps"].append(int(ro.decode_steps))
      t0 = time.perf_counter()
      p["state"], m = p["step"](p["state"], b)
      jax.block_until_ready(m)
      p["step_t"].append(time.perf_counter() - t0)
      p["len_max"].append(int(m["train/completion_len_max"]))
      p["train_len"].append(int(m["train/train_len"]))
  for name, p in progs.items():
    if p["step"].traces() != 1:
      raise SystemExit(f"benchmark error: the {name} step was traced {p['step'].traces()} times; it must compile once.")
  med = {name: dict(rollout=statistics.median(p["roll_t"]),
                    update=statistics.median(s - r for s, r in zip(p["step_t"], p["roll_t"])),
                    step=statistics.median(p["step_t"])) for name, p in progs.items()}
  e, f = progs["early"], progs["full"]
  ended = max(e["len_max"]) <= a.L // 4
  res = dict(rollout_ratio=med["early"]["rollout"] / med["full"]["rollout"],
             update_ratio=med["early"]["update"] / med["full"]["update"],
             step_ratio=med["early"]["step"] / med["full"]["step"], ended_by_quarter=ended, compile_s=compile_s)
  lines = [f"early exit (exit_chunk {a.exit_chunk}, train_buckets {a.train_buckets}): longest completion per step "
           f"{e['len_max']} (full: {f['len_max']}), decode steps {e['decode_steps']} (full: {f['decode_steps']}), "
           f"train_len {e['train_len']} (full: {f['train_len']})",
           "medians (s): " + "  ".join(f"{n}: rollout {v['rollout']:.4f} update {v['update']:.4f} step {v['step']:.4f}"
                                      for n, v in med.items()),
           "compile+first step (s): " + "  ".join(f"{k} {v:.1f}" for k, v in compile_s.items())]
  if not ended:
    lines.append(f"WARNING: a completion ran past L/4 = {a.L // 4}: the batch is not the one this mode measures")
  return lines, res


def run_peer(python: str, script: str, a, key: str, extra: tuple[str, ...] = ()) -> dict[str, float] | None:
  """The peer's RESULT line as {name: value} (its s/step under `key`), or None if it printed none. The peer runs
  --steps one more than ours times: it leaves its first step (compile / warm-up, batch 0) out of its median as ours
  compiles on batch 0, so every side counts batches 1..steps, the same rows."""
  flags = {k: getattr(a, k) + (k == "steps") for k in FLAGS}
  cmd = [python, os.path.join(PEERS, script)] + [f"--{k}={v}" for k, v in flags.items()] + list(extra)
  if a.model_dir:
    cmd.append(f"--model-dir={a.model_dir}")
  print("+", " ".join(cmd), flush=True)
  out = subprocess.run(cmd, capture_output=True, text=True)
  line = next((ln for ln in out.stdout.splitlines() if ln.startswith(f"RESULT {key}=")), None)
  if line is None:
    print(out.stdout[-2000:], out.stderr[-4000:], file=sys.stderr)
    return None
  if a.model_dir:  # its own summary lines: steps, completion lengths and rewards per step
    print("\n".join(ln for ln in out.stdout.splitlines() if not ln.startswith(("RESULT", "{"))), flush=True)
  return result_values(line)


def result_values(line: str) -> dict[str, float]:
  """The numeric key=value fields of a peer's RESULT line."""
  return {k: float(v) for k, v in re.findall(r"(\w+)=([-0-9.e]+|nan)\b", line)}


def _best_rate(f, flop: float, reps: int) -> float:
  f()
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    f()
    best = min(best, time.perf_counter() - t0)
  return flop / best


def matmul_peaks(m: int, k: int, n: int, reps: int = 7, square: int = 2048) -> dict[str, float]:
  """fp32 matmul FLOP/s measured now: XLA on the model's [m, k] @ [k, n], XLA and numpy (the machine's BLAS) on
  square³. 'peak' is the best of them: the step is judged against the machine, not against XLA's own kernels."""
  import jax
  import jax.numpy as jnp
  out = {}
  for name, (mm, kk, nn) in (("model_shape", (m, k, n)), ("square", (square,) * 3)):
    x = jax.random.normal(jax.random.PRNGKey(0), (mm, kk), jnp.float32)
    w = jax.random.normal(jax.random.PRNGKey(1), (kk, nn), jnp.float32)
    f = jax.jit(lambda x, w: x @ w)
    out[f"xla_{name}"] = _best_rate(lambda: f(x, w).block_until_ready(), 2.0 * mm * kk * nn, reps)
    if name == "square":
      xn, wn = np.asarray(x), np.asarray(w)
      out["numpy_square"] = _best_rate(lambda: xn @ wn, 2.0 * mm * kk * nn, reps)
  out["peak"] = max(out.values())
  return out


def part_times(a, reps: int = 3) -> dict:
  """Median seconds of rollout, reference log-probs and one policy update, each its own jitted program, and the
  parts' own batch: each row's prompt and completion length (the rollout's mask: a row's tokens after its EOS are
  padding, not counted) and the completion tokens drawn. Reference and update run on that rollout's batch, so its
  lengths, not the timed run's, give the FLOPs their times divide."""
  import jax
  from profile_parts import bench_prompts, parts, time_fn  # benchmarks/ is the script's directory
  from grpo_jax.infra import sharding
  mesh, fns = parts(a, attention=a.attention, dtype=a.dtype)
  with sharding.mesh_context(mesh):
    exes = {k: (jax.jit(f).lower(*args).compile(), args) for k, (f, args) in fns.items()}
    ts = {k: [] for k in exes}
    for _ in range(reps):
      for k, (exe, args) in exes.items():
        ts[k].append(time_fn(exe, args, 1))
    exe, args = exes["rollout"]
    completion_lens_N = np.asarray(exe(*args).mask_NxL).sum(1)  # the same rng every call: the timed rollout's
  prompt_lens_N = np.asarray(bench_prompts(a)[1]).sum(1)
  return {**{k: statistics.median(v) for k, v in ts.items()}, "rollout_tokens": int(completion_lens_N.sum()),
          "prompt_lens_N": prompt_lens_N, "completion_lens_N": completion_lens_N}


def perf_report(a, ours: dict) -> list[str]:
  """FLOP/s over the step and the update against a same-run matmul peak; decode tokens/s; MFU on accelerators."""
  import jax
  from grpo_jax.perf import flops
  mcfg = ours["mcfg"]
  n_steps = len(ours["times"])
  fl = flops.step_flops(mcfg, ours["prompt_lens"], ours["completion_lens"], ours["old_logprobs"])
  fl = {k: v / n_steps for k, v in fl.items()}  # per step
  pt = part_times(a)
  n, L = a.prompts * a.G, a.L
  pk_all = matmul_peaks(n * (L + 10), a.hidden, max(a.inter, a.hidden))
  peak = pk_all["peak"]
  step_fps = fl["step"] / ours["median"]
  # the parts' update and reference run on the parts' rollout, not on the timed run's batches: their FLOPs
  fl_parts = flops.step_flops(mcfg, pt["prompt_lens_N"], pt["completion_lens_N"])
  upd_fps = fl_parts["update"] / (pt["update"] + pt["reference"])
  lines = [f"flops/step {fl['step'] / 1e9:.2f} GFLOP (update {fl['update'] / 1e9:.2f})  "
           f"matmul_peak {peak / 1e9:.1f} GFLOP/s = best fp32 of: numpy 2048^3 {pk_all['numpy_square'] / 1e9:.1f}, "
           f"XLA 2048^3 {pk_all['xla_square'] / 1e9:.1f}, XLA model-shaped [{n * (L + 10)},{a.hidden}]x"
           f"[{a.hidden},{max(a.inter, a.hidden)}] {pk_all['xla_model_shape'] / 1e9:.1f}",
           f"parts (separate programs of the reference path: static engine, padded passes; s): rollout "
           f"{pt['rollout']:.4f} reference {pt['reference']:.4f} update {pt['update']:.4f} "
           f"(their batch's update {fl_parts['update'] / 1e9:.2f} GFLOP)",
           f"step {step_fps / 1e9:.1f} GFLOP/s = {step_fps / ours['step_devices'] / peak:.0%} of peak; "
           f"update {upd_fps / 1e9:.1f} GFLOP/s = {upd_fps / peak:.0%} of peak; "
           f"decode {pt['rollout_tokens'] / pt['rollout']:.0f} tokens/s ({pt['rollout_tokens']} drawn of {n * L})"]
  line = accelerator_line(mcfg, a.dtype, jax.devices()[0].device_kind, n, digits.BENCH_PROMPT_LEN, L,
                          step_fps, ours["step_devices"], upd_fps, pt["rollout"])
  if line is not None:
    lines.append(line)
  ours.update(step_fps=step_fps, update_fps=upd_fps, peak=peak, parts=pt)
  return lines


def accelerator_line(mcfg, dtype: str, device_kind: str, n: int, prompt_len: int, L: int, step_fps: float,
                     step_devices: int, upd_fps: float, rollout_s: float) -> str | None:
  """MFU per device against `flops.PEAKS[device_kind]` at the compute dtype, of the step (its FLOP/s spread over the
  `step_devices` its mesh spans) and of the update (one device), and the decode's HBM bandwidth as a fraction of the
  device's (`flops.decode_bytes` at the compute dtype: the decode loop reads weights and KV cache cast to it,
  model/decode.py); None where PEAKS has no row (a CPU)."""
  from grpo_jax.perf import flops
  pk = flops.device_peak(device_kind)
  if pk is None:
    return None
  dt_peak = pk["bf16" if dtype == "bfloat16" else "fp32"]
  nbytes = 2 if dtype == "bfloat16" else 4
  dec = flops.decode_bytes(mcfg, n, prompt_len, L - 1, param_bytes=nbytes, cache_bytes=nbytes)
  return (f"{device_kind}: MFU step {step_fps / step_devices / dt_peak:.1%} update {upd_fps / dt_peak:.1%} "
          f"({dtype} peak {dt_peak / 1e12:.0f} TFLOP/s); decode HBM {dec / rollout_s / 1e9:.0f} GB/s "
          f"= {dec / rollout_s / pk['hbm']:.1%} of {pk['hbm'] / 1e12:.2f} TB/s")


def fit_scaling(xs, ts, degree: int) -> np.ndarray:
  """Least-squares polynomial coefficients, lowest order first (a, b[, c])."""
  return np.polynomial.polynomial.polyfit(np.asarray(xs, float), np.asarray(ts, float), degree)


def scaling(a, out_png: str) -> list[str]:
  """Step time against G (expect linear) and against L (fit a + bL + cL²), one compile per point."""
  import copy
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  Gs = sorted({max(2, a.G // 4), max(2, a.G // 2), a.G})  # GRPO needs G >= 2
  Ls = sorted({max(4, a.L // 8), max(4, a.L // 4), max(4, a.L // 2), a.L})
  res = {}
  for name, vals in (("G", Gs), ("L", Ls)):
    for v in vals:
      b = copy.copy(a)
      setattr(b, name, v)
      o = Ours(b)
      res[name, v] = statistics.median(o.run(3))
      print(f"scaling {name}={v}: {res[name, v]:.4f} s/step", flush=True)
  tg = [res["G", g] for g in Gs]
  tl = [res["L", l] for l in Ls]
  cg, cl = fit_scaling(Gs, tg, 1), fit_scaling(Ls, tl, 2)
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.5))
  ax1.plot(Gs, tg, "o", label="measured")
  gg = np.linspace(0, max(Gs), 50)
  ax1.plot(gg, cg[0] + cg[1] * gg, "-", label=f"{cg[0]:.3f} + {cg[1]:.4f}·G")
  ax1.set(xlabel=f"G (prompts={a.prompts}, L={a.L})", ylabel="s / step", title="step time vs G")
  ax2.plot(Ls, tl, "o", label="measured")
  ll = np.linspace(0, max(Ls), 50)
  ax2.plot(ll, cl[0] + cl[1] * ll + cl[2] * ll ** 2, "-", label=f"{cl[0]:.3f} + {cl[1]:.2e}·L + {cl[2]:.2e}·L²")
  ax2.set(xlabel=f"L (prompts={a.prompts}, G={a.G})", title="step time vs L")
  for ax in (ax1, ax2):
    ax.legend(fontsize=8)
    ax.set_ylim(bottom=0)
  fig.suptitle(f"grpo_jax one-graph GRPO step, hidden={a.hidden} layers={a.layers} vocab={a.vocab} ({a.dtype})",
               fontsize=9)
  fig.tight_layout()
  fig.savefig(out_png, dpi=110)
  return [f"scaling G {Gs} -> {[round(t, 4) for t in tg]} s: fit {cg[0]:.4f} + {cg[1]:.5f}·G",
          f"scaling L {Ls} -> {[round(t, 4) for t in tl]} s: fit {cl[0]:.4f} + {cl[1]:.3e}·L + {cl[2]:.3e}·L²",
          f"wrote {out_png}"]


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  for k, v in FLAGS.items():
    ap.add_argument(f"--{k}", type=int, default=None if k in SHAPE else v)
  ap.add_argument("--model-dir", default="", metavar="DIR",
                  help="realistic lengths: every side loads this checkpoint of make_stop_checkpoint.py (shape flags "
                       "from its config.json); ours with early exit (--exit-chunk, --train-buckets)")
  ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  ap.add_argument("--remat", default="none", choices=["none", "full", "dots"])
  ap.add_argument("--attention", default="auto", choices=["auto", "xla", "blockwise", "splash", "cudnn", "dot_product"],
                  help="model.attention (grpo_jax/model/attention.py); auto = the einsum path at these lengths on the CPU")
  ap.add_argument("--vs-trl", default="", help="python of a venv with TRL (benchmarks/README.md sets it up)")
  ap.add_argument("--vs-tunix", default="", help="python of a venv with tunix")
  ap.add_argument("--no-perf", action="store_true", help="skip the FLOP/s and part timings")
  ap.add_argument("--scaling", default="", metavar="OUT.png", help="also time the step against G and L")
  ap.add_argument("--early-exit", action="store_true",
                  help="only the early-exit measurement: rollout and update of a batch that ends by L/4 against the "
                       "same step with every row running to L (prints both ratios)")
  ap.add_argument("--train-buckets", type=int, default=None,
                  help="rl.train_buckets of the --early-exit (default 3) / --model-dir (default: auto) step")
  ap.add_argument("--exit-chunk", type=int, default=None,
                  help="sampling.exit_chunk of the --early-exit (default 16) / --model-dir (default: auto) step")
  import tail_bench  # benchmarks/ (the script's directory); it imports this module
  tail_bench.add_flags(ap)
  a = ap.parse_args()
  check_flags(a)
  if a.early_exit:
    a.train_buckets = 3 if a.train_buckets is None else a.train_buckets
    a.exit_chunk = 16 if a.exit_chunk is None else a.exit_chunk
  shape_from_checkpoint(a)
  if a.workload == "tail":
    return tail_bench.main(a)
  if a.model_dir and (a.early_exit or a.scaling):
    raise SystemExit("--model-dir times the step on the checkpoint; run --early-exit / --scaling without it.")
  # Outside the tail workload there is one run of ours: --engine / --packing take one value each, and with
  # --config-override they set the config of that run (e.g. the no-slowdown check: --engine continuous at bench-tiny).
  (label, a.overrides), *more = tail_bench.variants(a)
  if more:
    raise SystemExit("--engine / --packing take one value each outside --workload tail (one run of ours); "
                     "give e.g. --engine continuous.")
  if a.overrides and not a.no_perf:
    print(f"overrides {a.overrides}: the FLOP/s part programs (profile_parts.py) build the default config; skipped")
    a.no_perf = True
  print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start", flush=True)
  if a.early_exit:
    lines, res = early_exit_bench(a, max(3, a.steps))
    for line in lines:
      print(line)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at end")
    print(f"RESULT early_exit rollout_ratio={res['rollout_ratio']:.3f} update_ratio={res['update_ratio']:.3f} "
          f"step_ratio={res['step_ratio']:.3f} ended_by_quarter={int(res['ended_by_quarter'])} L={a.L} "
          f"completions={a.prompts * a.G}")
    return
  o = Ours(a)
  first = o.run(max(1, a.steps // 2))
  peers = {}
  for flag, script, key, name in ((a.vs_trl, "trl_grpo_bench.py", "trl_s_per_step", "trl"),
                                  (a.vs_tunix, "tunix_grpo_bench.py", "tunix_s_per_step", "tunix")):
    if flag:
      peers[name] = run_peer(flag, script, a, key)
  second = o.run(max(1, a.steps - len(first)))
  ours = o.finish()
  ours["mcfg"], ours["step_devices"] = o.mcfg, o.mesh.devices.size
  from grpo_jax.rl import correction
  ours["old_logprobs"] = correction.needs_proximal(o.config)  # bf16: the step's extra forward for π_old
  print(f"grpo_jax params {ours['nparams']} compile+first step {ours['compile_s']:.2f}s steps "
        f"{[round(t, 4) for t in first]} | peers | {[round(t, 4) for t in second]} reward_mean {ours['reward']:.3f} "
        f"recompiles_after_first_step={ours['recompiles']}")
  if a.model_dir:
    # perf_report's part programs are a random model decoding to L: not this workload.
    from grpo_jax.rl import rollout as rollout_lib
    lens = ours["completion_lens"].reshape(len(ours["times"]), -1)
    oc = o.config
    print(f"grpo_jax on {a.model_dir}: exit_chunk {oc.sampling.exit_chunk}, train lengths "
          f"{rollout_lib.train_lengths(oc)} (train_buckets {oc.rl.train_buckets}); per timed step: mean "
          f"completion len {[round(float(x), 2) for x in lens.mean(1)]} longest {lens.max(1).tolist()} decode steps "
          f"{ours['decode_steps']} of {a.L - 1} trained on {ours['train_lens']} of {a.L} tokens")
    summary = [f"grpo_jax {ours['completion_lens'].mean():.2f} (reward {ours['reward_timed']:.3f})"]
    summary += [f"{n} {p[n + '_completion_len']:.2f} (reward {p[n + '_reward']:.3f})" for n, p in peers.items()
                if p is not None and n + "_completion_len" in p]
    print("mean completion length over the timed steps, tokens incl. EOS: " + ", ".join(summary))
    fps = {"grpo_jax": ours["fingerprint"]}
    fps.update({n: p.get(n + "_fingerprint") for n, p in peers.items() if p is not None})
    same = all(v is not None and abs(v - ours["fingerprint"]) <= 1e-4 for v in fps.values())
    print(f"same weights and tokenizer: {'yes' if same else 'NO'} (peers/stop_prompts.fingerprint of each side's "
          "logits after its CHECK_PROMPT, tolerance 1e-4: " + ", ".join(
              f"{n} {v:.6f}" if v is not None else f"{n} missing" for n, v in fps.items()) + ")")
    if ours["zero_gradient"]:
      print("note: every group's rewards were equal in every step (zero advantages): the updates ran, with zero "
            "gradient, so the params did not move")
  elif not a.no_perf:
    for line in perf_report(a, ours):
      print(line)
  if a.scaling:
    for line in scaling(a, a.scaling):
      print(line)
  line = (f"RESULT s_per_step={ours['median']:.4f} compile_s={ours['compile_s']:.2f} completions={a.prompts * a.G} "
          f"L={a.L} recompiles={ours['recompiles']} ours={label.replace(',', '+')} "
          f"engine={o.config.sampling.engine} packing={o.config.rl.packing}")
  if a.model_dir:
    line += (f" completion_len={ours['completion_lens'].mean():.2f} exit_chunk={o.config.sampling.exit_chunk} "
             f"train_buckets={o.config.rl.train_buckets} same_weights={int(same)}")
  elif not a.no_perf:
    line += (f" step_gflops={ours['step_fps'] / 1e9:.1f} update_gflops={ours['update_fps'] / 1e9:.1f} "
             f"matmul_peak_gflops={ours['peak'] / 1e9:.1f} decode_tok_s={ours['parts']['rollout_tokens'] / ours['parts']['rollout']:.0f}")
  for name, peer in peers.items():
    if peer is not None:
      t = peer[f"{name}_s_per_step"]
      line += f" {name}_s_per_step={t:.4f} speedup_vs_{name}={t / ours['median']:.2f}"
      if a.model_dir:
        line += f" {name}_completion_len={peer.get(name + '_completion_len', float('nan')):.2f}"
  print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at end")
  print(line)


if __name__ == "__main__":
  main()
