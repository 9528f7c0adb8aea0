"""Config changes on resume are explicit: the diff, which keys can be allowed, the history, and stage planning."""
import json
import os

import pytest

from grpo_jax.config import config_lib
from grpo_jax.infra import errors
from grpo_jax.run import run_config
from grpo_jax.run import stages


def _cfg(**groups):
  c = config_lib.base_config()
  for g, vals in groups.items():
    c[g].update(vals)
  return c


def test_view_drops_what_a_kind_does_not_read_and_bookkeeping():
  c = _cfg()
  rl, sft = run_config.view(c, "rl"), run_config.view(c, "sft")
  assert "rl.G" in rl and "sft.steps" not in rl and "optim.lr" in rl and "model.hidden" in rl
  assert "sft.steps" in sft and "rl.G" not in sft and "rewards" not in sft and "train.steps" not in sft
  for v in (rl, sft):
    assert not any(k.startswith("log.") or k in ("train.log_every", "train.ckpt_every") for k in v)
  assert rl["stage.kind"] == "rl" and rl["rewards"] == [["accuracy", 1.0], ["format", 0.2]]
  # Bookkeeping changes are no difference; an SFT view ignores RL knobs.
  c2 = _cfg(log=dict(tensorboard=False), train=dict(log_every=7, ckpt_every=3), rl=dict(G=4))
  assert run_config.diff(sft, run_config.view(c2, "sft")) == []
  assert run_config.diff(rl, run_config.view(c2, "rl")) == ["rl.G"]


@pytest.mark.parametrize("changes,hard", [
    ({"model": {"hidden": 32}}, ["model.hidden"]),
    ({"rl": {"beta": 0.0}}, ["rl.beta"]),
    ({"rl": {"algo": "ppo"}}, ["rl.algo"]),
    ({"ppo": {"critic": "head"}}, ["ppo.critic"]),
    ({"job": "sft"}, ["job"]),
    ({"rl": {"beta": 0.02}}, []),          # 0.04 -> 0.02: both > 0, same reference
    ({"rl": {"algo": "rloo"}}, []),        # same state tree
    ({"optim": {"lr": 3e-4, "grad_clip": 0.0}}, []),
    ({"rl": {"partial_rollouts": True}}, ["rl.partial_rollouts"]),  # the carry joins the state
    ({"rl": {"max_staleness": 2, "carry_kv": "recompute"}}, []),  # no carry in the state
    ({"rl": {"partial_rollouts": True, "max_staleness": 2, "carry_kv": "recompute"}, "sampling": {"slots": 16},
      "_old": {"rl": {"partial_rollouts": True}}}, ["rl.max_staleness", "sampling.slots"]),  # the carry's shapes
    # the carry's KV dtype: a bf16 sampler's (it was allowed, then every checkpoint failed its checksum as
    # "unusable"); naming the model's own dtype changes nothing
    ({"rl": {"partial_rollouts": True}, "sampling": {"dtype": "bfloat16"}, "_old": {"rl": {"partial_rollouts": True}}},
     ["sampling.dtype"]),
    ({"rl": {"partial_rollouts": True}, "sampling": {"dtype": "float32"}, "_old": {"rl": {"partial_rollouts": True}}},
     []),
    ({"sampling": {"dtype": "bfloat16"}}, []),  # no carry: the sampler's dtype is no leaf of the state
    # the carry's observation buffers (multi-turn rows): an environment added, or a wider observation, under the
    # carry; without an environment the width is no leaf; without the carry neither key is
    ({"rl": {"partial_rollouts": True}, "tools": {"env": "calculator"}, "_old": {"rl": {"partial_rollouts": True}}},
     ["tools.env"]),
    ({"rl": {"partial_rollouts": True}, "tools": {"env": "calculator", "max_obs_tokens": 16},
      "_old": {"rl": {"partial_rollouts": True}, "tools": {"env": "calculator"}}}, ["tools.max_obs_tokens"]),
    ({"rl": {"partial_rollouts": True}, "tools": {"max_obs_tokens": 16}, "_old": {"rl": {"partial_rollouts": True}}},
     []),
    ({"tools": {"env": "calculator"}}, []),
])
def test_structural_keys(changes, hard):
  old = run_config.view(_cfg(**changes.get("_old", {})), "rl")
  c = _cfg(**{g: v for g, v in changes.items() if g not in ("job", "_old")})
  if "job" in changes:
    c.job = changes["job"]
  new = run_config.view(c, "rl")
  changed = run_config.diff(old, new)
  assert set(run_config.structural(changed, old, new)) == set(hard)


