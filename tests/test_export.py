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


def test_cli_prints_one_line_and_exits_2(tmp_path, capsys):
  r = subprocess.run([sys.executable, "-m", "grpo_jax.hf.export", str(tmp_path / "none"), str(tmp_path / "out")],
                     capture_output=True, text=True, cwd=REPO, timeout=120,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
  assert r.stderr.startswith("Error: ") and "config.json is missing" in r.stderr
  # a flag argparse refuses: one line naming it (was the usage block, then the error)
  with pytest.raises(SystemExit) as e:
    export.main([str(tmp_path / "none"), str(tmp_path / "out"), "--step=abc"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "argument --step: invalid int value: 'abc'" in err and err.count("\n") == 1, err


def test_reexport_into_a_stale_sharded_export_replaces_it_whole(tmp_path):
  """OUT_DIR holds an older export in shards + index (other weights): the new export replaces the directory whole
  (no old shard, no old index), and hf_io and a plain safetensors read both get the new weights. A non-empty
  directory that is not an export is refused before anything is written."""
  import jax
  import numpy as np
  from grpo_jax.hf import hf_io, hf_save
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  run = tmp_path / "run"
  run.mkdir()
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
  (run / "config.json").write_text(c.to_json_best_effort())
  mcfg = model_lib.ModelConfig.from_config(c.model)
  new, old = (model_lib.init_params(mcfg, jax.random.PRNGKey(k)) for k in (1, 2))
  params_ckpt.save_params(str(run / "params"), new)
  out = tmp_path / "out"
  hf_save.save_hf(str(out), mcfg, old, max_shard_bytes=40_000)  # the stale export: several shards and an index
  assert os.path.exists(out / "model.safetensors.index.json") and len(list(out.glob("*.safetensors"))) > 1
  export.export(str(run), str(out))
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
  got = hf_io.load_params(str(out), mcfg)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(new)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert not [n for n in os.listdir(tmp_path) if "export-tmp" in n]  # the staging directory was moved in
  other = tmp_path / "notes"
  other.mkdir()
  (other / "todo.txt").write_text("mine")
  with pytest.raises(config_lib.ConfigError, match="is not empty and is not an earlier export"):
    export.export(str(run), str(other))
  assert os.listdir(other) == ["todo.txt"]


def test_an_edited_or_unreadable_config_json_is_one_line(tmp_path):
  """RUN_DIR/config.json that is not JSON (or has no model) was a JSONDecodeError / AttributeError traceback; one
  whose model keys were edited after the run made every checkpoint read as 'damaged or unreadable' (the shapes
  differ), with advice about init checkpoints. Now each is one line naming the file (and the keys, against the
  config stored with the newest checkpoint)."""
  from grpo_jax.infra import errors
  from grpo_jax.run import run_config
  run = _run_dir(tmp_path, steps=(5,))
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  step = os.path.join(run, "checkpoints", "5")
  os.makedirs(os.path.join(step, "meta"))
  with open(os.path.join(step, "meta", "metadata"), "w") as f:
    f.write(json.dumps({"step": 5, "config": run_config.view(c, "rl")}))
  open(os.path.join(step, "commit_success.txt"), "w").close()
  path = os.path.join(run, "config.json")
  edited = json.loads(open(path).read())
  edited["model"]["hidden"] = 32
  open(path, "w").write(json.dumps(edited))
  with pytest.raises(errors.InputError, match=r"config.json differs from the config stored with checkpoint 5 in "
                                              r"model.hidden \(64 stored, 32 in config.json\): it was edited"):
    export.export(run, str(tmp_path / "out"))
  for text, msg in (("{not json", "does not read"), ("[1]", "holds no 'model' section"), ("{}", "no 'model'")):
    open(path, "w").write(text)
    with pytest.raises(errors.InputError, match=msg):
      export.export(run, str(tmp_path / "out"))
  assert not os.path.exists(tmp_path / "out")


def test_an_export_error_line_is_the_last_line(monkeypatch, tmp_path, capsys):
  """A run whose every checkpoint is damaged: orbax's event loop, closed at exit, printed 'an exception was ignored
  during cleanup' after the one error line; export.main now silences the libraries before it prints."""
  from grpo_jax.infra import console
  from grpo_jax.infra import errors

  def damaged(*_, **__):
    raise errors.InputError("no restorable checkpoint with params in RUN/checkpoints")
  monkeypatch.setattr(export, "export", damaged)
  monkeypatch.setattr(console, "setup_logging", lambda verbose: None)
  try:
    assert export.main([str(tmp_path / "run"), str(tmp_path / "out")]) == 2
    assert console._silenced.is_set()  # pylint: disable=protected-access
  finally:
    console._silenced.clear()  # pylint: disable=protected-access
  assert capsys.readouterr().err == "Error: no restorable checkpoint with params in RUN/checkpoints\n"


def test_export_replaces_only_an_earlier_export_and_keeps_its_model_card(tmp_path):
  """Data that an export replaced whole: the run's own hf: base (export RUN DIR_OF_ITS_BASE: the base gone, a LoRA
  run's adapters unrestorable), another program's checkpoint of the same file names (transformers' save_pretrained:
  config.json + model.safetensors), and the README.md model card kept in an earlier export. Now the first two are
  refused in one line, untouched, and the card is carried into the new export."""
  import jax
  import numpy as np
  from grpo_jax.hf import hf_save
  from grpo_jax.hf import safetensors_io as st
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  base = tmp_path / "base"
  hf_save.save_hf(str(base), mcfg, model_lib.init_params(mcfg, jax.random.PRNGKey(2)))
  c.train.init_from = f"hf:{base}"
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(c.to_json_best_effort())
  params_ckpt.save_params(str(run / "params"), model_lib.init_params(mcfg, jax.random.PRNGKey(1)))
  before = {p.name: p.read_bytes() for p in base.iterdir()}
  with pytest.raises(config_lib.ConfigError, match=r"is the run's base checkpoint \(train.init_from\) directory"):
    export.export(str(run), str(base) + "/")
  assert {p.name: p.read_bytes() for p in base.iterdir()} == before
  foreign = tmp_path / "foreign"  # what transformers writes: the same names, its own metadata
  foreign.mkdir()
  (foreign / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
  w = np.ones((4, 4), np.float32)
  st.write(str(foreign / "model.safetensors"), [("model.norm.weight", w.shape, w.dtype)], lambda _: w,
           {"format": "pt"})
  with pytest.raises(config_lib.ConfigError, match="or weights another program wrote"):
    export.export(str(run), str(foreign))
  assert sorted(os.listdir(foreign)) == ["config.json", "model.safetensors"]
  out = tmp_path / "out"
  export.export(str(run), str(out))
  (out / "README.md").write_text("my model card")
  export.export(str(run), str(out))  # an earlier export: replaced, its card kept
  assert (out / "README.md").read_text() == "my model card"
  assert sorted(os.listdir(out)) == ["README.md", "config.json", "model.safetensors"]


def test_a_stage_directory_exports_from_its_stage_record(tmp_path):
  """A stage's directory (an R1 pipeline's DIR/r1_2_grpo, the main job's DIR/sft) holds params/ or checkpoints/ and
  stage.json, but config.json only in DIR: export refused it ('config.json is missing'), so no stage but a whole
  run could be exported. Now the stage's recorded config stands for it; DIR itself names a stage to export."""
  import jax
  import numpy as np
  from grpo_jax.hf import hf_io
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  from grpo_jax.run import run_config
  from grpo_jax.run import stages
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64, tie_embeddings=False)
  mcfg = model_lib.ModelConfig.from_config(c.model)
  stage = tmp_path / "run" / "r1_2_grpo"
  stage.mkdir(parents=True)
  params = model_lib.init_params(mcfg, jax.random.PRNGKey(3))
  params_ckpt.save_params(str(stage / "params"), params)
  (stage / stages.RECORD).write_text(json.dumps({"done": True, "steps": 2, "config": run_config.view(c, "rl")}))
  with pytest.raises(config_lib.ConfigError, match=r"run/config.json is missing; .* or one stage's \(holding "
                                                   r"stage.json\), e.g. .*run/r1_2_grpo\."):
    export.export(str(tmp_path / "run"), str(tmp_path / "out"))
  summary = export.export(str(stage), str(tmp_path / "out"))
  assert summary["step"] == 0 and summary["model_type"] == "qwen2"
  got = hf_io.load_params(str(tmp_path / "out"), hf_io.read_config(str(tmp_path / "out")))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_what_a_killed_export_left_beside_out_dir_is_removed(tmp_path):
  """A killed export left OUT.export-tmp-<pid> (a half-written model) and, killed between its two renames,
  OUT.export-tmp-<pid>.old (the earlier export): each up to the model's size, never read or removed again. The next
  export on the host removes those of processes that are gone; a live process's staging is left alone."""
  import socket
  import subprocess
  import jax
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  c.model.update(hidden=32, layers=1, heads=2, kv_heads=1, inter=64)
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(c.to_json_best_effort())
  params_ckpt.save_params(str(run / "params"),
                          model_lib.init_params(model_lib.ModelConfig.from_config(c.model), jax.random.PRNGKey(1)))
  gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  host = socket.gethostname()
  left = [tmp_path / f"out.export-tmp-{host}-{gone.stdout.strip()}", tmp_path / f"out.export-tmp-{host}-{gone.stdout.strip()}.old"]
  live = tmp_path / f"out.export-tmp-{host}-1"  # pid 1 runs
  other = tmp_path / f"out.export-tmp-otherhost-{gone.stdout.strip()}"  # another host's: its pids are not ours
  for d in (*left, live, other):
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"half")
  export.export(str(run), str(tmp_path / "out"))
  assert sorted(os.listdir(tmp_path)) == sorted(["run", "out", live.name, other.name])


def test_a_step_of_a_run_without_checkpoints_is_refused(tmp_path):
  """A run with only its final params/ (an SFT run) and export.step=5: the step was ignored and params/ written as
  'step 0', a model the user did not ask for; a negative step read as a missing checkpoint. Both are one line now,
  nothing written."""
  import jax
  from grpo_jax.infra import params_ckpt
  from grpo_jax.model import model as model_lib
  run = _run_dir(tmp_path)
  c = config_lib.load_config(os.path.join(REPO, "configs", "grpo_arith.py"), "small")
  params_ckpt.save_params(os.path.join(run, "params"),
                          model_lib.init_params(model_lib.ModelConfig.from_config(c.model), jax.random.PRNGKey(0)))
  with pytest.raises(config_lib.ConfigError, match=r"export.step=5: .* has no committed checkpoint \(only the final "
                                                   r"params/, step 0, if any\); leave export.step at 0"):
    export.export(run, str(tmp_path / "out"), step=5)
  with pytest.raises(config_lib.ConfigError, match=r"export.step=-2: use a checkpoint's step, or 0 for the newest"):
    export.export(run, str(tmp_path / "out"), step=-2)
  assert not os.path.exists(tmp_path / "out")
