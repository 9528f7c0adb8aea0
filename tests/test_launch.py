"""The launchers: every dry run prints the commands it would run; the local launcher runs a real 2-process job."""
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import local_multiprocess  # noqa: E402

# Two processes × 2 simulated CPU devices; each process contributes (process_id + 1) per device, so the psum over
# all 4 devices is 2·1 + 2·2 = 6 on both processes. Gloo carries the cross-process part.
PSUM_SCRIPT = textwrap.dedent("""
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from grpo_jax.infra import multihost
    assert multihost.maybe_initialize(), "GRPO_JAX_DISTRIBUTED was not set by the launcher"
    pid, n = jax.process_index(), jax.process_count()
    mesh = Mesh(np.array(jax.devices()), ("p",))
    local = np.full((jax.local_device_count(),), pid + 1, np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")), local)
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "p"), mesh=mesh, in_specs=P("p"), out_specs=P()))
    total = float(np.asarray(f(x).addressable_data(0))[0])
    print(f"RESULT process={pid} of {n} devices={jax.device_count()} psum={total}", flush=True)
""")


def _bash(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", os.path.join(REPO, "launch", script), *args], capture_output=True, text=True,
                        timeout=30)


def _commands(stdout: str) -> list[str]:
  return [l[2:] for l in stdout.splitlines() if l.startswith("+ ")]


def test_local_multiprocess_psum_across_two_processes(tmp_path):
  script = tmp_path / "psum_check.py"
  script.write_text(PSUM_SCRIPT)
  out = io.StringIO()
  rc = local_multiprocess.launch(2, script=str(script), devices_per_process=2, timeout_s=120,
                                 python=sys.executable, out=out)
  text = out.getvalue()
  assert rc == 0, text
  for pid in (0, 1):
    assert f"[p{pid}] RESULT process={pid} of 2 devices=4 psum=6.0" in text, text
    assert f"[launch] p{pid} exited with 0" in text


def test_local_multiprocess_reports_a_failing_process(tmp_path):
  # Process 1 fails at once; process 0 would wait forever, so the launcher must stop it and return 1's code.
  script = tmp_path / "fail.py"
  script.write_text("import os, sys, time\n"
                    "if os.environ['GRPO_JAX_PROCESS_ID'] == '1':\n  print('bad', flush=True); sys.exit(3)\n"
                    "time.sleep(60)\n")
  out = io.StringIO()
  rc = local_multiprocess.launch(2, script=str(script), grace_s=0.5, timeout_s=30, out=out)
  text = out.getvalue()
  assert rc == 3, text
  assert "[p1] bad" in text
  assert "stopping the remaining processes (a process failed)" in text


def test_local_multiprocess_returns_the_first_failing_code_in_time(tmp_path):
  """launch/README.md: the exit code is the first failing child's; it was the lowest index's (p0's later 5 here)."""
  script = tmp_path / "fail2.py"
  script.write_text("import os, sys, time\n"
                    "if os.environ['GRPO_JAX_PROCESS_ID'] == '0':\n  time.sleep(1.5); sys.exit(5)\n"
                    "sys.exit(3)\n")
  out = io.StringIO()
  assert local_multiprocess.launch(2, script=str(script), grace_s=10, timeout_s=30, out=out) == 3, out.getvalue()


def test_local_multiprocess_dry_run_prints_env_and_argv(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)  # the launcher appends to the caller's flags
  monkeypatch.setenv("PYTHONPATH", "")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # no GPU slices, whatever this machine has
  out = io.StringIO()
  rc = local_multiprocess.launch(3, module="grpo_jax.main", args=["--config=configs/x.py", "--workdir=/tmp/w"],
                                 port=4321, devices_per_process=4, python="py", dry_run=True, out=out)
  lines = out.getvalue().splitlines()
  assert rc == 0 and len(lines) == 5 and lines[0].startswith("# ") and lines[-1] == "wait", lines
  for i, line in enumerate(lines[1:-1]):
    assert line == (f"cd {REPO} && GRPO_JAX_DISTRIBUTED=1 GRPO_JAX_COORDINATOR=127.0.0.1:4321 "
                    f"GRPO_JAX_NUM_PROCESSES=3 GRPO_JAX_PROCESS_ID={i} "
                    f"XLA_FLAGS=--xla_force_host_platform_device_count=4 PYTHONPATH={REPO} "
                    "py -m grpo_jax.main --config=configs/x.py --workdir=/tmp/w &")


# Writes its argv and the launcher's variables to $OUT_DIR/p<GRPO_JAX_PROCESS_ID>.json: what each child was given.
RECORD_SCRIPT = textwrap.dedent("""
    import json, os, sys
    keys = ("GRPO_JAX_DISTRIBUTED", "GRPO_JAX_COORDINATOR", "GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID",
            "XLA_FLAGS", "CUDA_VISIBLE_DEVICES", "JAX_LOCAL_DEVICE_IDS")
    rec = dict(argv=sys.argv[1:], cwd=os.getcwd(), env={k: os.environ.get(k) for k in keys})
    with open(os.path.join(os.environ["OUT_DIR"], f"p{os.environ['GRPO_JAX_PROCESS_ID']}.json"), "w") as f:
      json.dump(rec, f)
""")


def _records(d, n: int) -> list[dict]:
  return [json.loads((d / f"p{i}.json").read_text()) for i in range(n)]