def test_check_refuses_lists_keys_and_allows_explicitly(tmp_path):
  old = run_config.view(_cfg(), "rl")
  new = run_config.view(_cfg(rl=dict(G=4), optim=dict(lr=1e-3)), "rl")
  with pytest.raises(errors.InputError) as e:
    run_config.check(old, new, set(), where="checkpoint X/4", workdir_hint=str(tmp_path))
  msg = str(e.value)
  assert "optim.lr (1e-05 → 0.001)" in msg and "rl.G (8 → 4)" in msg and "\n" not in msg
  assert "--config.train.allow_config_change=optim.lr,rl.G" in msg and "new --workdir" in msg
  with pytest.raises(errors.InputError, match="allow_config_change=optim.lr,rl.G"):
    run_config.check(old, new, {"rl.G"}, where="X", workdir_hint="d")  # every changed key must be listed
  assert run_config.check(old, new, {"rl.G", "optim.*"}, where="X", workdir_hint="d") == ["optim.lr", "rl.G"]
  hard = run_config.view(_cfg(model=dict(hidden=32)), "rl")
  with pytest.raises(errors.InputError, match="model.hidden changes the saved state's structure") as e:
    run_config.check(old, hard, {"model.hidden"}, where="X", workdir_hint="d")
  assert "allow_config_change" not in str(e.value)  # no flag can continue it
  assert run_config.check(None, new, set(), where="X", workdir_hint="d") == []  # old checkpoint: warning only
  # a hand-edited record (a checkpoint's meta or stage.json) whose config is no mapping was an AttributeError
  for damaged in ("garbage", [1, 2], {1: 2}):
    with pytest.raises(errors.InputError, match=r"^checkpoint X/4 holds a damaged config record .* new --workdir"):
      run_config.check(damaged, new, set(), where="checkpoint X/4", workdir_hint="d")


def test_parse_allow_names_unknown_keys():
  keys = run_config.flatten(_cfg())
  assert run_config.parse_allow(" optim.lr, config.rl.G ,optim.*", keys) == {"optim.lr", "rl.G", "optim.*"}
  with pytest.raises(errors.ConfigError, match="config.train.allow_config_change: 'rl.GG'"):
    run_config.parse_allow("rl.GG", keys)


def test_record_change_writes_history(tmp_path):
  old = run_config.view(_cfg(), "rl")
  new = run_config.view(_cfg(rl=dict(G=4)), "rl")
  run_config.record_change(str(tmp_path), 6, old, new, ["rl.G"])
  assert json.loads((tmp_path / "config.0.json").read_text()) == old
  h6 = json.loads((tmp_path / "config.6.json").read_text())
  assert h6["rl.G"] == 4 and h6["changed_keys"] == ["rl.G"]
  newer = run_config.view(_cfg(rl=dict(G=2)), "rl")
  run_config.record_change(str(tmp_path), 9, new, newer, ["rl.G"])
  assert sorted(os.listdir(tmp_path)) == ["config.0.json", "config.6.json", "config.9.json"]  # 0 written once
  assert run_config.change_metrics(["rl.G"]) == {"config_change/rl.G": 1}
  from grpo_jax.run import metrics
  metrics.check_names(run_config.change_metrics(["rl.G", "optim.lr"]))


def _stage(tmp_path, name, cfg, kind="sft", **kw):
  return stages.Stage(name, str(tmp_path / name), run_config.view(cfg, kind), steps=4, **kw)


