"""The real CLI as a 2-process job: `python -m grpo_jax.main` started by launch/local_multiprocess.py (jax.distributed
on localhost, gloo, 2 CPU devices each) equals the same command in 1 process with 4 devices: 2 GRPO steps on a
data=2 x fsdp=2 mesh (each process a data row, its params sharded over its own 2 devices; every batch through
train.device_batch) and the held-out evals at steps 0 and 2 (rows split over processes, gathered by
process_allgather), metrics.jsonl and the final checkpoint's params. A recorder on both runs' PYTHONPATH (RECORDER,
a sitecustomize the product does not know of) writes what each process saw: its device counts, the rows of every
batch it holds, and its shards of the params it saved, so that the checkpoint is checked against the live state
and the rows against the single-process batch.

The model is random but starts from a HF dir the test writes (train.init_from=hf:, read by every process), with
the EOS embedding row scaled so completions end at varying lengths; the DAPO overlong penalty over the whole
window (rl.overlong_frac = 1: all L tokens) turns those lengths into rewards that differ within groups, so the update
is not zero and equal params mean equal gradients.

(This job also carries what tests/test_multihost.py's library-level 2-process job checked, which it replaces: one
2-process job of ~10 CPU-s per process instead of two, the processes' cost being their own tracing and compiling.)
"""
import io
import json
import os
import re
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import local_multiprocess  # noqa: E402

L = 12
TRAIN_SIZE = 6  # 4 prompts a step: step 2's batch crosses an epoch (its last 2 prompts are the next epoch's)
OVERRIDES = dict(**{"sft.steps": 0, "model.hidden": 32, "model.layers": 1, "model.heads": 2, "model.kv_heads": 1,
                    "model.inter": 64, "sampling.max_new_tokens": L, "rl.G": 4, "rl.prompts_per_step": 4,
                    "rl.overlong_frac": 1.0, "optim.lr": 1e-2, "train.steps": 2, "train.eval_every": 2,
                    "train.ckpt_every": 2, "train.plot_every": 0, "train.sample_every": 2, "eval.size": 8,
                    "eval.batch": 8, "eval.n_samples": 2, "task.train_size": TRAIN_SIZE, "task.test_size": 8,
                    "mesh.data": 2, "mesh.fsdp": 2, "log.tensorboard": False, "log.plots": False})


# Test-only: written as sitecustomize.py into a directory on the runs' PYTHONPATH, so Python imports it at start-up
# in each process (the launcher's too, where it stays inert). It patches two functions as their modules load, not
# before: importing grpo_jax here would load JAX before main decides what to load. Each process writes, into
# $TEST_MULTIHOST_RECORD, its topology and the rows of index_N it holds of every batch train.device_batch put
# (rows_p<i>.json), and its addressable shards of the params each checkpoint saved (params_<step>_p<i>.npz: the
# live state's, read after the save). It copies what is there to the host; it runs no collective and compiles nothing.
RECORDER = """
import importlib.abc, importlib.machinery, json, os, sys


def _train(module):
  device_batch, held = module.device_batch, []

  def recording(mesh, batch):
    out = device_batch(mesh, batch)
    import jax, numpy as np
    held.append(sorted([s.index[0].start, s.index[0].stop, np.asarray(s.data).tolist()]
                       for s in out["index_N"].addressable_shards))
    seen = dict(process=jax.process_index(), processes=jax.process_count(), devices=jax.device_count(),
                local=jax.local_device_count(), rows=held)
    with open(os.path.join(os.environ["TEST_MULTIHOST_RECORD"], f"rows_p{jax.process_index()}.json"), "w") as f:
      json.dump(seen, f)
    return out
  module.device_batch = recording


def _checkpoint(module):
  maybe_save = module.Checkpointer.maybe_save

  def recording(self, step, state, meta=None, force=False):
    saved = maybe_save(self, step, state, meta, force)
    if saved:
      import jax, numpy as np
      params = (state() if callable(state) else state)["params"]
      shards = {}
      for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        for s in x.addressable_shards:
          where = [[i.start or 0, n if i.stop is None else i.stop] for i, n in zip(s.index, x.shape)]
          shards[f"{jax.tree_util.keystr(path)}@{json.dumps(where)}"] = np.asarray(s.data)
      np.savez(os.path.join(os.environ["TEST_MULTIHOST_RECORD"], f"params_{step}_p{jax.process_index()}.npz"),
               **shards)
    return saved
  module.Checkpointer.maybe_save = recording


PATCHES = {"grpo_jax.run.train": _train, "grpo_jax.infra.checkpoint": _checkpoint}


class _PatchOnImport(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path, target=None):
    if name not in PATCHES:
      return None
    spec = importlib.machinery.PathFinder.find_spec(name, path, target)
    run = spec.loader.exec_module

    def exec_module(module):
      run(module)
      PATCHES[name](module)
    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _PatchOnImport())
"""