def test_local_multiprocess_dry_run_is_a_script_bash_runs_as_the_launcher_would(monkeypatch, tmp_path):
  """The dry run's output, run by bash, gives each process the argv and variables the launcher gives it: arguments
  with a quote, spaces, a $ and a newline stay one argument each (it printed `+ VAR=... cmd` lines that were not
  a shell command, lacked the repository root and PYTHONPATH, and ran the processes one after the other)."""
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  script = tmp_path / "rec ord.py"
  script.write_text(RECORD_SCRIPT)
  args = ["--config.log.note=it's a b", "$HOME", "two\nlines", "--x=\"q\" `id`;"]
  out = io.StringIO()
  assert local_multiprocess.launch(2, script=str(script), args=args, port=4321, devices_per_process=2,
                                   dry_run=True, out=out) == 0
  sh = tmp_path / "dry.sh"
  sh.write_text(out.getvalue())
  direct, pasted = tmp_path / "direct", tmp_path / "pasted"
  direct.mkdir(), pasted.mkdir()
  r = subprocess.run(["bash", str(sh)], env=dict(os.environ, OUT_DIR=str(pasted)), capture_output=True, text=True,
                     timeout=60)
  assert r.returncode == 0, (r.stdout, r.stderr)
  monkeypatch.setenv("OUT_DIR", str(direct))
  assert local_multiprocess.launch(2, script=str(script), args=args, port=4321, devices_per_process=2,
                                   timeout_s=60, out=io.StringIO()) == 0
  want = [dict(argv=args, cwd=REPO, env=dict(GRPO_JAX_DISTRIBUTED="1", GRPO_JAX_COORDINATOR="127.0.0.1:4321",
                                             GRPO_JAX_NUM_PROCESSES="2", GRPO_JAX_PROCESS_ID=str(i),
                                             XLA_FLAGS="--xla_force_host_platform_device_count=2",
                                             CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                             JAX_LOCAL_DEVICE_IDS=None)) for i in range(2)]
  assert _records(pasted, 2) == want and _records(direct, 2) == want


def _fake_nvidia_smi(tmp_path, gpus: int) -> str:
  """A directory with an `nvidia-smi` whose `-L` lists `gpus` GPUs, as the real one does."""
  d = tmp_path / "bin"
  d.mkdir(exist_ok=True)
  lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i:08d})\\n" for i in range(gpus))
  (d / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{lines}'\n")
  (d / "nvidia-smi").chmod(0o755)
  return str(d)


def test_local_multiprocess_gives_each_process_its_own_gpus(monkeypatch, tmp_path):
  """With GPUs visible each child sees its own slice (CUDA_VISIBLE_DEVICES, JAX_LOCAL_DEVICE_IDS numbered within
  it): every child was given every GPU, so each process of the job claimed all of them."""
  script = tmp_path / "record.py"
  script.write_text(RECORD_SCRIPT)
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, 4) + os.pathsep + os.environ["PATH"])
  monkeypatch.setenv("OUT_DIR", str(tmp_path))
  assert local_multiprocess.launch(2, script=str(script), timeout_s=60, out=io.StringIO()) == 0
  got = [(r["env"]["CUDA_VISIBLE_DEVICES"], r["env"]["JAX_LOCAL_DEVICE_IDS"]) for r in _records(tmp_path, 2)]
  assert got == [("0,1", "0,1"), ("2,3", "0,1")], got
  # the caller's CUDA_VISIBLE_DEVICES is the pool, shared out in its order; --gpus-per-process leaves the rest idle
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,5,3,1")
  assert local_multiprocess.launch(2, script=str(script), timeout_s=60, out=io.StringIO(), gpus_per_process=1) == 0
  got = [(r["env"]["CUDA_VISIBLE_DEVICES"], r["env"]["JAX_LOCAL_DEVICE_IDS"]) for r in _records(tmp_path, 2)]
  assert got == [("7", "0"), ("5", "0")], got