def test_plan_skips_same_refuses_changed_and_reruns_on_request(tmp_path):
  c = _cfg(sft=dict(steps=4))
  st = _stage(tmp_path, "sft", c)
  assert stages.plan([st], c, str(tmp_path)) == {"sft": "start"}
  stages.mark_done(st)
  assert stages.is_done(st) and stages.plan([st], c, str(tmp_path)) == {"sft": "skip"}
  c2 = _cfg(sft=dict(steps=8))
  st2 = _stage(tmp_path, "sft", c2)
  with pytest.raises(errors.InputError) as e:
    stages.plan([st2], c2, str(tmp_path))
  msg = str(e.value)
  assert "finished stage sft" in msg and "sft.steps (4 → 8)" in msg and "rerun_stages=sft" in msg
  c2.train.allow_config_change = "sft.steps"
  assert stages.plan([st2], c2, str(tmp_path)) == {"sft": "continue"}
  stages.prepare(st2, "continue", str(tmp_path))
  assert not stages.is_done(st2)
  stages.mark_done(st2)
  c3 = _cfg(sft=dict(steps=8, lr=1.0))
  c3.train.rerun_stages = "sft"
  st3 = _stage(tmp_path, "sft", c3)
  assert stages.plan([st3], c3, str(tmp_path)) == {"sft": "rerun"}
  stages.prepare(st3, "rerun", str(tmp_path))
  # the old directory moved aside; the new one holds only the running record (written before the stage writes)
  assert os.listdir(st3.directory) == [stages.RECORD] and stages.read_record(st3.directory)["done"] is False
  (moved,) = os.listdir(tmp_path / stages.REPLACED)
  assert moved.startswith("sft-") and os.path.exists(tmp_path / stages.REPLACED / moved / stages.RECORD)
  c3.train.rerun_stages = "nope"
  with pytest.raises(errors.ConfigError, match="rerun_stages: 'nope'"):
    stages.plan([st3], c3, str(tmp_path))
  c3.train.rerun_stages = ""
  stages.mark_done(st3, config="edited")  # a finished record whose config is no mapping: one line, not a traceback
  with pytest.raises(errors.InputError, match=r"finished stage sft .* holds a damaged config record \(str 'edited'"):
    stages.plan([st3], c3, str(tmp_path))


def test_another_jobs_finished_stage_is_named_and_the_diff_kept_short(tmp_path):
  """job=sft on a finished GRPO run's directory: was a ~4,000-character line calling the record 'the finished
  stage sft' and listing all ~80 keys; now the record's own kind, the structural keys first, the rest counted."""
  rl = stages.Stage("sft", str(tmp_path / "run"), run_config.view(_cfg(), "rl"), steps=4)
  stages.mark_done(rl)
  c = _cfg()
  c.job = "sft"
  sft = stages.Stage("sft", str(tmp_path / "run"), run_config.view(c, "sft"), steps=4)
  with pytest.raises(errors.InputError) as e:
    stages.plan([sft], _cfg(), str(tmp_path))
  msg = str(e.value)
  assert "the finished rl stage of another job" in msg and "stage.kind ('rl' → 'sft')" in msg, msg
  assert "more key(s)" in msg and len(msg) < 1500 and "\n" not in msg, msg


def test_changed_upstream_shows_downstream(tmp_path):
  """A stage built on another records the other's fingerprint: continuing the upstream flags the downstream."""
  c = _cfg(sft=dict(steps=4))
  up = _stage(tmp_path, "sft", c)
  down = stages.Stage("rl", str(tmp_path), run_config.view(c, "rl", extra={"stage.upstream": stages.upstream(up)}),
                      steps=4, own_dir=False)
  stages.mark_done(up)
  stages.mark_done(down)
  c2 = _cfg(sft=dict(steps=8))
  c2.train.allow_config_change = "sft.steps"
  up2 = _stage(tmp_path, "sft", c2)
  down2 = stages.Stage("rl", str(tmp_path), run_config.view(c2, "rl", extra={"stage.upstream": stages.upstream(up2)}),
                       steps=4, own_dir=False)
  with pytest.raises(errors.InputError, match=r"stage.upstream \(stage sft it starts from changed\)"):
    stages.plan([up2, down2], c2, str(tmp_path))
  c2.train.rerun_stages = "rl"
  with pytest.raises(errors.ConfigError, match="'rl' is the run in --workdir itself"):
    stages.plan([up2, down2], c2, str(tmp_path))