def _config(data_dir: str, hf_dir: str):
  from configs import grpo_arith
  c = grpo_arith.get_config("runlocal")
  for k, v in OVERRIDES.items():
    group, key = k.split(".")
    setattr(c[group], key, v)
  c.task.data_dir, c.train.init_from = data_dir, f"hf:{hf_dir}"
  return c


def _flags(c) -> list[str]:
  return [f"--config.{k}={getattr(c[k.split('.')[0]], k.split('.')[1])}" for k in OVERRIDES] + [
      f"--config.task.data_dir={c.task.data_dir}", f"--config.train.init_from={c.train.init_from}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  from grpo_jax.hf import hf_io
  from grpo_jax.hf import hf_save
  from grpo_jax.model import model as model_lib
  from grpo_jax.tasks import data, tokenizer_factory as tok_lib
  root = tmp_path_factory.mktemp("cli")
  c = _config(str(root / "tfds"), str(root / "hf"))
  for split in ("train", "test"):  # built once here: two processes must not build the same TFDS dir at once
    data.load_examples(c.task, split)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(3))
  eos = tok_lib.load().eos_id
  emb = np.asarray(params["embed"]["embedding"]).copy()
  emb[eos] *= 30.0  # tied head: greedy ends at once; sampling (logits ~flat) ends some rows early
  params["embed"]["embedding"] = emb
  hf_save.save_hf(str(root / "hf"), mcfg, params)
  argv = ["--config=configs/grpo_arith.py:runlocal"] + _flags(c)
  (root / "recorder").mkdir()
  (root / "recorder" / "sitecustomize.py").write_text(RECORDER)
  for run in ("seen_one", "seen_two"):
    (root / run).mkdir()
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, str(root / "recorder")]), JAX_PLATFORMS="cpu",
             TEST_MULTIHOST_RECORD=str(root / "seen_one"))
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
  t0 = time.perf_counter()
  single = subprocess.Popen([sys.executable, "-m", "grpo_jax.main", *argv, f"--workdir={root / 'one'}"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  # The 2-process job is the line a sweep prints for it (--mode=print --launch=launch/local_multiprocess.py: the
  # launchers' --config/--workdir convention), run by bash: the printed line runs the job main runs alone.
  from grpo_jax.studies import sweep
  overrides = {k: getattr(c[k.split(".")[0]], k.split(".")[1]) for k in OVERRIDES}
  overrides.update({"task.data_dir": c.task.data_dir, "train.init_from": c.train.init_from})
  launch = f"{sys.executable} launch/local_multiprocess.py -n 2 --devices-per-process 2 --timeout-s 300"
  printed = sweep.run(c, str(root / "sweep"), config_file="configs/grpo_arith.py:runlocal", sweep_text="seed=0",
                      mode="print", launch=launch, base_overrides=overrides, log=lambda s: None)
  (cmd,), (run,) = printed["report"].splitlines(), printed["runs"]
  recorded = os.pathsep.join(p for p in (str(root / "recorder"), os.environ.get("PYTHONPATH", "")) if p)
  multi = subprocess.run(["bash", "-c", cmd], env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=recorded,
                                                      TEST_MULTIHOST_RECORD=str(root / "seen_two")),
                         cwd=REPO, capture_output=True, text=True, timeout=360)
  single_out, _ = single.communicate(timeout=300)
  print(f"1 and 2 processes together: {time.perf_counter() - t0:.1f}s")
  assert multi.returncode == 0, (cmd, (multi.stdout + multi.stderr)[-5000:])
  assert single.returncode == 0, single_out[-5000:]
  return dict(root=root, two=root / "sweep" / run.name, mcfg=mcfg, init=params, multi=multi.stdout, config=c)


def _launch_script(path, text: str, **kw) -> tuple[int, str]:
  """Writes `text` to `path` and runs it as 2 processes of one device each on the CPU, with this process's
  environment (the launcher gives its children its own) and no compile cache; -> (exit code, their output)."""
  path.write_text(text)
  log = io.StringIO()
  with pytest.MonkeyPatch.context() as mp:
    for k, v in dict(PYTHONPATH=REPO, JAX_PLATFORMS="cpu", GRPO_JAX_XLA_CACHE="off").items():
      mp.setenv(k, v)
    rc = local_multiprocess.launch(2, script=str(path), devices_per_process=1, python=sys.executable, out=log, **kw)
  return rc, log.getvalue()


def _rows(d):
  """metrics.jsonl's rows, its "nan"/"inf" strings (an empty length split, metrics.py) read back as floats."""
  from grpo_jax.run import metrics as metrics_lib
  return metrics_lib.read_metrics(str(d))


def _params(d, mcfg):
  from grpo_jax.infra import checkpoint as ckpt_lib
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev),
                          jax.eval_shape(lambda: model_lib.init_params(mcfg, jax.random.PRNGKey(0))))
  return params_ckpt.restore_params_only(str(d / "checkpoints"), abstract, step=2).params


