"""Two processes (jax.distributed on localhost, gloo) × 2 CPU devices give the same GRPO run as one process × 4.

Both runs execute RUN_SCRIPT: the peers' workload (tasks/digits.py: random Qwen2-shaped model, in-graph reward, no
tokenizer or dataset) on a data=2 × fsdp=2 mesh, so params are sharded across the two processes and every batch
goes through train.device_batch; 2 GRPO steps, then a collective orbax checkpoint. Metrics and all-gathered final
params must agree with the 1-process run within fp32 tolerance.
"""
import io
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "launch"))
import local_multiprocess  # noqa: E402

DATA_TASK = dict(name="arith", max_digits=2, train_size=20, test_size=8)
RUN_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    DATA_TASK = %r
    T0 = time.perf_counter()
    from grpo_jax.infra import multihost
    multihost.maybe_initialize()
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from grpo_jax.infra import checkpoint as ckpt_lib
    from grpo_jax.infra import params_ckpt
    from grpo_jax.rl import families
    from grpo_jax.model import model as model_lib
    from grpo_jax.rl import rl_step
    from grpo_jax.infra import sharding
    from grpo_jax.tasks import digits
    from grpo_jax.run import train
    out = sys.argv[1]
    c = digits.bench_config(hidden=32, layers=1, heads=2, kv=1, inter=64, vocab=16, prompts=4, G=4, L=8)  # 10 of 16 ids are digits: rewards vary
    c.optim.lr = 1e-2  # large, so that two updates move the params visibly
    c.mesh.update(data=2, fsdp=2)
    mesh = sharding.make_mesh(c.mesh)
    mcfg = model_lib.ModelConfig.from_config(c.model)
    spec = digits.reward_spec(c.model.vocab_size)
    step = families.make_step(c, mesh, mcfg, spec, spec.ctx.tokenizer)
    ck = ckpt_lib.Checkpointer(os.path.join(out, "checkpoints"), save_every=2, keep=1)
    state, _ = train.init_or_restore(c, mesh, mcfg, rl_step, ck, "")
    rows = []
    for i, batch in enumerate(digits.make_batches(4, 2, seed=0)):
      batch["answer_ids_NxA"][:, 1:] = -1  # reward: the sum's first digit appears (some do, some don't)
      state, m = step(state, train.device_batch(mesh, batch))
      rows.append({"step": i + 1, **{k: float(np.asarray(v)) for k, v in m.items()
                                      if not k.startswith("samples/") and k != "reward_status"}})
    T1 = time.perf_counter()
    ck.maybe_save(2, state, {"step": 2}, force=True)
    ck.wait()
    ck.close()
    # The text data path as the CLI feeds it: every process draws the whole global batch (data.rl_batches, the
    # single-process order) and train.device_batch keeps its own rows; each writes the rows it holds.
    from grpo_jax.tasks import data as data_lib, tokenizer as tok_lib
    task = dict(DATA_TASK, data_dir=sys.argv[2])
    shares = []
    for _, b in zip(range(3), data_lib.rl_batches(task, tok_lib.load(), "train", 8, 3, 0, 48)):  # step 2 crosses an epoch
      held = train.device_batch(mesh, b)["index_N"].addressable_shards
      shares.append(sorted([s.index[0].start, s.index[0].stop, np.asarray(s.data).tolist()] for s in held))
    with open(os.path.join(out, f"data_p{jax.process_index()}.json"), "w") as f:
      json.dump(shares, f)
    params = multihost_utils.process_allgather(state["params"], tiled=True)
    leaves = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    if jax.process_index() == 0:
      np.savez(os.path.join(out, "params.npz"), **leaves)
      with open(os.path.join(out, "rows.json"), "w") as f:
        json.dump(rows, f)
    print(f"RESULT process={jax.process_index()} of {jax.process_count()} devices={jax.device_count()} "
          f"local={jax.local_device_count()} setup+steps={T1 - T0:.1f}s ckpt+gather={time.perf_counter() - T1:.1f}s",
          flush=True)