def test_local_multiprocess_gpu_counts_that_do_not_fit_are_one_line_errors(monkeypatch, tmp_path, capsys):
  monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  monkeypatch.setenv("PATH", _fake_nvidia_smi(tmp_path, 4) + os.pathsep + os.environ["PATH"])
  for argv, fix in ((["-n", "3"], "--gpus-per-process K"), (["-n", "2", "--gpus-per-process", "3"], "lower -n"),
                    (["-n", "2", "--gpus-per-process", "-1"], "must be >= 0")):
    assert local_multiprocess.main(argv + ["--script", "x.py", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert fix in err and len(err.strip().splitlines()) == 1, err
  # a CPU job on a GPU machine (JAX_PLATFORMS=cpu) shares no GPUs out; asking for them there is refused
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert local_multiprocess.main(["-n", "3", "--script", "x.py", "--dry-run"]) == 0
  assert "CUDA_VISIBLE_DEVICES" not in capsys.readouterr().out
  assert local_multiprocess.main(["-n", "1", "--gpus-per-process", "1", "--script", "x.py", "--dry-run"]) == 2
  assert "no GPU is visible" in capsys.readouterr().err
  # CUDA_VISIBLE_DEVICES=-1 hides every GPU (CUDA stops at the first negative id), whatever nvidia-smi lists
  monkeypatch.delenv("JAX_PLATFORMS")
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
  assert local_multiprocess.main(["-n", "3", "--script", "x.py", "--dry-run"]) == 0
  assert "JAX_LOCAL_DEVICE_IDS" not in capsys.readouterr().out
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,-1,2")
  assert local_multiprocess.main(["-n", "2", "--script", "x.py", "--dry-run"]) == 2
  assert "-n 2 on 1 GPUs (3)" in capsys.readouterr().err


def test_local_multiprocess_script_is_the_callers_path(monkeypatch, tmp_path):
  """The children run in the repository root; `--script check.py` from another directory named a file there (not
  found) before the path was made absolute against the caller's directory."""
  monkeypatch.chdir(tmp_path)
  out = io.StringIO()
  assert local_multiprocess.launch(1, script="check.py", args=["--x=1"], port=1, python="py", dry_run=True,
                                   out=out) == 0
  assert out.getvalue().splitlines()[1].endswith(f" py {tmp_path / 'check.py'} --x=1 &"), out.getvalue()


def test_local_multiprocess_takes_the_launchers_config_and_workdir(monkeypatch, tmp_path, capsys):
  """`--config FILE --workdir DIR [-- flags]`, tpu_vm.sh's and gpu_multinode.sh's calling convention (a sweep's
  --mode=print writes it for every launcher): grpo_jax.main by default, FILE as written (a repository path: the
  children run in its root), DIR absolute against the caller's directory, the flags after them. It took neither
  (argparse: unrecognized arguments), so no sweep run could go through it. An explicit program keeps its own."""
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.chdir(tmp_path)
  argv = ["-n", "2", "--port", "1", "--python", "py", "--dry-run", "--config", "configs/grpo_arith.py:small",
          "--workdir", "runs/a b", "--", "--config.train.steps=2"]
  assert local_multiprocess.main(argv) == 0
  lines = capsys.readouterr().out.splitlines()[1:-1]
  assert len(lines) == 2 and all(l.endswith(
      f" py -m grpo_jax.main --config=configs/grpo_arith.py:small '--workdir={tmp_path}/runs/a b' "
      "--config.train.steps=2 &") for l in lines), lines
  assert local_multiprocess.main(["-n", "1", "--port", "1", "--python", "py", "--dry-run", "--script", "c.py",
                                  "--workdir", "/w", "--", "--x=1"]) == 0
  assert capsys.readouterr().out.splitlines()[1].endswith(f" py {tmp_path / 'c.py'} --workdir=/w --x=1 &")


def test_local_multiprocess_cli_rejects_bad_arguments(capsys):
  assert local_multiprocess.main(["-n", "0", "--script", "x.py"]) == 2
  assert "--num-processes=0" in capsys.readouterr().err
  assert local_multiprocess.main(["-n", "2"]) == 2
  assert "exactly one of --module or --script" in capsys.readouterr().err


def test_tpu_vm_dry_run_pod_commands():
  r = _bash("tpu_vm.sh", "--name", "grpo-pod", "--zone", "us-central2-b", "--accelerator", "v4-32",
            "--workdir", "/mnt/b/run1", "--config", "configs/grpo_arith.py", "--spot", "--delete", "--dry-run",
            "--", "--config.train.steps=7")
  assert r.returncode == 0, r.stderr
  cmds = _commands(r.stdout)
  gc = "gcloud compute tpus tpu-vm"
  assert cmds[0] == (f"{gc} create grpo-pod --zone=us-central2-b --accelerator-type=v4-32 "
                     "--version=tpu-ubuntu2204-base --spot")
  assert cmds[1].startswith(f"{gc} scp ") and cmds[1].endswith("grpo-pod:grpo_jax_src.tar.gz "
                                                               "--zone=us-central2-b --worker=all")
  setup = [c for c in cmds if "jax[tpu]==0.10.2" in c]
  assert len(setup) == 1 and "--worker=all" in setup[0] and "if [ ! -f" in setup[0]  # idempotent venv
  train = [c for c in cmds if "grpo_jax.main" in c]
  assert len(train) == 1 and "--worker=all" in train[0]
  assert "GRPO_JAX_DISTRIBUTED=1" in train[0] and "--config=configs/grpo_arith.py" in train[0]
  assert "--workdir=/mnt/b/run1 --config.train.steps=7" in train[0]
  # v4-32 = 16 chips = 4 hosts: one log per worker, then the delete.
  logs = [c for c in cmds if c.startswith(f"{gc} scp grpo-pod:grpo_logs/run.log")]
  assert [c.split("--worker=")[1] for c in logs] == ["0", "1", "2", "3"]
  assert cmds[-1] == f"{gc} delete grpo-pod --zone=us-central2-b --quiet"


def test_tpu_vm_requires_name_and_zone():
  r = _bash("tpu_vm.sh", "--zone", "z", "--workdir", "w", "--dry-run")
  assert r.returncode == 2 and "--name is required" in r.stderr
  r = _bash("tpu_vm.sh", "--name", "n", "--zone", "z", "--workdir", "/w", "--accelerator", "v9-8", "--dry-run")
  assert r.returncode == 2 and "--version is required" in r.stderr


def test_gpu_multinode_ssh_dry_run_sets_ranks():
  r = _bash("gpu_multinode.sh", "--hosts", "g1,g2,g3", "--workdir", "/shared/r1", "--port", "2222", "--dry-run",
            "--", "--config.train.steps=3")
  assert r.returncode == 0, r.stderr
  cmds = _commands(r.stdout)
  assert sum(c.startswith("rsync -az") for c in cmds) == 3
  assert sum("jax[cuda12]==0.10.2" in c for c in cmds) == 3
  runs = [c for c in cmds if "grpo_jax.main" in c]
  assert len(runs) == 3
  for i, (host, c) in enumerate(zip(("g1", "g2", "g3"), runs)):
    assert c.startswith(f"ssh {host} ")
    assert (f"GRPO_JAX_DISTRIBUTED=1 GRPO_JAX_COORDINATOR=g1:2222 GRPO_JAX_NUM_PROCESSES=3 "
            f"GRPO_JAX_PROCESS_ID={i} ") in c
    assert "--workdir=/shared/r1 --config.train.steps=3" in c
  assert [c for c in cmds if c.startswith("scp ")] == [
      f"scp g{i + 1}:grpo_logs/r1.log gpu_logs/r1/node{i}.log" for i in range(3)]


def test_gpu_multinode_slurm_dry_run():
  r = _bash("gpu_multinode.sh", "--slurm", "--nodes", "4", "--gpus-per-node", "8", "--workdir", "/s/r2",
            "--dry-run")
  assert r.returncode == 0, r.stderr
  cmds = _commands(r.stdout)
  srun = [c for c in cmds if c.startswith("srun --nodes=4")]
  assert len(srun) == 1
  assert "--ntasks-per-node=1 --gpus-per-node=8" in srun[0]
  assert "--export=ALL,GRPO_JAX_DISTRIBUTED=1" in srun[0] and "-m grpo_jax.main" in srun[0]
  assert "--output=gpu_logs/r2/node%t.log" in srun[0]
  r = _bash("gpu_multinode.sh", "--workdir", "x", "--dry-run")
  assert r.returncode == 2 and "choose --slurm or --hosts" in r.stderr


def test_a_relative_workdir_is_refused_before_any_command():
  """A relative --workdir would land inside the code's copy on every host (~/grpo_jax_src), which the next launch
  deletes (tpu_vm: rm -rf; --hosts: rsync --delete): a resume would silently start over. A gs:// one is refused as
  grpo_jax.main refuses it (preflight.check_workdir), before a TPU or a node is used; an absolute path passes."""
  for script, where in (("tpu_vm.sh", ["--name", "n", "--zone", "z"]), ("gpu_multinode.sh", ["--hosts", "a,b"]),
                        ("gpu_multinode.sh", ["--slurm"])):
    r = _bash(script, *where, "--workdir", "runs/arith", "--dry-run")
    assert r.returncode == 2 and r.stdout == "", (script, r.stdout)
    assert r.stderr.startswith("error: --workdir=runs/arith is relative:") and len(r.stderr.splitlines()) == 1
    r = _bash(script, *where, "--workdir", "gs://b/runs/arith", "--dry-run")
    assert r.returncode == 2 and r.stdout == "", (script, r.stdout)
    assert r.stderr.startswith("error: --workdir=gs://b/runs/arith: an object-store workdir is not supported")
    assert len(r.stderr.splitlines()) == 1, r.stderr
    r = _bash(script, *where, "--workdir", "/shared/runs/arith", "--dry-run")
    assert r.returncode == 0 and "--workdir=/shared/runs/arith" in r.stdout, (script, r.stderr)


def test_launchers_help_missing_values_and_bad_host_lists():
  """--help prints the header comment only (it printed `set -euo pipefail` too); a flag without its value is one
  line and exit 2 (was bash's '$2: unbound variable', exit 1); an empty or spaced --hosts entry is refused (it became
  `ssh ''` and a process the job waited for forever); the coordinator of user@host hosts is the host alone."""
  for script, last in (("tpu_vm.sh", "launch/tpu_vm.sh ... --delete"), ("gpu_multinode.sh", "add --dry-run")):
    r = _bash(script, "--help")
    assert r.returncode == 0 and r.stdout.startswith("Runs grpo_jax on") and "set -euo" not in r.stdout, r.stdout
    assert r.stdout.rstrip().splitlines()[-1].lstrip().startswith(last), r.stdout
    r = _bash(script, "--workdir")
    assert r.returncode == 2 and r.stderr == "error: --workdir needs a value; see --help\n", r.stderr
  for hosts, bad in (("a,,b", "''"), ("a, b", "' b'"), ("a:22", "'a:22'")):
    r = _bash("gpu_multinode.sh", "--hosts", hosts, "--workdir", "/s/r", "--dry-run")
    assert r.returncode == 2 and r.stdout == "" and f"host name {bad} is empty or has a space" in r.stderr, r.stderr
  r = _bash("gpu_multinode.sh", "--hosts", "me@g1,me@g2,", "--workdir", "/s/r", "--dry-run")
  runs = [c for c in _commands(r.stdout) if "GRPO_JAX_COORDINATOR=" in c]
  assert r.returncode == 0 and len(runs) == 2 and all("GRPO_JAX_COORDINATOR=g1:12345" in c for c in runs), r.stdout
  assert "GRPO_JAX_NUM_PROCESSES=2" in runs[0] and runs[0].startswith("ssh me@g1 ")


def _remote_argv(command: str) -> list[str]:
  """The arguments the remote shell hands python: the printed local command's words (shlex), then the shell
  command among them (ssh's last word, gcloud's --command=, srun's bash -c) split as a shell splits it, the words
  after the venv's python up to the first operator (`<`, `&&`, `;`, ...)."""
  import shlex
  words = shlex.split(command)
  remote = next(w[len("--command="):] if w.startswith("--command=") else w for w in reversed(words)
                if w.startswith("--command=") or "python" in w)
  lex = shlex.shlex(remote, posix=True, punctuation_chars=True)
  lex.whitespace_split = True
  tokens = list(lex)
  start = next(i for i, t in enumerate(tokens) if t.endswith("/bin/python")) + 1
  end = next((i for i in range(start, len(tokens)) if set(tokens[i]) <= set("();<>|&")), len(tokens))
  return tokens[start:end]


def test_launchers_quote_paths_for_the_remote_shell_and_check_numbers(tmp_path):
  """A --workdir or --config with a space reached the remote shell unquoted: grpo_jax.main got --workdir=/mnt/my and
  a stray argument 'runs/x' (and slurm's `cd <repo>` split a repository path with a space). A non-numeric --workers
  was bash's 'unbound variable' (exit 1) at the log collection, after the run; --port/--nodes/--gpus-per-node went
  to the nodes as written (GRPO_JAX_COORDINATOR=g1:abc failed there after the copy and set-up)."""
  ws, cfg = "/mnt/my runs/x y", "configs/my cfg.py:small"
  want = ["-m", "grpo_jax.main", f"--config={cfg}", f"--workdir={ws}", "--config.log.note=a b"]
  for script, where in (("tpu_vm.sh", ["--name", "n", "--zone", "z"]), ("gpu_multinode.sh", ["--hosts", "a,b"]),
                        ("gpu_multinode.sh", ["--slurm"])):
    r = _bash(script, *where, "--workdir", ws, "--config", cfg, "--dry-run", "--", "--config.log.note=a b")
    assert r.returncode == 0, r.stderr
    runs = [c for c in _commands(r.stdout) if "grpo_jax.main" in c]
    assert runs and all(_remote_argv(c) == want for c in runs), (script, runs)
  r = _bash("gpu_multinode.sh", "--hosts", "a", "--workdir", ws, "--dry-run")
  assert "B=~/grpo_logs/x_y &&" in r.stdout and "gpu_logs/x_y/node0.log" in r.stdout, r.stdout
  # slurm: the repository path is one word for the nodes' shell
  spaced = tmp_path / "my repo"
  (spaced / "launch").mkdir(parents=True)
  script = spaced / "launch" / "gpu_multinode.sh"
  for name in ("gpu_multinode.sh", "detached_job.sh"):
    (spaced / "launch" / name).write_text(open(os.path.join(REPO, "launch", name)).read())
  r = subprocess.run(["bash", str(script), "--slurm", "--workdir", "/s/r", "--dry-run"], capture_output=True,
                     text=True, timeout=30)
  import shlex
  shells = [shlex.split(shlex.split(c)[-1]) for c in _commands(r.stdout) if c.startswith("srun")]
  assert r.returncode == 0 and len(shells) == 2, r.stdout  # the venv set-up, then the run: both cd to the repo
  assert all(w[w.index("cd") + 1].rstrip(";") == str(spaced) for w in shells), shells
  for script, args, line in (
      ("tpu_vm.sh", ["--name", "n", "--zone", "z", "--workers", "abc"], "error: --workers=abc must be a positive"),
      ("gpu_multinode.sh", ["--hosts", "a", "--port", "abc"], "error: --port=abc must be a positive integer"),
      ("gpu_multinode.sh", ["--slurm", "--nodes", "0"], "error: --nodes=0 must be a positive integer"),
      ("gpu_multinode.sh", ["--slurm", "--gpus-per-node", "8x"], "error: --gpus-per-node=8x must be a positive")):
    r = _bash(script, *args, "--workdir", "/s/r", "--dry-run")
    assert r.returncode == 2 and r.stdout == "" and r.stderr.startswith(line) and len(r.stderr.splitlines()) == 1, \
        (script, args, r.returncode, r.stdout, r.stderr)


def test_tpu_vm_keeps_the_run_status_and_deletes_when_the_tpu_lists_no_workers(tmp_path):
  """After the run, the log collection counts the workers from `describe`: a TPU that lists none (a preempted spot
  TPU) or a describe that fails made the script exit 1 there, silently: the run's own status (here 3) was lost and
  --delete never ran. Now a one-line warning, no logs, the delete, and the run's status. Also when the session's
  status was ssh's 255 (the connection lost as the TPU went: a lost session otherwise holds the delete back, the
  job may run on). A fake gcloud on PATH; the script runs from a throwaway git repository (it archives its
  repository)."""
  repo = tmp_path / "repo"
  (repo / "launch").mkdir(parents=True)
  for name in ("tpu_vm.sh", "detached_job.sh"):
    (repo / "launch" / name).write_text(open(os.path.join(REPO, "launch", name)).read())
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
  for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
    subprocess.run(git + cmd, check=True, capture_output=True)
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  calls = tmp_path / "calls.log"
  # no endpoints listed; describe fails; the session lost
  for describe, code in (("exit 0", 3), ("exit 1", 3), ("exit 0", 255)):
    (bin_dir / "gcloud").write_text(textwrap.dedent(f"""\
        #!/bin/bash
        echo "$*" >> {calls}
        case "$*" in *" describe "*) {describe};; *grpo_jax.main*) exit {code};; esac
        exit 0
        """))
    (bin_dir / "gcloud").chmod(0o755)
    calls.write_text("")
    r = subprocess.run(["bash", str(repo / "launch" / "tpu_vm.sh"), "--name", "n", "--zone", "z", "--workdir",
                        "/mnt/b/r", "--delete"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}"))
    assert r.returncode == code, (describe, r.returncode, r.stderr)
    assert "warning: TPU n lists no workers now (preempted or deleted?); no logs collected" in r.stderr, r.stderr
    lines = calls.read_text().splitlines()
    assert lines[-1] == "compute tpus tpu-vm delete n --zone=z --quiet", lines
    assert not any("grpo_logs/run.log" in l and " scp " in f" {l}" for l in lines), lines


def test_gpu_multinode_slurm_keeps_every_gpu_of_the_node(tmp_path):
  """--slurm starts one task per node, but JAX's SLURM detection gives each process only GPU SLURM_LOCALID (it
  assumes one process per GPU): every node of a 2 × 8 GPU job trained on its GPU 0. The run command now sets
  JAX_LOCAL_DEVICE_IDS=0,...,G-1. Checked against JAX itself: the environment the srun command gives a node
  (SLURM's variables as srun sets them for task 0, plus the command's own assignments) through
  multihost.maybe_initialize, then the CUDA devices JAX will open (planted back: '0')."""
  import shlex
  r = _bash("gpu_multinode.sh", "--slurm", "--nodes", "1", "--gpus-per-node", "3", "--workdir", "/s/r", "--dry-run")
  assert r.returncode == 0, r.stderr
  shell = shlex.split([c for c in _commands(r.stdout) if c.startswith("srun ") and "grpo_jax.main" in c][0])[-1]
  words = shlex.split(shell.split("&&", 1)[1])
  assigned = dict(w.split("=", 1) for w in words[:next(i for i, w in enumerate(words) if "python" in w)])
  probe = tmp_path / "probe.py"
  probe.write_text("from grpo_jax.infra import multihost\nassert multihost.maybe_initialize()\n"
                   "from jax._src import xla_bridge\nprint('VISIBLE', xla_bridge.CUDA_VISIBLE_DEVICES.value)\n")
  slurm = dict(SLURM_JOB_ID="7", SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="1", SLURM_PROCID="0",
               SLURM_LOCALID="0", JAX_COORDINATOR_PORT=str(local_multiprocess.free_port()))
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu", GRPO_JAX_DISTRIBUTED="1", **slurm, **assigned)
  env.pop("GRPO_JAX_COORDINATOR", None)
  out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=60)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "VISIBLE 0,1,2" in out.stdout, (assigned, out.stdout)


STOPPABLE = textwrap.dedent("""
    import os, signal, sys, time
    def stop(signum, frame):
      print(f"got {signal.Signals(signum).name}", flush=True)
      sys.exit(0)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
      signal.signal(s, stop)
    print(f"ready {os.getpid()}", flush=True)
    time.sleep(60)
""")


def test_local_multiprocess_sends_a_signal_on_to_every_process(tmp_path):
  """The children run in sessions of their own, so Ctrl-C at the terminal (SIGINT to the launcher's group) or a
  SIGTERM to the launcher reached none of them: the launcher died (a KeyboardInterrupt traceback, or -15) and both
  children ran on, orphaned (a real job: waiting in collectives, holding the workdir lock). Now the launcher sends
  the signal on to every process (grpo_jax.main: finish the step, save, exit 0) and returns their status (planted
  back: both children still alive after the launcher exited)."""
  import re
  import signal
  script = tmp_path / "stoppable.py"
  script.write_text(STOPPABLE)
  # The launcher starts with Ctrl-C's and SIGTERM's default handling whatever this process inherited: a suite run in
  # a non-interactive shell's background (`cmd &`) inherits SIGINT ignored, which the launcher rightly keeps
  # ignored (the test below), so nothing would be sent on and the children would run out their 60 s.
  launcher = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "signal.signal(signal.SIGTERM, signal.SIG_DFL); sys.argv[0] = 'lm'; "
              f"sys.path.insert(0, {os.path.join(REPO, 'launch')!r}); import local_multiprocess; "
              f"sys.exit(local_multiprocess.main(['-n', '2', '--script', {str(script)!r}]))")
  for sig in (signal.SIGINT, signal.SIGTERM):
    p = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    lines = []
    while sum(l.startswith(("[p0] ready", "[p1] ready")) for l in lines) < 2:
      line = p.stdout.readline()
      assert line, "".join(lines)
      lines.append(line)
    pids = [int(m) for l in lines for m in re.findall(r"\] ready (\d+)", l)]
    p.send_signal(sig)
    try:
      rest, _ = p.communicate(timeout=30)
    finally:
      alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")
               and open(f"/proc/{pid}/stat").read().split()[2] != "Z"]
      for pid in alive:
        os.kill(pid, signal.SIGKILL)
    text = "".join(lines) + rest
    assert not alive and p.returncode == 0, (sig, alive, p.returncode, text)
    assert f"[launch] {sig.name} received: sent to every process" in text, text
    for i in (0, 1):
      assert f"[p{i}] got {sig.name}" in text and f"[launch] p{i} exited with 0" in text, text