def test_both_processes_ran_the_job(runs):
  for pid in (0, 1):
    assert f"[launch] p{pid} exited with 0" in runs["multi"]
  assert "[p1] " in runs["multi"]


def test_process_0_writes_the_records_and_each_process_its_checkpoint_shards(runs):
  """The run's records (metrics, samples, config, stage and auto records) are process 0's alone: the same files
  as the 1-process run's, samples.jsonl line for line (process 1 writing too would repeat its lines); the progress
  and INFO lines are process 0's (console.quiet_info); each process wrote its own shards of the step (orbax's
  ocdbt.process_<i>)."""
  one, two = runs["root"] / "one", runs["two"]
  records = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if "checkpoints" not in p.parts)  # noqa: E731
  assert records(two) == records(one) and "samples.jsonl" in records(one), (records(one), records(two))
  assert (two / "samples.jsonl").read_text() == (one / "samples.jsonl").read_text()
  assert "[p0] step 2/2" in runs["multi"] and "[p1] step " not in runs["multi"], runs["multi"][-3000:]
  # and the INFO records (auto decisions, eval results): process 1's repeated process 0's (planted back: 11
  # lines, as many as p0)
  info = {pid: re.findall(rf"^\[p{pid}\] I\d{{4}} \d\d:\d\d", runs["multi"], re.M) for pid in (0, 1)}
  assert len(info[0]) > 5 and not info[1], {pid: len(v) for pid, v in info.items()}
  state = two / "checkpoints" / "2" / "state"
  assert sorted(p.name for p in state.glob("ocdbt.process_*")) == ["ocdbt.process_0", "ocdbt.process_1"]
  assert all(any((state / f"ocdbt.process_{i}" / "d").iterdir()) for i in (0, 1))


def test_metrics_and_eval_match_one_process(runs):
  one, two = _rows(runs["root"] / "one"), _rows(runs["two"])
  assert [r["step"] for r in two] == [r["step"] for r in one]
  evals = [r for r in one if "eval/accuracy" in r]
  assert [r["step"] for r in evals] == [0, 2]
  assert {"eval/pass@2", "eval/cons@2", "eval/format_rate", "eval/completion_len_mean"} <= set(evals[0])
  for a, b in zip(one, two):
    keys = {k for k in a if not k.startswith("perf/")}
    assert keys == {k for k in b if not k.startswith("perf/")}
    for k in keys:
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5, equal_nan=True, err_msg=f"step {a['step']} {k}")
  train = [r for r in one if "train/reward_mean" in r]
  # Lengths differ within groups (else the gather check above is weak and the update is 0): a real gradient (3.5
  # and 30.9 with task.train_size 6, 2026-12-08; 4.9 and 20.7 with 64), not rounding residue that AdamW (lr 1e-2)
  # would also turn into a visible update_norm
  assert all(r["train/frac_zero_std_groups"] < 1.0 and r["train/update_norm"] > 1e-4 for r in train), train
  assert all(r["train/grad_norm"] > 1e-3 for r in train), [r["train/grad_norm"] for r in train]
  assert 0 < evals[0]["eval/completion_len_mean"] < L


