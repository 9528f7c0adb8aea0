"""XLA:CPU compiled bytes of one RL step: LoRA against full fine-tuning, same model, same workload (GRPO preset, β =
0.04: the full step holds a reference copy and Adam moments of every weight; the LoRA step the frozen base once and
the adapters with their moments).

  python benchmarks/lora_memory.py --model=small --rank 8 [--prompts 8 --G 4 --prompt-len 32 --L 64]

Compiles both steps for this machine's CPU (one device) on abstract inputs (nothing is allocated or run) and prints
memory_analysis() of each and the ratio; ends with one `RESULT` line.
"""
import argparse
import json
import sys

import jax

from grpo_jax.perf import aot
from grpo_jax.rl import memory_plan


def measure(model: str, rank: int, prompts: int, G: int, prompt_len: int, L: int) -> dict:
  out = {}
  for name, r in (("full", 0), ("lora", rank)):
    cfg = memory_plan.workload_config(model, prompts, G, prompt_len, L, dict(data=1, fsdp=1, tensor=1),
                                      dtype="float32", remat="none", lora_rank=r)
    compiled, seconds = aot.compile_step(cfg, jax.devices("cpu")[:1], dict(data=1, fsdp=1, tensor=1))
    out[name] = dict(aot.memory_report(compiled, None), compile_seconds=seconds)
  out["argument_ratio"] = out["lora"]["argument_bytes"] / out["full"]["argument_bytes"]
  out["total_ratio"] = out["lora"]["total_bytes"] / out["full"]["total_bytes"]
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", default="small", choices=sorted(memory_plan.PRESETS))
  ap.add_argument("--rank", type=int, default=8)
  ap.add_argument("--prompts", type=int, default=8)
  ap.add_argument("--G", type=int, default=4)
  ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--L", type=int, default=64)
  a = ap.parse_args(argv)
  r = measure(a.model, a.rank, a.prompts, a.G, a.prompt_len, a.L)
  mib = lambda b: f"{b / 2**20:.2f} MiB"
  for name in ("full", "lora"):
    m = r[name]
    print(f"{name:>4}: arguments {mib(m['argument_bytes'])}, temp {mib(m['temp_bytes'])}, total "
          f"{mib(m['total_bytes'])} (compiled in {m['compile_seconds']:.1f} s)")
  print(json.dumps(r))
  print(f"RESULT model={a.model} rank={a.rank} argument_ratio={r['argument_ratio']:.3f} "
        f"total_ratio={r['total_ratio']:.3f}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