""") % (DATA_TASK,)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("multihost")
  script = root / "run.py"
  script.write_text(RUN_SCRIPT)
  from grpo_jax.tasks import data as data_lib
  for split in ("train", "test"):  # built here once: the runs only read it
    data_lib.load_examples(dict(DATA_TASK, data_dir=str(root / "tfds")), split)
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4").strip()
  t0 = time.perf_counter()
  # The 1-process reference runs while the 2-process job does: compiles overlap, the test takes ~the longer one.
  single = subprocess.Popen([sys.executable, str(script), str(root / "one"), str(root / "tfds")], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  log = io.StringIO()
  rc = local_multiprocess.launch(2, script=str(script), args=[str(root / "two"), str(root / "tfds")], devices_per_process=2,
                                 timeout_s=240, python=sys.executable, out=log)
  t1 = time.perf_counter()
  single_out, _ = single.communicate(timeout=240)
  t2 = time.perf_counter()
  assert rc == 0, log.getvalue()
  assert single.returncode == 0, single_out
  print(f"2 processes: {t1 - t0:.1f}s, 1 process done at {t2 - t0:.1f}s\n{single_out}{log.getvalue()}")
  return dict(root=root, single=single_out, multi=log.getvalue())


def _load(d):
  with open(d / "rows.json") as f:
    rows = json.load(f)
  return rows, dict(np.load(d / "params.npz"))


def test_topologies(runs):
  assert "RESULT process=0 of 1 devices=4 local=4 " in runs["single"]
  for pid in (0, 1):
    assert f"[p{pid}] RESULT process={pid} of 2 devices=4 local=2 " in runs["multi"], runs["multi"]


def test_metrics_match_single_process(runs):
  one, _ = _load(runs["root"] / "one")
  two, _ = _load(runs["root"] / "two")
  assert [r["step"] for r in two] == [1, 2] and set(one[0]) == set(two[0])
  for a, b in zip(one, two):
    for k in a:
      np.testing.assert_allclose(b[k], a[k], rtol=1e-4, atol=1e-5, err_msg=k)
  # The runs did learn something: a non-zero update, so equal params below are not just equal inits; and a real
  # gradient (0.57 and 0.79, 2026-12-06), not a zero-advantage batch's rounding residue, which AdamW (lr 1e-2) would
  # also turn into a visible update_norm
  assert all(r["train/update_norm"] > 1e-4 for r in one), [r["train/update_norm"] for r in one]
  assert all(r["train/grad_norm"] > 1e-3 for r in one), [r["train/grad_norm"] for r in one]


def test_final_params_match_single_process(runs):
  _, p1 = _load(runs["root"] / "one")
  _, p2 = _load(runs["root"] / "two")
  assert p1.keys() == p2.keys() and len(p1) > 5
  # Adam moves every element by up to ~lr (1e-2) per step whatever its gradient's size, so a near-zero gradient
  # whose last bits differ between the 2-process and 1-process reduction orders can move by ~1e-6: atol 1e-5 is
  # 1e-3 of one step (a wrong gradient or a dropped shard moves elements by ~1e-2). Measured 1.4e-6 after the two
  # steps' real gradients (2026-12-06): 7x inside; rtol 0 (an rtol 1e-4 let elements near 1 differ by 1e-4).
  for k in p1:
    np.testing.assert_allclose(p2[k], p1[k], rtol=0, atol=1e-5, err_msg=k)


def test_checkpoint_written_collectively(runs):
  from grpo_jax.infra import params_ckpt
  import jax
  _, p2 = _load(runs["root"] / "two")
  ckdir = runs["root"] / "two" / "checkpoints"
  abstract = jax.eval_shape(lambda: _nested(p2))
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), abstract)
  restored = params_ckpt.restore_params_only(str(ckdir), abstract, step=2).params
  got = {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(restored)[0]}
  for k in p2:
    np.testing.assert_array_equal(got[k], p2[k], err_msg=k)


def _nested(flat: dict):
  """{"['a']['b']": x} (jax keystr paths) back into nested dicts."""
  out: dict = {}
  for path, x in flat.items():
    keys = [k.strip("'\"") for k in path.strip("[]").split("][")]
    d = out
    for k in keys[:-1]:
      d = d.setdefault(k, {})
    d[keys[-1]] = x
  return out


def test_each_process_holds_its_own_rows_of_the_single_process_batch(runs):
  """Two processes each draw the whole global batch of the arith task (data.rl_batches) and keep their own rows
  (train.device_batch): the rows they hold are disjoint, cover the batch, and hold the single-process order, as
  one process with the 4 devices holds it and as data.rl_batches here draws it; the third batch crosses an epoch."""
  from grpo_jax.tasks import data as data_lib, tokenizer as tok_lib
  want = [b["index_N"].tolist() for _, b in zip(range(3), data_lib.rl_batches(
      dict(DATA_TASK, data_dir=str(runs["root"] / "tfds")), tok_lib.load(), "train", 8, 3, 0, 48))]
  assert len(set(want[0] + want[1] + want[2][:4])) == 20  # epoch 0: each of the 20 examples once
  for run, files in (("one", ["data_p0.json"]), ("two", ["data_p0.json", "data_p1.json"])):
    held = [json.load(open(runs["root"] / run / f)) for f in files]
    for step in range(3):
      rows = [r for p in held for r in p[step]]
      spans = sorted((start, stop) for start, stop, _ in rows)
      assert [a for a, _ in spans] == list(range(0, 8, 2)) and all(b == a + 2 for a, b in spans), (run, spans)
      got = [i for _, _, ids in sorted(rows) for i in ids]
      assert got == want[step], (run, step, got, want[step])
    if run == "two":  # 2 devices' rows each; step 0's 8 examples are distinct, so no example is held twice
      mine = [{i for _, _, ids in p[0] for i in ids} for p in held]
      assert len(held[0][0]) == len(held[1][0]) == 2 and len(mine[0] | mine[1]) == 8, mine