def test_final_params_match_one_process(runs):
  p1, p2 = _params(runs["root"] / "one", runs["mcfg"]), _params(runs["two"], runs["mcfg"])
  flat1, flat2 = jax.tree_util.tree_leaves_with_path(p1), jax.tree_util.tree_leaves(p2)
  moved = 0.0
  for (path, a), b, init in zip(flat1, flat2, jax.tree.leaves(runs["init"])):
    # Adam divides by sqrt(v): a weight whose gradient is ~0 moves by lr·g/(|g|+eps), so reduction-order noise
    # (one process sums 4 devices, two sum 2+2 over gloo) shows at ~1e-6 absolute (measured 1.25e-6 after the two
    # steps' real gradients with 64 train examples, 2026-12-06; 7.5e-9 with 6, 2026-12-08); 1e-5 is 0.1% of lr, 8x
    # the larger (it was 1e-4 with rtol 1e-4).
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
    moved = max(moved, float(np.abs(np.asarray(a) - np.asarray(init)).max()))
  assert moved > 5e-3  # the runs started from the HF params and moved away from them (lr 1e-2, 2 steps)


def _seen(d) -> list[dict]:
  """What the recorder wrote for each process of a run: topology and rows held (rows_p<i>.json), in process order."""
  return [json.loads(f.read_text()) for f in sorted(d.glob("rows_p*.json"))]


def test_topologies(runs):
  """Each process of the job has its own 2 of the job's 4 devices; the reference is one process with all 4."""
  seen_one, seen_two = _seen(runs["root"] / "seen_one"), _seen(runs["root"] / "seen_two")
  assert [(s["process"], s["processes"], s["devices"], s["local"]) for s in seen_one] == [(0, 1, 4, 4)], seen_one
  assert [(s["process"], s["processes"], s["devices"], s["local"]) for s in seen_two] == [(0, 2, 4, 2), (1, 2, 4, 2)]


def _assembled(d, n: int, step: int, like: dict) -> dict:
  """The params the n processes of a run held at `step`'s save, each leaf put together from their shards (recorded
  by RECORDER); `like`: {keystr: array} of the shapes. A replica held by several devices must agree everywhere."""
  got = {k: np.full(v.shape, np.nan, np.float64) for k, v in like.items()}
  for pid in range(n):
    with np.load(d / f"params_{step}_p{pid}.npz") as shards:
      for key in shards.files:
        path, where = key.split("@")
        at = tuple(slice(a, b) for a, b in json.loads(where))
        held = got[path][at]
        assert np.isnan(held).all() or np.array_equal(held, shards[key]), (d, pid, key)
        got[path][at] = shards[key]
  return got


def test_checkpoint_written_collectively(runs):
  """The step-2 checkpoint that both processes wrote (each its own shards, ocdbt.process_<i>, checked above) restores
  exactly the params the two processes held when they saved it, put together from their shards, as the 1-process
  run's restores its own."""
  for run, d, n in (("seen_one", runs["root"] / "one", 1), ("seen_two", runs["two"], 2)):
    restored = {jax.tree_util.keystr(p): np.asarray(x)
                for p, x in jax.tree_util.tree_leaves_with_path(_params(d, runs["mcfg"]))}
    held = _assembled(runs["root"] / run, n, 2, restored)
    assert held.keys() == restored.keys() and len(held) > 5
    for k in restored:
      assert not np.isnan(held[k]).any(), (run, k)  # every element held by some process
      np.testing.assert_array_equal(held[k], restored[k], err_msg=f"{run} {k}")