def test_a_lora_change_after_a_full_weight_sft_stage_names_the_rl_checkpoint(tmp_path):
  """model.lora.rank 2 → 4 after the grpo job's SFT stage (sft.lora off: full weights, no adapters): was refused at
  the finished SFT stage with 'redo the stage with rerun_stages=sft', which does not help (the RL stage's adapters
  have rank 2) and refused even before the RL stage had a checkpoint. Now the SFT stage is unchanged in what it reads;
  a fresh RL stage starts from it, a recorded one is refused for its adapters' shapes, pointing a new run at
  DIR/sft/params."""
  def stages_for(rank):
    c = _cfg(sft=dict(steps=4), model=dict(lora=dict(rank=rank)))
    sft = _stage(tmp_path, "sft", c)
    rl = stages.Stage("rl", str(tmp_path), run_config.view(c, "rl", extra={"stage.upstream": stages.upstream(sft)}),
                      steps=4, own_dir=False)
    return c, [sft, rl]
  c, (sft, rl) = stages_for(2)
  stages.mark_done(sft)
  c4, todo4 = stages_for(4)
  assert stages.plan(todo4, c4, str(tmp_path)) == {"sft": "skip", "rl": "start"}
  stages.mark_done(rl)
  with pytest.raises(errors.InputError) as e:
    stages.plan(todo4, c4, str(tmp_path))
  msg = str(e.value)
  assert "finished stage rl" in msg and "model.lora.rank (2 → 4); model.lora.rank changes" in msg, msg
  assert "the shapes of the LoRA adapters" in msg and "rerun_stages" not in msg and "stage.upstream" not in msg, msg
  assert msg.endswith(f"--config.train.init_from={tmp_path / 'sft' / 'params'}."), msg
  # under sft.lora the SFT stage trains adapters itself: a rank change is its own (redo it)
  c8 = _cfg(sft=dict(steps=4, lora=True), model=dict(lora=dict(rank=8)))
  with pytest.raises(errors.InputError, match=r"finished stage sft .*model.lora.rank \(2 → 8\).*rerun_stages=sft"):
    stages.plan([_stage(tmp_path, "sft", c8)], c8, str(tmp_path))


def test_legacy_sft_params_done_only_with_last_step(tmp_path):
  c = _cfg(sft=dict(steps=4))
  st = _stage(tmp_path, "sft", c, legacy_outputs=("params",))
  os.makedirs(os.path.join(st.directory, "params"))
  step_dir = os.path.join(st.directory, "checkpoints", "2")
  os.makedirs(step_dir)
  open(os.path.join(step_dir, "commit_success.txt"), "w").close()
  assert not stages.is_done(st)  # an old version wrote params after a SIGTERM at step 2 of 4
  assert stages.plan([st], c, str(tmp_path)) == {"sft": "resume"}
  step_dir = os.path.join(st.directory, "checkpoints", "4")
  os.makedirs(step_dir)
  open(os.path.join(step_dir, "commit_success.txt"), "w").close()
  assert stages.is_done(st) and stages.plan([st], c, str(tmp_path)) == {"sft": "skip"}
  # The same outputs under a running record (written by every stage before its first output) are a stage killed
  # between its params and its done record: resumed, never skipped as "finished before records".
  stages.mark_running(st)
  assert not stages.is_done(st) and stages.plan([st], c, str(tmp_path)) == {"sft": "resume"}
  stages.mark_done(st)
  assert stages.is_done(st) and stages.plan([st], c, str(tmp_path)) == {"sft": "skip"}