def test_local_multiprocess_keeps_a_signal_the_caller_ignores(tmp_path):
  """Under `nohup` (SIGHUP ignored) a closed terminal must not stop the job: the launcher leaves an ignored signal
  ignored instead of sending it on (planted back: both children got SIGHUP and the job ended)."""
  import signal
  script = tmp_path / "stoppable.py"
  script.write_text(STOPPABLE)
  launcher = ("import signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); sys.argv[0] = 'lm'; "
              f"sys.path.insert(0, {os.path.join(REPO, 'launch')!r}); import local_multiprocess; "
              f"sys.exit(local_multiprocess.main(['-n', '2', '--timeout-s', '4', '--script', {str(script)!r}]))")
  p = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  while sum(l.startswith(("[p0] ready", "[p1] ready")) for l in lines) < 2:
    line = p.stdout.readline()
    assert line, "".join(lines)
    lines.append(line)
  p.send_signal(signal.SIGHUP)
  text = "".join(lines) + p.communicate(timeout=30)[0]
  assert "got SIGHUP" not in text and "SIGHUP received" not in text, text
  assert "stopping the remaining processes (timeout)" in text and p.returncode == 124, (p.returncode, text)


# ------------------------------------------------------------------ the ssh launchers' detached jobs and their stop
# A fake `python` for the hosts' venv (launch/*.sh run $HOME/grpo_jax_venv/bin/python): records its argv, prints a
# line every 0.2 s, and on SIGINT prints "saved" and exits 0 as grpo_jax.main does (infra/signals.py); left alone it
# ends after FAKE_STEPS lines, or at the first line after ~/finish appears, with FAKE_EXIT.
FAKE_JOB = textwrap.dedent("""\
    #!{python}
    import json, os, signal, sys, time
    json.dump(sys.argv[1:], open(os.path.expanduser("~/job_argv.json"), "w"))
    def stop(signum, frame):
      if os.environ.get("FAKE_SLOW_SAVE"):  # a save that takes longer than the launcher waits
        print("saving", flush=True)
        return
      print("saved", flush=True)
      sys.exit(0)
    signal.signal(signal.SIGINT, stop)
    for i in range(int(os.environ.get("FAKE_STEPS", "150"))):
      print(f"step {{i}}", flush=True)
      if os.path.exists(os.path.expanduser("~/finish")):
        break
      time.sleep(0.2)
    print("done", flush=True)
    sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
    """)

