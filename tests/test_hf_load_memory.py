"""Loading a Qwen2.5-0.5B-shaped checkpoint (random bf16 safetensors written with numpy) onto the CPU backend in a
fresh process: peak RSS minus the RSS after the imports stays within the float32 param bytes + 2 x the largest
stacked (per-layer) leaf (VmHWM of /proc/self/status; benchmarks/hf_load_memory.py says why not ru_maxrss).
Memory, not speed: the loader streams leaf by leaf (the previous one held every tensor as float32 and then stacked
copies: 2.5x the float32 bytes)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import hf_load_memory  # noqa: E402


def test_peak_host_memory_of_a_qwen25_05b_load_is_within_the_bound(tmp_path):
  hf_load_memory.make_checkpoint(str(tmp_path), "qwen2.5-0.5b")
  r = hf_load_memory.measure(str(tmp_path))
  assert r["fp32"] == 494_032_768 * 4  # Qwen2.5-0.5B's parameter count (tied embeddings)
  assert r["largest"] == 151_936 * 896 * 4  # the embedding, which the staging buffer is sized for
  assert r["largest_stacked"] == 24 * 896 * 4864 * 4  # one MLP kernel over the 24 layers
  assert r["extra"] <= r["bound"], (f"{r['extra'] / 2**30:.2f} GiB over imports; bound {r['bound'] / 2**30:.2f} GiB "
                                    f"(fp32 {r['fp32'] / 2**30:.2f} GiB)")
