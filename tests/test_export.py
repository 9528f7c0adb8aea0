"""grpo_jax.hf.export error paths (the round trips run in tests/test_hf_cli_*.py): one line, exit 2, nothing written."""
import json
import os
import subprocess
import sys

import pytest

from grpo_jax.config import config_lib


from grpo_jax.hf import export
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run_dir(tmp_path, steps=()):
  run = tmp_path / "run"
  (run / "checkpoints").mkdir(parents=True)
  for s in steps:
    (run / "checkpoints" / str(s)).mkdir()
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  (run / "config.json").write_text(c.to_json_best_effort())
  return str(run)


def test_export_refuses_what_it_cannot_export(tmp_path):
  with pytest.raises(config_lib.ConfigError, match="config.json is missing; export reads a finished run"):
    export.export(str(tmp_path / "none"), str(tmp_path / "out"))
  run = _run_dir(tmp_path)
  with pytest.raises(config_lib.ConfigError, match="has no checkpoints/ and no params/; nothing to export"):
    export.export(run, str(tmp_path / "out"))
  run = _run_dir(tmp_path / "b", steps=(5,))
  with pytest.raises(config_lib.ConfigError, match=r"export.step=3 is not a checkpoint in .*steps \[5\]"):
    export.export(run, str(tmp_path / "out"), step=3)
  with pytest.raises(config_lib.ConfigError, match="is the run directory"):
    export.export(run, run)
  with pytest.raises(config_lib.ConfigError, match="model_type='qwen2' needs q/k/v biases"):
    c = json.loads(open(os.path.join(run, "config.json")).read())
    c["model"]["qkv_bias"] = False
    open(os.path.join(run, "config.json"), "w").write(json.dumps(c))
    export.export(run, str(tmp_path / "out"), model_type="qwen2")
  assert not os.path.exists(tmp_path / "out")
  c = config_lib.base_config()
  with pytest.raises(config_lib.ConfigError, match="config.export.out_dir: is empty"):
    export.run_job(c, run)


def test_cli_prints_one_line_and_exits_2(tmp_path):
  r = subprocess.run([sys.executable, "-m", "grpo_jax.hf.export", str(tmp_path / "none"), str(tmp_path / "out")],
                     capture_output=True, text=True, cwd=REPO, timeout=120,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
  assert r.stderr.startswith("Error: ") and "config.json is missing" in r.stderr