# `gcloud`, `ssh`, `scp` and `rsync` for the launchers: "remote" is this machine with HOME a temporary directory. A
# remote command runs as sshd runs it: `bash -c` in a session of its own (so a signal to the launcher's process group
# does not reach it) with default signal handling, its output relayed through a pipe. SIGTERM to the relay is a
# dropped connection: the pipe closes (the remote side's next write fails) and the relay exits 255, ssh's status.
# gcloud's ssh runs the fake ssh as its child, as gcloud does.
FAKE_REMOTE = textwrap.dedent("""\
    #!{python}
    import os, shutil, signal, subprocess, sys
    home, tool, args = os.environ["HOME"], os.path.basename(sys.argv[0]), sys.argv[1:]
    with open(os.path.join(home, "calls.log"), "a") as f:
      f.write(" ".join([tool] + args) + "\\n")

    def remote(cmd):
      def defaults():
        for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP):
          signal.signal(s, signal.SIG_DFL)
      p = subprocess.Popen(["bash", "-c", cmd], cwd=home, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True, preexec_fn=defaults)
      if "setsid" in cmd:  # the session that starts the job and follows its log
        with open(os.path.join(home, "stream.pid"), "w") as f:
          f.write(str(os.getpid()))
      signal.signal(signal.SIGTERM, lambda *a: os._exit(255))
      for line in p.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
      sys.exit(p.wait())

    def copy(src, dst):
      src, dst = (os.path.join(home, p.split(":", 1)[1]) if ":" in p else p for p in (src, dst))
      if os.path.exists(src):
        shutil.copy(src, dst)

    if tool == "gcloud":
      sub, rest = args[3], [a for a in args[4:] if not a.startswith("--")]
      cmd = [a[len("--command="):] for a in args if a.startswith("--command=")]
      if sub == "ssh":  # through ssh, a child of gcloud's as in the real one
        sys.exit(subprocess.call([os.path.join(os.path.dirname(sys.argv[0]), "ssh"), "worker", cmd[0]]))
      elif sub == "scp":
        copy(rest[0], rest[1])
    elif tool == "ssh":
      remote(args[1])
    elif tool == "scp":
      copy(args[0], args[1])
    elif tool == "rsync":
      os.makedirs(os.path.join(home, "grpo_jax_src"), exist_ok=True)
    """)