def test_each_process_holds_its_own_rows_of_the_single_process_batch(runs):
  """Both processes draw the whole global batch of the arith task (data.rl_batches) and keep their own rows
  (train.device_batch): the rows they held in the job's 2 steps are disjoint, cover the batch, and hold the
  single-process order, as one process with the 4 devices held it and as data.rl_batches here draws it; the second
  batch crosses an epoch."""
  from grpo_jax.tasks import data as data_lib, tokenizer_factory as tok_lib
  c = runs["config"]
  want = [b["index_N"].tolist() for _, b in zip(range(2), data_lib.rl_batches(
      c.task, tok_lib.for_config(c), "train", c.rl.prompts_per_step, c.seed, 0, c.task.prompt_len))]
  assert len(set(want[0] + want[1][:2])) == TRAIN_SIZE, want  # epoch 0: each example once; it ends in step 2
  for run, n in (("seen_one", 1), ("seen_two", 2)):
    held = [s["rows"] for s in _seen(runs["root"] / run)]
    assert len(held) == n and all(len(p) == 2 for p in held), (run, held)  # one batch per step, on every process
    for step in range(2):
      rows = [r for p in held for r in p[step]]
      spans = sorted((start, stop) for start, stop, _ in rows)
      assert spans == [(i, i + 1) for i in range(4)], (run, spans)  # a row per device, no row held twice
      got = [i for _, _, ids in sorted(rows) for i in ids]
      assert got == want[step], (run, step, got, want[step])
    if run == "seen_two":  # 2 devices' rows each; step 1's 4 examples are distinct, so no example is held twice
      mine = [{i for _, _, ids in p[0] for i in ids} for p in held]
      assert len(held[0][0]) == len(held[1][0]) == 2 and len(mine[0] | mine[1]) == 4, mine


FAILING_ALONE = """
import sys
from grpo_jax import cli, main
from grpo_jax.infra import multihost
from grpo_jax.run import jobs

def run(config, workdir):  # the command's start (jobs.run), then process 1 meets a bug the others do not
  multihost.maybe_initialize()
  import jax
  from jax.experimental import multihost_utils
  multihost_utils.sync_global_devices("started")  # the processes have run collectives together (gloo is set up)
  if jax.process_index() == 1:
    raise RuntimeError("planted bug on process 1 only")
  print("process 0 waits in a collective", flush=True)
  multihost_utils.sync_global_devices("never reached by process 1")

jobs.run = run
cli.finish(main.execute(None, ""))
"""


def test_a_bug_on_one_process_exits_1_at_once(tmp_path):
  """A traceback (exit 1) on one process of a multi-process job went through interpreter shutdown, where JAX's
  exit handler waits in a shutdown barrier (300 s) for the other processes, themselves waiting in a collective for
  the failed one: the job hung 5 minutes, then both aborted (SIGABRT, exit status -6, the 1 lost), and the launcher,
  which acts on an exit, saw nothing until then. Now the failed process prints its traceback and exits 1 at once;
  the other's collective then fails (gloo: connection closed by peer) and it exits 1 too (planted back: the
  launcher's 90 s timeout, both killed), with one line saying another process ended, not a traceback of its own
  that read as a second bug and hid the real one among N-1 of them (planted back: '[p0] Traceback')."""
  t0 = time.perf_counter()
  rc, out = _launch_script(tmp_path / "fail_alone.py", FAILING_ALONE, timeout_s=90, grace_s=45)
  took = time.perf_counter() - t0
  assert rc == 1 and "[launch] p1 exited with 1" in out, out[-3000:]
  assert "RuntimeError: planted bug on process 1 only" in out and "process 0 waits in a collective" in out, out
  assert "[launch] p0 exited with 1" in out and "stopping the remaining" not in out, out[-3000:]  # on its own
  assert took < 60, took
  p0 = [l for l in out.splitlines() if l.startswith("[p0] ") and l[5:].strip()]
  assert "[p0] Traceback (most recent call last):" not in p0, out[-3000:]
  assert p0[-1].startswith("[p0] Error: another process of this 2-process job ended mid-run (") and p0[-1].endswith(
      "its own output says why: fix that and rerun the command on every "
      "process (it resumes from the newest checkpoint)."), p0[-5:]
  assert "Gloo" in p0[-1] and ("Connection closed by peer" in p0[-1] or "Connection reset by peer" in p0[-1]), p0[-1]