def test_a_stage_is_not_shortened_below_its_newest_checkpoint(tmp_path):
  """sft.steps 4 -> 2 with train.allow_config_change: the loop had nothing to run and the stage was marked done at 2
  steps holding step 4's params (an R1 RL stage took checkpoint 2's, or failed where it was gone). Refused, finished
  or not; more steps, or a resume at exactly the last step, go on."""
  def checkpoint(st, step):
    d = os.path.join(st.directory, "checkpoints", str(step))
    os.makedirs(d)
    open(os.path.join(d, "commit_success.txt"), "w").close()

  c4 = _cfg(sft=dict(steps=4))
  st = _stage(tmp_path, "sft", c4)
  checkpoint(st, 4)
  stages.mark_running(st)
  assert stages.plan([st], c4, str(tmp_path)) == {"sft": "resume"}  # killed after its last step, before its record
  stages.mark_done(st)
  c2 = _cfg(sft=dict(steps=2))
  c2.train.allow_config_change = "sft.steps"
  short = stages.Stage("sft", st.directory, run_config.view(c2, "sft"), steps=2)
  for running in (False, True):
    if running:
      stages.mark_running(st)
    with pytest.raises(errors.InputError, match=r"^stage sft has trained to step 4, past the 2 steps this config gives "
                                                r"it, and a stage cannot be shortened; restore its step count, redo "
                                                r"the stage with --config.train.rerun_stages=sft"):
      stages.plan([short], c2, str(tmp_path))
  c8 = _cfg(sft=dict(steps=8))
  c8.train.allow_config_change = "sft.steps"
  assert stages.plan([stages.Stage("sft", st.directory, run_config.view(c8, "sft"), steps=8)], c8,
                     str(tmp_path)) == {"sft": "resume"}


def test_added_task_key_at_its_default_keeps_older_records_resumable():
  """task.overlong_prompts (added with the prompt-length check) at its default 'error' is what older runs did: a
  record without it equals one with it (same view, same fingerprint); another value is a change."""
  c = _cfg()
  old = {k: v for k, v in run_config.view(c, "rl").items()}
  assert "task.overlong_prompts" not in old
  assert run_config.diff(old, run_config.view(c, "rl")) == []
  c.task.overlong_prompts = "drop"
  assert run_config.diff(old, run_config.view(c, "rl")) == ["task.overlong_prompts"]


def test_auto_knobs_compare_by_what_the_run_resolved():
  """An `auto` key in the new view matches whatever the record ran with (its `resolved.<key>`, or the value a run
  from before the key became auto set): the resume reuses it. An explicit value is compared with the resolved one."""
  c = config_lib.base_config()
  new = run_config.view(c, "rl")
  assert new["sampling.engine"] == "auto" and new["rl.packing"] == "auto" and new["sampling.exit_chunk"] == -1
  resolved = run_config.with_resolved(new, {"sampling.engine": "static", "rl.packing": "on", "rl.G": 4})
  assert resolved["resolved.sampling.engine"] == "static" and "resolved.rl.G" not in resolved  # not a knob
  assert run_config.diff(resolved, new) == []
  split = {"rl.rollout_chunks": 1, "rl.minibatches": 1}  # set in the base config: what the run ran with too
  assert run_config.recorded_settings(resolved) == {"sampling.engine": "static", "rl.packing": "on", **split}
  older = dict(new, **{"sampling.engine": "static", "rl.packing": False, "sampling.exit_chunk": 16,
                       "rl.train_buckets": 1})  # a record from before these keys were auto
  assert run_config.diff(older, new) == []
  assert run_config.recorded_settings(older) == {"sampling.engine": "static", "rl.packing": "off",
                                                 "sampling.exit_chunk": 16, "rl.train_buckets": 1, **split}
  explicit = lambda **kv: dict(new, **kv)
  assert run_config.diff(resolved, explicit(**{"rl.packing": True})) == []  # True is 'on': what it resolved
  assert run_config.diff(resolved, explicit(**{"rl.packing": "off"})) == ["rl.packing"]
  assert run_config.diff(older, explicit(**{"sampling.engine": "continuous"})) == ["sampling.engine"]
  assert "sampling.engine ('static' → 'continuous')" in run_config.describe(
      ["sampling.engine"], resolved, explicit(**{"sampling.engine": "continuous"}))
