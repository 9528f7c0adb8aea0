"""The long-completion R1-Zero config end to end through the CLI, shrunk (configs/r1_zero.py:long)."""
import json
import math
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_r1_zero_long_runs_through_the_cli(tmp_path):
  """configs/r1_zero.py:long shrunk to 64 new tokens with the blockwise attention `auto` takes at its 2048 forced
  (at T = 112 `auto` would take the einsum path), 1 pre-training and 2 R1-Zero steps: both stages finish, and the
  RL steps decode in 2 row chunks and train on what they decoded."""
  wd = str(tmp_path / "r1")
  over = {"sampling.max_new_tokens": 64, "model.max_len": 112, "model.attention": "blockwise",
          "r1.pretrain.steps": 1, "r1.zero.steps": 2, "train.ckpt_every": 2,
          "log.plots": False}
  cmd = ([sys.executable, "-m", "grpo_jax.main", "--config=configs/r1_zero.py:long", f"--workdir={wd}"]
         + [f"--config.{k}={v}" for k, v in over.items()])
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-3000:]
  for stage in ("base", "r1_zero"):
    assert json.load(open(os.path.join(wd, stage, "stage.json")))["done"], stage
  rows = [json.loads(line) for line in open(os.path.join(wd, "r1_zero", "metrics.jsonl"))]
  steps = [r for r in rows if "train/loss" in r]
  assert [r["step"] for r in steps] == [1, 2]
  assert all(0 < r["train/completion_len_max"] <= 64 and math.isfinite(r["train/loss"]) for r in steps)
  cfg = json.load(open(os.path.join(wd, "config.json")))  # the resolved config of the command
  assert cfg["rl"]["rollout_chunks"] == 2 and cfg["sampling"]["max_new_tokens"] == 64
  assert cfg["model"]["attention"] == "blockwise"
  assert os.path.exists(os.path.join(wd, "report.md"))