def test_peer_lost_names_a_gone_process_from_what_jax_says(monkeypatch):
  """What a surviving process's collective raised when another process died, as measured with JAX 0.10.2 (2026-12-06,
  process 1 SIGKILLed): gloo at once, or the coordination service's barrier (orbax's saves wait at one) after the
  100 s heartbeat timeout or, process 0 (the service's host) killed, at once: these two printed a traceback
  (planted back without 'heartbeat timeout': None). Found through
  causes too; any other error is left to the traceback (None)."""
  import jax
  from grpo_jax.infra import multihost
  monkeypatch.setattr(jax, "process_count", lambda: 4)
  gloo = ("UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer "
          "[127.0.0.1]:40347")
  barrier = ("INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: Task 1 heartbeat timeout. This "
             "indicates that the remote task has failed, got preempted, or crashed unexpectedly.")
  leader = ("UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task was preempted/died/"
            "restarted unexpectedly or this task is experiencing network issues.")  # process 0 SIGKILLed
  for text in (gloo, barrier, leader):
    line = multihost.peer_lost(RuntimeError(text))
    assert line == (f"another process of this 4-process job ended mid-run ({text[:300]}); its own output says why: "
                    "fix that and rerun the command on every process (it resumes from the newest checkpoint)."), line
  try:
    try:
      raise ValueError(gloo)
    except ValueError as inner:
      raise RuntimeError("saving step 4 failed") from inner
  except RuntimeError as e:
    assert multihost.peer_lost(e) is not None and gloo in multihost.peer_lost(e)
  assert multihost.peer_lost(RuntimeError("INTERNAL: out of memory")) is None


@pytest.mark.parametrize("env,match", [
    ({"GRPO_JAX_PROCESS_ID": "0"}, r"GRPO_JAX_NUM_PROCESSES=None: GRPO_JAX_COORDINATOR is set, so .* integer"),
    ({"GRPO_JAX_NUM_PROCESSES": "two", "GRPO_JAX_PROCESS_ID": "0"}, r"GRPO_JAX_NUM_PROCESSES='two'"),
    ({"GRPO_JAX_NUM_PROCESSES": "2", "GRPO_JAX_PROCESS_ID": "2"}, r"GRPO_JAX_PROCESS_ID=2 with GRPO_JAX_NUM_PROC"),
    ({"GRPO_JAX_COORDINATOR": "12345", "GRPO_JAX_NUM_PROCESSES": "2", "GRPO_JAX_PROCESS_ID": "0"},
     r"GRPO_JAX_COORDINATOR='12345': must be host:port"),
    ({"GRPO_JAX_COORDINATOR": None}, r"GRPO_JAX_DISTRIBUTED=1: JAX found no cluster to join here \(coordinator_"),
])
def test_bad_launch_env_is_one_line_naming_the_variable(monkeypatch, env, match):
  """A missing or malformed GRPO_JAX_* variable was a KeyError / ValueError traceback (exit 1) before anything ran;
  now an InputError (exit 2, one line) naming it. Nothing joins a job: the checks come first, and JAX's own
  initialize (with no coordinator: cluster detection, which finds nothing here) is stood in for."""
  import jax
  from grpo_jax.infra import errors, multihost

  def initialize(**kwargs):
    assert not kwargs, kwargs  # only reached with no coordinator, as on a pod
    raise ValueError("coordinator_address should be defined.")  # what JAX 0.10 says off a cluster (measured)
  monkeypatch.setattr(jax.distributed, "initialize", initialize)
  monkeypatch.setattr(multihost, "_initialized", False)
  for k in ("GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", "1")
  monkeypatch.setenv("GRPO_JAX_COORDINATOR", "127.0.0.1:1")
  for k, v in env.items():
    if v is None:
      monkeypatch.delenv(k)
    else:
      monkeypatch.setenv(k, v)
  with pytest.raises(errors.InputError, match=match) as e:
    multihost.maybe_initialize()
  assert errors.classify(e.value)[0] == errors.EXIT_INPUT and "\n" not in str(e.value)
  assert not multihost.initialized()


def test_a_distributed_switch_other_than_0_or_1_is_one_line(monkeypatch):
  """GRPO_JAX_DISTRIBUTED=true (or yes, on, 2) was read as 'not 1': every host of a pod ran the whole job alone,
  all writing one workdir. Now an InputError naming it; 0, '' and unset are one process, as before."""
  import jax
  from grpo_jax.infra import errors, multihost
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: pytest.fail("initialize must not be reached"))
  monkeypatch.setattr(multihost, "_initialized", False)
  monkeypatch.delenv("GRPO_JAX_COORDINATOR", raising=False)
  for value in ("true", "yes", "2", " 1"):
    monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", value)
    with pytest.raises(errors.InputError) as e:
      multihost.maybe_initialize()
    assert str(e.value).startswith(f"GRPO_JAX_DISTRIBUTED={value!r}: must be 1") and "\n" not in str(e.value)
    assert errors.classify(e.value)[0] == errors.EXIT_INPUT
  for value in ("0", ""):
    monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", value)
    assert multihost.maybe_initialize() is False
  monkeypatch.delenv("GRPO_JAX_DISTRIBUTED")
  assert multihost.maybe_initialize() is False and not multihost.initialized()


