"""Host memory of loading a Hugging Face checkpoint: peak RSS of a fresh process minus its RSS after the imports.

  python benchmarks/hf_load_memory.py [--model qwen2.5-0.5b] [--layers N] [--dir DIR]

Builds a random checkpoint of the preset's shape (bf16 safetensors, written with numpy: no download) unless DIR
already holds one, then loads it onto the CPU backend in a fresh subprocess and prints one line
`RESULT model=... extra_bytes=... fp32_param_bytes=... largest_stacked_bytes=... bound=... ratio=...`, where bound =
fp32 param bytes + 2 x the largest stacked (per-layer) leaf and ratio = extra / fp32 bytes. Counter: VmHWM of /proc/self/status (the
process's peak resident set) at the end, minus its VmRSS after the imports. Not ru_maxrss: Linux carries the
high-water mark of the forked parent's image across exec, so ru_maxrss reports at least the parent's RSS at fork
(inside a test worker of several GB, that was what the test measured).
Figures: docs/hf.md.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from grpo_jax.hf import hf_io  # noqa: E402

from grpo_jax.model import model as model_lib

from grpo_jax.model import model_presets

from grpo_jax.hf import safetensors_io


def _madvise_hugepage(enabled: bool) -> bool:
  """Sets whether numpy advises huge pages for its large allocations (MADV_HUGEPAGE); returns the previous setting.
  Where the kernel compacts memory for madvised huge pages (transparent_hugepage/defrag = madvise), faulting in the
  load's 2 GB cost 9-13 s of system time per load on the 2-core test machine, 0.9 s without the advice (2026-12-06);
  the peak RSS measured the same (VmHWM 2,112,128 vs 2,112,100 kB)."""
  multiarray = (getattr(np, "_core", None) or np.core).multiarray
  previous = multiarray._get_madvise_hugepage()
  multiarray._set_madvise_hugepage(enabled)
  return previous


def make_checkpoint(path: str, preset: str, layers: int | None = None, seed: int = 0) -> model_lib.ModelConfig:
  previous = _madvise_hugepage(False)  # the per-tensor temporaries below: see _madvise_hugepage
  try:
    return _make_checkpoint(path, preset, layers, seed)
  finally:
    _madvise_hugepage(previous)


def _make_checkpoint(path: str, preset: str, layers: int | None, seed: int) -> model_lib.ModelConfig:
  fields = dict(model_presets.PRESETS[preset])
  if layers:
    fields["layers"] = layers
  mcfg = model_lib.ModelConfig(**fields)
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({**hf_io.hf_config(mcfg, "qwen2" if mcfg.qkv_bias else "llama"), "torch_dtype": "bfloat16"}, f)
  shapes = hf_io.expected_tensors(mcfg)
  # One random block of 2^20 values, repeated to fill each tensor: the load's memory does not depend on the values,
  # and drawing all 494M of Qwen2.5-0.5B's took 6 of the test's 17 s (writing: 9.0 -> 3.0 s).
  # The block is cast to bf16 once (np.resize repeats it element by element: the same values as casting each
  # float32 tensor, without a float32 temporary and a cast per tensor).
  bf16 = safetensors_io.DTYPES["BF16"]
  block = (0.02 * np.random.default_rng(seed).standard_normal(1 << 20, dtype=np.float32)).astype(bf16)
  safetensors_io.write(os.path.join(path, "model.safetensors"), [(n, s, bf16) for n, s in sorted(shapes.items())],
                       lambda n: np.resize(block, shapes[n]), {"format": "pt"})
  return mcfg


_CHILD = r"""
import json, sys
def status(field):
  for line in open("/proc/self/status"):
    if line.startswith(field + ":"):
      return int(line.split()[1]) * 1024
import jax, numpy as np
(getattr(np, "_core", None) or np.core).multiarray._set_madvise_hugepage(False)  # see _madvise_hugepage
from grpo_jax.hf import hf_io
after_imports = status("VmRSS")
mcfg, params = hf_io.load_hf(sys.argv[1])
jax.block_until_ready(params)
leaves = jax.tree.leaves(params)
peak = status("VmHWM")
print(json.dumps({"after_imports": after_imports, "peak": peak, "fp32": int(sum(x.size * 4 for x in leaves)),
                  "largest": int(max(x.size * 4 for x in leaves)),
                  "largest_stacked": int(max(x.size * 4 for x in jax.tree.leaves(params["layers"])))}))
"""


def measure(path: str) -> dict:
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True, text=True, env=env,
                       check=False)
  if out.returncode:
    raise RuntimeError(out.stderr[-3000:])
  r = json.loads(out.stdout.strip().splitlines()[-1])
  r["extra"] = r["peak"] - r["after_imports"]
  r["bound"] = r["fp32"] + 2 * r["largest_stacked"]
  return r


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(model_presets.PRESETS))
  ap.add_argument("--layers", type=int, default=0, help="fewer layers than the preset (0 = the preset's)")
  ap.add_argument("--dir", default="")
  a = ap.parse_args()
  path = a.dir or tempfile.mkdtemp(prefix="hf_load_memory_")
  if not os.path.exists(os.path.join(path, "model.safetensors")):
    make_checkpoint(path, a.model, a.layers or None)
  r = measure(path)
  print(f"RESULT model={a.model} layers={a.layers or 'preset'} extra_bytes={r['extra']} "
        f"fp32_param_bytes={r['fp32']} largest_stacked_bytes={r['largest_stacked']} bound={r['bound']} "
        f"ratio={r['extra'] / r['fp32']:.2f} within_bound={r['extra'] <= r['bound']}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
