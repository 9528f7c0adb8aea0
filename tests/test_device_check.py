"""benchmarks/device_check.sh's CPU-only parts (`--cpu`): every stage runs (the GPU-path tests collected, the main
job's path for one step of a tiny model, the benchmark for two), the summary names each stage and the figures, and a
test the script names that does not exist fails its stage."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "device_check.sh")


def test_cpu_mode_runs_every_stage_and_writes_the_summary(tmp_path):
  out = subprocess.run(["bash", SCRIPT, "--cpu", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHON=sys.executable))
  summary = (tmp_path / "summary.txt").read_text()
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
  stages = [line.split()[1:3] for line in summary.splitlines() if line.startswith("STAGE ")]
  assert stages == [["env", "ok"], ["tests", "ok"], ["main", "ok"], ["bench", "ok"]], summary
  collected = (tmp_path / "tests.log").read_text()
  assert "19 tests collected" in collected and "test_cudnn_equals_einsum_on_gpu" in collected, collected[-2000:]
  figures = [line for line in summary.splitlines() if line.startswith("FIGURE ")]
  assert any(f.startswith("FIGURE main_steps=1 ") for f in figures), summary
  assert any(f.startswith("FIGURE RESULT s_per_step=") and "recompiles=0" in f for f in figures), summary
  assert summary.splitlines()[-1].startswith("DEVICE_CHECK ok mode=cpu total_seconds="), summary


def test_a_failing_stage_fails_the_check(tmp_path):
  """A stage that fails (here: an unknown argument is refused before any stage) gives a non-zero status."""
  out = subprocess.run(["bash", SCRIPT, "--bogus"], cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert out.returncode == 2 and "unknown argument --bogus" in out.stderr