def test_launch_variables_without_the_switch_are_one_line(monkeypatch):
  """GRPO_JAX_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID set by a hand-written launcher that forgot
  GRPO_JAX_DISTRIBUTED=1: every process ran the whole job alone (N runs fighting for one workdir's lock, or N
  silent copies on separate disks). Now an InputError naming the variable and the switch (planted back: False, one
  process); GRPO_JAX_DISTRIBUTED=0 is one process on purpose."""
  import jax
  from grpo_jax.infra import errors, multihost
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: pytest.fail("initialize must not be reached"))
  monkeypatch.setattr(multihost, "_initialized", False)
  for k in ("GRPO_JAX_DISTRIBUTED", "GRPO_JAX_COORDINATOR", "GRPO_JAX_NUM_PROCESSES", "GRPO_JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  monkeypatch.setenv("GRPO_JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("GRPO_JAX_PROCESS_ID", "1")
  for switch in (None, ""):
    if switch is not None:
      monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", switch)
    with pytest.raises(errors.InputError) as e:
      multihost.maybe_initialize()
    assert str(e.value).startswith("GRPO_JAX_NUM_PROCESSES is set but GRPO_JAX_DISTRIBUTED is not: each process "
                                   "would run the whole job alone; set GRPO_JAX_DISTRIBUTED=1"), str(e.value)
    assert errors.classify(e.value)[0] == errors.EXIT_INPUT and "\n" not in str(e.value)
  monkeypatch.setenv("GRPO_JAX_DISTRIBUTED", "0")
  assert multihost.maybe_initialize() is False and not multihost.initialized()


DIFFERING_DATA = """
import sys
import numpy as np
from grpo_jax.infra import errors, multihost
multihost.maybe_initialize()
import jax
import ml_collections
from grpo_jax.infra import sharding
from grpo_jax.run import train
mesh = sharding.make_mesh(ml_collections.ConfigDict(dict(data=2, fsdp=1, tensor=1)))
same = {"index_N": np.arange(4, dtype=np.int32)}
print("same", sorted(int(i) for s in train.device_batch(mesh, same)["index_N"].addressable_shards
                     for i in np.asarray(s.data)), flush=True)
other = {"index_N": np.arange(4, dtype=np.int32) + (jax.process_index() == 1)}  # process 1 read another copy
try:
  train.device_batch(mesh, other)
except errors.InputError as e:
  print(errors.classify(e)[1], flush=True)
  sys.exit(errors.EXIT_INPUT)
"""


def test_processes_that_drew_different_batches_stop_with_one_line(tmp_path):
  """Processes whose batches differ (a host reading another task.data_dir copy): JAX's device_put refused with an
  AssertionError traceback printing both arrays (exit 1, as a bug); now one line naming the field, exit 2 on each.
  The same batch puts each process's own rows (process 0 rows 0-1, process 1 rows 2-3)."""
  rc, out = _launch_script(tmp_path / "differ.py", DIFFERING_DATA, timeout_s=90, grace_s=1)
  assert "[p0] same [0, 1]" in out and "[p1] same [2, 3]" in out, out[-3000:]
  for pid in (0, 1):
    assert f"[launch] p{pid} exited with 2" in out, out[-3000:]
    assert (f"[p{pid}] Error: the 2 processes drew different batches (index_N differs): each must read the same "
            "data: the same task.data_dir copy on every host") in out, out[-3000:]
  assert rc == 2 and "Traceback" not in out, out[-3000:]


ANOTHER_JOB = """
import os, shutil, sys
copy = sys.argv.pop(1)
if os.environ["GRPO_JAX_PROCESS_ID"] == "1":  # this host has its own copy of the code, one file edited, and one
  shutil.copytree("grpo_jax", os.path.join(copy, "grpo_jax"), ignore=shutil.ignore_patterns("__pycache__"))
  with open(os.path.join(copy, "grpo_jax", "rl", "losses.py"), "a") as f:  # more flag than process 0
    f.write("# edited on this host only\\n")
  sys.path.insert(0, copy)
  sys.argv.append("--config.optim.lr=0.5")
from grpo_jax import main
assert main.__file__.startswith(copy) == (os.environ["GRPO_JAX_PROCESS_ID"] == "1"), main.__file__
main._entry()
"""


def test_processes_started_with_another_config_or_code_are_refused(tmp_path):
  """Processes of one job started with different flags (here optim.lr) or different code (a host with its own edited
  copy of the package) ran to the end, exit 0: each compiled its own program from its own config and the
  collectives joined them unchecked (same batches, so device_batch's check saw nothing). Now every process exits 2
  before anything is written: the differing process names each differing key and file with process 0's value and
  its own, process 0 names the process that differs (planted back: the run trains on until the launcher's
  120 s timeout kills it; the baseline probe with 2 steps exited 0 on both, config.json holding process 0's lr)."""
  args = [str(tmp_path / "copy"), "--config=configs/grpo_arith.py:runlocal", f"--workdir={tmp_path / 'w'}"]
  rc, out = _launch_script(tmp_path / "another_job.py", ANOTHER_JOB, args=args, timeout_s=120, grace_s=5)
  assert rc == 2 and "Traceback" not in out, out[-3000:]
  for pid in (0, 1):
    assert f"[launch] p{pid} exited with 2" in out, out[-3000:]
  lines = {pid: [l for l in out.splitlines() if l.startswith(f"[p{pid}] Error: ")] for pid in (0, 1)}
  assert len(lines[0]) == len(lines[1]) == 1, lines
  fix = "start every process with the same --config, --config.* overrides and --workdir"
  code_fix = "give every host the same copy of the repository and the same jax / jaxlib"
  assert lines[0][0].startswith("[p0] Error: process(es) 1 of 2 run another config or --workdir than process 0 "
                                f"(their error lines name what differs): {fix}; process(es) 1 of 2 run other "
                                "code "), lines
  assert lines[1][0].startswith("[p1] Error: process 1 of 2 runs another config or --workdir than process 0 "
                                f"(optim.lr: 0.0001 on process 0, 0.5 here): {fix}; process 1 of 2 runs other code "
                                "(grpo_jax's sources or jax / jaxlib) than process 0 (grpo_jax/rl/losses.py: "), lines
  assert code_fix in lines[0][0] and code_fix in lines[1][0], lines
  assert not (tmp_path / "w").exists()  # refused before the lock or config.json


def test_code_manifest_names_each_source_file_and_the_jax_version(tmp_path):
  """check_same_job compares this manifest between processes: one entry per .py file of the package (an edit to
  one changes that entry alone), none for caches, and the jax / jaxlib versions."""
  import shutil
  import jaxlib
  from grpo_jax.infra import multihost
  pkg = os.path.join(REPO, "grpo_jax")
  shutil.copytree(pkg, tmp_path / "grpo_jax", ignore=shutil.ignore_patterns("__pycache__"))
  (tmp_path / "grpo_jax" / "__pycache__").mkdir(exist_ok=True)
  (tmp_path / "grpo_jax" / "__pycache__" / "x.py").write_text("cache")
  here, copy = multihost.code_manifest(pkg), multihost.code_manifest(str(tmp_path / "grpo_jax"))
  want = sorted(os.path.relpath(os.path.join(d, f), REPO) for d, _, fs in os.walk(pkg) if "__pycache__" not in d
                for f in fs if f.endswith(".py"))
  assert sorted(k for k in here if k.startswith("grpo_jax/")) == want and "grpo_jax/rl/losses.py" in want
  assert here["jax version"] == jax.__version__ and here["jaxlib version"] == jaxlib.__version__
  assert copy == here
  with open(tmp_path / "grpo_jax" / "rl" / "losses.py", "a") as f:
    f.write("#\n")
  edited = multihost.code_manifest(str(tmp_path / "grpo_jax"))
  assert [k for k in here if edited[k] != here[k]] == ["grpo_jax/rl/losses.py"]