def _pod(tmp_path, launcher: str, *, steps: int = 150, code: int = 0, delete: bool = True, stop_timeout: int = 10):
  """A throwaway repository with the launcher, a fake host (HOME) with its venv, fakes on PATH; returns the
  launcher's argv, its environment and HOME. One worker / host. The workdir and an argument have a space."""
  repo, home, bin_dir = tmp_path / "repo", tmp_path / "home", tmp_path / "bin"
  (repo / "launch").mkdir(parents=True)
  for name in (launcher, "detached_job.sh"):
    (repo / "launch" / name).write_text(open(os.path.join(REPO, "launch", name)).read())
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
  for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "x"]):
    subprocess.run(git + cmd, check=True, capture_output=True)
  venv = home / "grpo_jax_venv"
  (venv / "bin").mkdir(parents=True)
  (venv / ".grpo_jax_0.10.2").write_text("")  # the set-up step finds the venv built
  (venv / "bin" / "python").write_text(FAKE_JOB.format(python=sys.executable))
  (venv / "bin" / "pip").write_text("#!/bin/sh\n")
  bin_dir.mkdir()
  for tool in ("gcloud", "ssh", "scp", "rsync"):
    (bin_dir / tool).write_text(FAKE_REMOTE.format(python=sys.executable))
  for f in [venv / "bin" / "python", venv / "bin" / "pip"] + list(bin_dir.iterdir()):
    f.chmod(0o755)
  where = (["--name", "n", "--zone", "z", "--no-create", "--workers", "1"] + (["--delete"] if delete else [])
           if launcher == "tpu_vm.sh" else ["--hosts", "h1", "--run-name", "run"])
  argv = ["bash", str(repo / "launch" / launcher), *where, "--workdir", "/mnt/b r", "--stop-timeout",
          str(stop_timeout), "--", "--config.log.note=a b"]
  env = dict(os.environ, HOME=str(home), PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_STEPS=str(steps),
             FAKE_EXIT=str(code))
  return argv, env, home


