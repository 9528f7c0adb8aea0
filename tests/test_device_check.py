"""benchmarks/device_check.sh's CPU-only parts (`--cpu`): every stage runs (the GPU-path tests collected, the main
job's path for one step of a tiny model, the benchmark for two) and the summary names each stage and the figures.
With a stand-in interpreter (PYTHON=<a script that records its arguments>, no JAX): a failing stage fails the check
and the others still run, a relative --out, the --fetch and --wheels paths' commands, and the argument errors."""
import os
import subprocess
import sys

import pytest

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
  assert "21 tests collected" in collected and "test_cudnn_equals_einsum_on_gpu" in collected, collected[-2000:]
  figures = [line for line in summary.splitlines() if line.startswith("FIGURE ")]
  assert any(f.startswith("FIGURE main_steps=1 ") for f in figures), summary
  assert any(f.startswith("FIGURE RESULT s_per_step=") and "recompiles=0" in f for f in figures), summary
  assert summary.splitlines()[-1].startswith("DEVICE_CHECK ok mode=cpu total_seconds="), summary


def _stub(tmp_path, fail_on: str = "") -> dict:
  """PYTHON for the script: records each call's arguments in calls.txt; exits 1 where they contain `fail_on`."""
  py = tmp_path / "py"
  py.write_text(f'#!/bin/sh\necho "$*" >> "{tmp_path}/calls.txt"\n'
                + (f'case "$*" in *"{fail_on}"*) exit 1 ;; esac\n' if fail_on else "") + "exit 0\n")
  py.chmod(0o755)
  return dict(os.environ, PYTHON=str(py))


def _calls(tmp_path) -> list[str]:
  return (tmp_path / "calls.txt").read_text().splitlines()


def test_a_failing_stage_fails_the_check_and_the_others_still_run(tmp_path):
  out = subprocess.run(["bash", SCRIPT, "--cpu", "--out", str(tmp_path / "o")], cwd=ROOT, capture_output=True,
                       text=True, timeout=60, env=_stub(tmp_path, fail_on="-m pytest"))
  summary = (tmp_path / "o" / "summary.txt").read_text()
  assert out.returncode == 1, out.stdout + out.stderr
  assert [l.split()[1:3] for l in summary.splitlines() if l.startswith("STAGE ")] == [
      ["env", "ok"], ["tests", "FAIL(rc=1)"], ["main", "ok"], ["bench", "ok"]], summary
  assert summary.splitlines()[-1].startswith("DEVICE_CHECK failed mode=cpu"), summary


def test_a_relative_out_is_the_callers(tmp_path):
  """The stages run from the repository root: a relative --out given from another directory had its summary made
  there and every stage's log redirected to a path under the root that did not exist (each stage failed)."""
  (tmp_path / "cwd").mkdir()
  out = subprocess.run(["bash", SCRIPT, "--cpu", "--out", "rel"], cwd=tmp_path / "cwd", capture_output=True,
                       text=True, timeout=60, env=_stub(tmp_path))
  assert out.returncode == 0, out.stdout + out.stderr
  where = tmp_path / "cwd" / "rel"
  assert sorted(os.listdir(where)) == ["bench.log", "env.log", "main.log", "summary.txt", "tests.log"]
  assert (where / "summary.txt").read_text().splitlines()[-1].startswith("DEVICE_CHECK ok mode=cpu")
  assert any(f"--workdir={where}/main " in c for c in _calls(tmp_path)), _calls(tmp_path)


def test_fetch_downloads_the_missing_wheels_and_runs_no_stage(tmp_path):
  out = subprocess.run(["bash", SCRIPT, "--fetch", str(tmp_path / "wheels")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=_stub(tmp_path))
  assert out.returncode == 0, out.stdout + out.stderr
  calls = _calls(tmp_path)
  downloads = [c for c in calls if c.startswith("-m pip download ")]
  assert len(downloads) == 13 and len(calls) == 14, calls  # the 13 pins of MISSING, then promise built
  assert all(f"--python-version 3.12 " in c and f"-d {tmp_path}/wheels " in c for c in downloads), downloads
  assert downloads[0].endswith(" ml-collections==1.1.0") and calls[-1].endswith(" promise==2.3"), calls
  assert not (tmp_path / "wheels" / "summary.txt").exists()
  bad = subprocess.run(["bash", SCRIPT, "--fetch", str(tmp_path / "w2")], cwd=ROOT, capture_output=True, text=True,
                       timeout=60, env=_stub(tmp_path, fail_on="pip download"))
  assert bad.returncode == 1  # the first failing download stops it


def test_wheels_installs_them_before_the_stages(tmp_path):
  (tmp_path / "wheels").mkdir()
  (tmp_path / "wheels" / "x-1.0-py3-none-any.whl").write_text("")
  out = subprocess.run(["bash", SCRIPT, "--cpu", "--wheels", str(tmp_path / "wheels"), "--out", str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, env=_stub(tmp_path))
  assert out.returncode == 0, out.stdout + out.stderr
  first = _calls(tmp_path)[0]
  assert first.startswith("-m pip install ") and "--no-index --no-deps" in first and first.endswith(
      f"--target /tmp/grpo_jax_site {tmp_path}/wheels/x-1.0-py3-none-any.whl"), first


@pytest.mark.parametrize("args,needle", [
    (["--bogus"], "unknown argument --bogus"),
    (["--out"], "--out needs a directory"),  # was bash's "$2: unbound variable", exit 1
    (["--out", "--cpu"], "--out needs a directory"),  # was a directory named --cpu
    (["--fetch"], "--fetch needs a directory"),
    (["--cpu", "--wheels", "EMPTY"], "no *.whl there; fill it with --fetch"),  # was pip's traceback-like error
    (["--cpu", "--out", "AFILE"], "cannot make that directory (File exists)"),  # was mkdir's line, exit 1
])
def test_argument_errors_are_one_line_and_exit_2_before_any_stage(tmp_path, args, needle):
  (tmp_path / "empty").mkdir()
  (tmp_path / "afile").write_text("")
  args = [{"EMPTY": str(tmp_path / "empty"), "AFILE": str(tmp_path / "afile")}.get(a, a) for a in args]
  out = subprocess.run(["bash", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=_stub(tmp_path))
  assert out.returncode == 2 and needle in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert not (tmp_path / "calls.txt").exists()  # nothing ran
