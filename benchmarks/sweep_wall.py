"""Wall time of an 8-run sweep (2 β × 2 lr × 2 seeds) as ONE vmapped program vs the same 8 runs one by one.

Each variant is a fresh `python -m grpo_jax.sweep` process on a fresh workdir, the same tiny arith config
(configs/grpo_arith.py:small with a 1-layer 32-wide model, no SFT stage, --config.train.steps), interleaved
(vmap, serial, vmap, serial, ...) so that a shared machine's load hits both alike:
  --mode=vmap    the 8 runs in one jit(vmap(step)) (one compile), evaluation per run;
  --mode=serial  `main`'s path (jobs.run) 8 times in one process: 8 step compiles (no process start-up per run,
                 which 8 separate `python -m grpo_jax.main` commands would add on top).
Prints each wall time, the medians and their ratio, and the load average before each run.

  nice -n 10 python benchmarks/sweep_wall.py --reps 2 --steps 10
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.model.hidden=32", "--config.model.layers=1", "--config.model.heads=2", "--config.model.kv_heads=1",
        "--config.model.inter=64", "--config.model.max_len=64", "--config.sft.steps=0", "--config.rl.G=4",
        "--config.rl.prompts_per_step=2", "--config.sampling.max_new_tokens=8", "--config.train.plot_every=0",
        "--config.train.sample_every=0", "--config.eval.size=4", "--config.eval.batch=4", "--config.eval.n_samples=2",
        "--config.eval.pass_k=(1,2)", "--config.log.tensorboard=False"]


def one(mode: str, steps: int, workdir: str) -> float:
  argv = [sys.executable, "-m", "grpo_jax.studies.sweep", "--config=configs/grpo_arith.py:small", f"--workdir={workdir}",
          "--sweep=rl.beta=0.02,0.5 optim.lr=1e-2,3e-2", "--seeds=2", f"--mode={mode}", *TINY,
          f"--config.train.steps={steps}", f"--config.train.eval_every={steps}", f"--config.train.ckpt_every={steps}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  t0 = time.perf_counter()
  r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
  dt = time.perf_counter() - t0
  if r.returncode:
    raise SystemExit(f"{mode} failed:\n{r.stderr[-3000:]}")
  return dt


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--steps", type=int, default=10)
  a = ap.parse_args()
  times = {"vmap": [], "serial": []}
  for rep in range(a.reps):
    for mode in ("vmap", "serial"):
      d = tempfile.mkdtemp(prefix=f"sweep_wall_{mode}_")
      load = os.getloadavg()[0]
      dt = one(mode, a.steps, d)
      shutil.rmtree(d, ignore_errors=True)
      times[mode].append(dt)
      print(f"rep {rep} {mode:6s} {dt:7.1f} s  (load average before: {load:.1f})", flush=True)
  mv, ms = statistics.median(times["vmap"]), statistics.median(times["serial"])
  print(f"RESULT 8 runs × {a.steps} steps: vmap median {mv:.1f} s, serial median {ms:.1f} s, serial/vmap {ms / mv:.2f}×")


if __name__ == "__main__":
  main()