def _start(argv, env, cwd):
  """The launcher in a process group of its own (a terminal's foreground job), with Ctrl-C's, SIGTERM's and SIGHUP's
  default handling whatever pytest inherited (a suite started with `&` inherits SIGINT ignored, which bash keeps)."""
  import signal

  def defaults():
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
      signal.signal(s, signal.SIG_DFL)
  out = open(cwd / "launcher.out", "w")
  return subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                          preexec_fn=defaults)


def _poll(what, timeout: float = 10.0):
  import time
  deadline = time.monotonic() + timeout
  while not what():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.05)


def _read(path) -> str:
  return path.read_text() if path.exists() else ""


def _collected(tmp_path, launcher: str) -> str:
  return _read(tmp_path / ("tpu_logs/n/worker0.log" if launcher == "tpu_vm.sh" else "gpu_logs/run/node0.log"))


LAUNCHERS = ("tpu_vm.sh", "gpu_multinode.sh")


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("how", ("sigint_to_group", "sigterm_to_launcher"))
def test_ssh_launchers_stop_the_remote_job_cleanly_on_a_signal(tmp_path, launcher, how):
  """Ctrl-C (SIGINT to the launcher's process group) or SIGTERM to the launcher alone reached only the local ssh /
  gcloud: the remote job ran on, and its next line to the dead session killed it without saving. Now the launcher
  sends each job SIGINT, waits for it, collects the logs and exits with the jobs' status: the job prints "saved",
  exits 0, and so does the launcher; the first session is ended, gcloud's ssh child too (planted: no trap, a trap
  that sends nothing on, a job attached to the session, gcloud killed without its child)."""
  import signal
  argv, env, home = _pod(tmp_path, launcher)
  p = _start(argv, env, tmp_path)
  log = home / "grpo_logs" / "run.log"
  try:
    _poll(lambda: "step 2" in _read(log))
    if how == "sigint_to_group":
      os.killpg(p.pid, signal.SIGINT)
    else:
      p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=15)
  finally:
    p.kill()
  out = _read(tmp_path / "launcher.out")
  sig = "INT" if how == "sigint_to_group" else "TERM"
  assert rc == 0, (rc, out)
  assert f"launch: SIG{sig} received: sending SIGINT to the job on every host" in out, out
  assert _read(log).rstrip().endswith("saved") and _read(home / "grpo_logs" / "run.status") == "0\n", _read(log)
  assert "saved" in _collected(tmp_path, launcher) and "saved" in out.split("received: sending SIGINT")[1], out
  assert out.count("saved") == 1, out  # shown by the stop's follow alone: the first session was ended
  assert json.loads(_read(home / "job_argv.json")) == [
      "-m", "grpo_jax.main", "--config=configs/grpo_arith.py", "--workdir=/mnt/b r", "--config.log.note=a b"]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ssh_launchers_leave_the_job_running_when_the_session_drops(tmp_path, launcher):
  """The session that follows the log is killed (a dropped connection) without a signal to the launcher: the job
  ran inside that session behind `| tee`, so tee died of SIGPIPE and the job of BrokenPipeError at its next line.
  Now it runs on to its natural end and writes its status; the launcher says so, exits 255 (ssh's status), does
  not --delete the TPU under it, and a second launch of the same run is refused while it runs (planted: the job's
  output through the session; the delete not held back; no refusal)."""
  import signal
  argv, env, home = _pod(tmp_path, launcher)
  p = _start(argv, env, tmp_path)
  log, status = home / "grpo_logs" / "run.log", home / "grpo_logs" / "run.status"
  try:
    _poll(lambda: "step 2" in _read(log) and (home / "stream.pid").exists())
    os.kill(int(_read(home / "stream.pid")), signal.SIGTERM)
    rc = p.wait(timeout=15)
  finally:
    p.kill()
  out = _read(tmp_path / "launcher.out")
  assert rc == 255 and "session ended with ssh's status 255 (connection lost?)" in out, (rc, out)
  assert not status.exists(), "the job should still be running"
  if launcher == "tpu_vm.sh":
    assert "warning: not deleting TPU n: its job may still be running" in out, out
    assert not any(" delete " in l for l in _read(home / "calls.log").splitlines()), _read(home / "calls.log")
  again = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
  assert again.returncode == 2 and "a job of this run is still running" in again.stdout + again.stderr, again
  assert not status.exists(), "the job should still be running"
  (home / "finish").write_text("")  # its natural end: the steps left run out
  _poll(lambda: status.exists())
  assert _read(status) == "0\n" and _read(log).rstrip().endswith("done"), _read(log)
  assert "saved" not in _read(log)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ssh_launchers_exit_with_the_jobs_own_failure(tmp_path, launcher):
  """A job that fails (exit 3) gives the launcher status 3 through the detached run and its status file; its log is
  collected whole (planted: the follow exiting 0)."""
  argv, env, home = _pod(tmp_path, launcher, steps=3, code=3)
  r = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
  assert r.returncode == 3, (r.returncode, r.stdout, r.stderr)
  assert _read(home / "grpo_logs" / "run.status") == "3\n"
  assert _collected(tmp_path, launcher) == "step 0\nstep 1\nstep 2\ndone\n", r.stdout
  assert "step 2" in r.stdout  # followed live


def test_tpu_vm_bounds_the_wait_for_a_stop_and_a_second_ctrl_c_ends_it(tmp_path):
  """A job that has not stopped after --stop-timeout: the launcher collects the logs, exits 124 and does not --delete
  the TPU it is still saving on. A second Ctrl-C while it waits ends the wait at once: exit 130, the job left to
  finish its save (planted: the limit not passed on; the second signal only recorded)."""
  import signal
  import time
  argv, env, home = _pod(tmp_path, "tpu_vm.sh", stop_timeout=2)
  env["FAKE_SLOW_SAVE"] = "1"
  log, pgid = home / "grpo_logs" / "run.log", home / "grpo_logs" / "run.pgid"
  for second_signal in (False, True):
    log.unlink(missing_ok=True)  # the first run's lines
    p = _start(argv, env, tmp_path)
    try:
      _poll(lambda: "step 2" in _read(log))
      os.killpg(p.pid, signal.SIGINT)
      if second_signal:
        _poll(lambda: "saving" in _read(log))
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)
      rc = p.wait(timeout=15)
    finally:
      p.kill()
      if pgid.exists():  # the job that would not stop; its files go too (a zombie here can outlive it a while)
        try:
          os.killpg(int(_read(pgid)), signal.SIGKILL)
        except ProcessLookupError:
          pass
        pgid.unlink()
    out = _read(tmp_path / "launcher.out")
    if second_signal:
      assert rc == 130 and time.monotonic() - t0 < 1.5 and "launch: stopped waiting" in out, (rc, out)
    else:
      assert rc == 124 and "the job is still running after 2 s" in out, (rc, out)
      assert "warning: not deleting TPU n: its job may still be running" in out, out
      assert "+ gcloud compute tpus tpu-vm scp n:grpo_logs/run.log" in out, out
    assert not any(" delete " in l for l in _read(home / "calls.log").splitlines())


def test_tpu_vm_stops_the_job_when_its_terminal_hangs_up(tmp_path):
  """A closed terminal: SIGHUP to the launcher, whose output pipe has no reader any more. Its first line after the
  signal killed it (SIGPIPE) before the jobs were sent their SIGINT; it now writes to /dev/null from then on, stops
  the job (which saves) and collects the log (planted: the HUP trap without the redirect)."""
  import signal
  argv, env, home = _pod(tmp_path, "tpu_vm.sh")
  log = home / "grpo_logs" / "run.log"
  p = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
  try:
    _poll(lambda: "step 2" in _read(log))
    p.stdout.close()  # the terminal is gone
    p.send_signal(signal.SIGHUP)
    rc = p.wait(timeout=15)
  finally:
    p.kill()
  assert rc == 0 and _read(log).rstrip().endswith("saved"), (rc, _read(log))
  assert "saved" in _collected(tmp_path, "tpu_vm.sh")
