"""The run config stored with every checkpoint, and the diff that makes a changed config on resume explicit.

A run (or pipeline stage) records a *view* of its resolved config: the flattened config minus the keys it does not
read (an SFT stage ignores `rl.*`) and minus bookkeeping keys that change nothing trained (log cadence, checkpoint
cadence). On resume the new view is diffed against the checkpoint's:

  * no difference → resume;
  * a difference → one InputError line listing every key with its old → new value and the ways forward: a new
    `--workdir`, or, for keys that leave the state tree unchanged, `--config.train.allow_config_change=k1,k2`;
    keys that change the state tree (`model.*`, the critic, β = 0 ↔ β > 0, the optimizer type, the job) can only
    get a new workdir;
  * an accepted change is recorded: `config_change/<key>` = 1 in metrics.jsonl at the resume step and the new
    config in `config.<step>.json` next to the checkpoints (the first change also writes `config.0.json`, the
    config the run started with).

`auto` knobs (rl/auto.py, config_lib.AUTO_KEYS) are recorded as resolved: `resolved.<key>` entries in the view
stored with each checkpoint (`with_resolved`). On resume a key at its auto value takes the recorded value (the run's
resolved one, or the value an older run set explicitly: `recorded_settings`), so the diff does not count it as a
change; an explicit value is compared with what the run resolved.

Checkpoints written before configs were stored resume with a warning.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterable, Mapping

from absl import logging

from grpo_jax.config import config_lib
from grpo_jax.config import presets
from grpo_jax.infra import errors

# Keys that never block a resume: they change how often the run logs or saves, not what it computes.
BOOKKEEPING = ("log.", "train.log_every", "train.plot_every", "train.sample_every", "train.num_samples_logged",
               "train.ckpt_every", "train.keep_checkpoints", "train.keep_best", "train.keep_best_mode",
               "train.allow_config_change", "train.rerun_stages",
               "resolved.")  # resolved.<key>: what `auto` chose, compared through the key itself (diff)
RESOLVED = "resolved."

# Keys a kind of run does not read (dropped from its view). `r1.*` is kept per stage through `keep`.
_DROP = {
    "rl": ("sft.", "r1."),
    "sft": ("rl.", "ppo.", "rewards", "r1.", "train.steps", "train.eval_every", "train.init_from"),
    "sample": ("rl.", "ppo.", "rewards", "sft.", "r1.", "train.", "optim."),
}

_OPTIMIZER_KIND_KEYS = ("name", "type", "optimizer", "kind")
# The rollout carry's shapes (rl.partial_rollouts: rollout/carry.py's Spec) are part of the state tree.
_CARRY_SHAPE_KEYS = ("rl.max_staleness", "rl.prompts_per_step", "rl.G", "sampling.slots", "sampling.max_new_tokens",
                     "task.prompt_len")

# Keys added to the base config after records were first written, with the default that reproduces what runs did
# before them: a record without the key equals one with this value (an older run resumes unchanged).
ADDED_KEYS = {"run_seed": -1, "task.overlong_prompts": "error", "model.yield_to_checkpoint": False,
              "r1.pretrain.tool_frac": 0.0, "tools.env": "", "tools.format": "plain",
              "tools.stop_markers": ["</tool_call>"], "tools.max_turns": 4, "tools.max_obs_tokens": 32,
              "tools.timeout_s": 10.0, "tools.fallback_reward": 0.0, "tools.workers": 8, "tools.sandbox.time_s": 2.0,
              "tools.sandbox.memory_mb": 512, "tools.sandbox.file_mb": 1, "tools.sandbox.output_chars": 512, "tools.chunk": 8,
              "optim.eps": 1e-8}


def flatten(config: Any) -> dict[str, Any]:
  """`a.b.c -> value` of a ConfigDict (or nested dict), JSON-typed (tuples become lists)."""
  tree = json.loads(config.to_json_best_effort()) if hasattr(config, "to_json_best_effort") else json.loads(
      json.dumps(config, default=str))
  out: dict[str, Any] = {}

  def walk(prefix: str, node: Any) -> None:
    if isinstance(node, dict) and node:
      for k, v in node.items():
        walk(f"{prefix}{k}.", v)
    else:
      out[prefix[:-1]] = node
  walk("", tree)
  return out


def _matches(key: str, prefixes: Iterable[str]) -> bool:
  return any(config_lib.under(key, p) for p in prefixes)


def drops(kind: str) -> tuple[str, ...]:
  """The key prefixes a run of `kind` ('rl', 'sft', 'sample') does not read (dropped from its view)."""
  return _DROP[kind]


def dropped(kind: str, key: str) -> bool:
  """Whether dotted `key` (or a prefix such as 'rl.') is among the keys a `kind` run does not read."""
  return _matches(key, _DROP[kind])


def view(config: Any, kind: str, *, keep: Iterable[str] = (), extra: Mapping[str, Any] | None = None
         ) -> dict[str, Any]:
  """The keys a run of `kind` ('rl', 'sft' or 'sample') reads, plus `keep` prefixes and `extra` entries."""
  if kind not in _DROP:
    raise ValueError(f"kind={kind!r}: use one of {sorted(_DROP)}")
  keep = tuple(keep)
  flat = flatten(config)
  out = {k: v for k, v in flat.items()
         if (not _matches(k, _DROP[kind]) or _matches(k, keep)) and not _matches(k, BOOKKEEPING)
         and not (k in ADDED_KEYS and v == ADDED_KEYS[k])}  # at its default: the view (and fingerprint) of before
  out["stage.kind"] = kind
  out.update(extra or {})
  return dict(sorted(out.items()))


def fingerprint(v: Mapping[str, Any]) -> str:
  """Short stable hash of a view: what a downstream stage records about the stage it starts from."""
  return hashlib.sha256(json.dumps(v, sort_keys=True).encode()).hexdigest()[:16]


def with_resolved(view: Mapping[str, Any], resolved: Mapping[str, Any]) -> dict[str, Any]:
  """`view` plus `resolved.<key>` for each auto knob the view leaves at auto, with its resolved value."""
  out = dict(view)
  for k, v in resolved.items():
    if k in config_lib.AUTO_KEYS and k in view and _is_auto(k, view[k]):
      out[RESOLVED + k] = v
  return out


def recorded_settings(view: Mapping[str, Any] | None) -> dict[str, Any]:
  """{auto key: the value a recorded run ran with}: its resolved value, or the value it set (a run from before a
  key became `auto` set it explicitly). What `auto.resolve(recorded=...)` reuses on resume."""
  view = view or {}
  out = {}
  for k in config_lib.AUTO_KEYS:
    if RESOLVED + k in view:
      out[k] = view[RESOLVED + k]
    elif k in view and not _is_auto(k, view[k]):
      out[k] = view[k]
    if k in out and k in config_lib.SWITCH_KEYS:
      out[k] = config_lib.switch(out[k])  # an older record's False is 'off'
  return out


def _is_auto(key: str, value: Any) -> bool:
  if key in config_lib.SWITCH_KEYS:
    return config_lib.switch(value) == "auto"
  return value == config_lib.auto_value(key)


def unread(view: Mapping[str, Any]) -> tuple[str, ...]:
  """Key prefixes a stage's view holds that its run does not read: a full-weight SFT stage (sft.lora off) trains no
  adapters, so model.lora.* (the RL stage's adapters) changing is no change of that stage (it was refused there, with
  the advice to redo the SFT stage, which would not have let the RL stage continue either)."""
  if view.get("stage.kind") == "sft" and not view.get("sft.lora", False):
    return ("model.lora.",)
  return ()


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """Keys whose values differ (present in one only included), sorted; bookkeeping keys and the keys the stage does
  not read (unread) ignored. An `auto` knob at its auto value in `new` matches whatever `old` ran with (the resume
  reuses it: recorded_settings); an explicit value is compared with what `old` resolved."""
  keys = {k for k in set(old) | set(new) if not k.startswith(unread(new))}
  get = lambda d, k: d.get(k, ADDED_KEYS.get(k, "<absent>"))

  def differs(k: str) -> bool:
    if k in config_lib.AUTO_KEYS and k in new:
      if _is_auto(k, new[k]):
        return False
      was = old.get(RESOLVED + k, get(old, k))
      if k in config_lib.SWITCH_KEYS:
        return config_lib.switch(was) != config_lib.switch(new[k])
      return was != new[k]
    return get(old, k) != get(new, k)
  return sorted(k for k in keys if not _matches(k, BOOKKEEPING) and differs(k))


def _zero(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and x == 0


def structural(keys: Iterable[str], old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """The changed keys that change the state tree (shapes or leaves): no flag can continue such a run."""
  out = []
  for k in keys:
    o, n = old.get(k), new.get(k)
    if (k.startswith("model.") or k in ("job", "stage.kind", "ppo.critic")
        or (k == "rl.algo" and (o in presets.CRITIC_ALGOS) != (n in presets.CRITIC_ALGOS))
        or (k == "rl.beta" and _zero(o) != _zero(n))
        or (k.startswith("optim.") and k.split(".")[-1] in _OPTIMIZER_KIND_KEYS)
        or (k == "rl.partial_rollouts" and bool(o) != bool(n))
        or (k in _CARRY_SHAPE_KEYS and old.get("rl.partial_rollouts") and new.get("rl.partial_rollouts"))
        # the carry's KV is in the sampler's dtype ('' = the model's): another dtype, other leaves
        or (k == "sampling.dtype" and old.get("rl.partial_rollouts") and new.get("rl.partial_rollouts")
            and (o or old.get("model.dtype")) != (n or new.get("model.dtype")))
        # the carry holds each slot's observation buffer when an environment runs (rollout/carry.py Spec.obs)
        or (k in ("tools.env", "tools.max_obs_tokens") and old.get("rl.partial_rollouts")
            and new.get("rl.partial_rollouts") and _carry_obs(old) != _carry_obs(new))):
      out.append(k)
  return out


def _carry_obs(d: Mapping[str, Any]) -> int:
  """The carry's observation width (carry.spec_for): tools.max_obs_tokens with an environment, else 0 (a view leaves
  a key out at its ADDED_KEYS default)."""
  get = lambda k: d.get(k, ADDED_KEYS.get(k))
  return int(get("tools.max_obs_tokens") or 0) if get("tools.env") else 0


def parse_allow(text: str, config_keys: Iterable[str]) -> set[str]:
  """`train.allow_config_change` → key set; each entry must name a config key or a `group.*` prefix."""
  known = set(config_keys)
  out = set()
  for raw in str(text or "").split(","):
    key = raw.strip()
    if not key:
      continue
    if key.startswith("config."):
      key = key[len("config."):]
    prefix = key[:-1] if key.endswith(".*") else None
    if (prefix and not any(k.startswith(prefix) for k in known)) or (not prefix and key not in known):
      raise errors.ConfigError(f"config.train.allow_config_change: {key!r} is not a config key; list changed keys "
                               "as they appear in the refusal (e.g. optim.lr,rl.G) or a group as optim.*.")
    out.add(key)
  return out


def _allowed(key: str, allow: set[str]) -> bool:
  return key in allow or any(a.endswith(".*") and key.startswith(a[:-1]) for a in allow)


def _short(v: Any) -> str:
  s = json.dumps(v) if not isinstance(v, str) else repr(v)
  return s if len(s) <= 40 else s[:37] + "..."


def describe(keys: Iterable[str], old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
  def one(k):
    if k == "stage.upstream":  # "<stage>:<fingerprint>": the fingerprints mean nothing to a reader
      return f"stage.upstream (stage {str(new.get(k, old.get(k, '?'))).split(':')[0]} it starts from changed)"
    was = old.get(RESOLVED + k, old.get(k, "<absent>"))  # an auto knob: what the run resolved it to
    return f"{k} ({_short(was)} → {_short(new.get(k, '<absent>'))})"
  return ", ".join(one(k) for k in keys)


MAX_DESCRIBED = 12  # changed keys spelled out in a refusal of a structural change


def check(old: Mapping[str, Any] | None, new: Mapping[str, Any], allow: set[str], *, where: str,
          workdir_hint: str, hint: str = "", note: str = "", incidental: Iterable[str] = ()) -> list[str]:
  """Changed keys accepted for this resume ([] = identical); raises one InputError line otherwise. `hint`: one
  more way out, among the others; `note`: what a new --workdir can reuse, after them; `incidental`: keys a refusal
  of a structural change leaves unnamed (they changed through keys it names).

  `old` None means the stored record predates config records: resume with a warning.
  """
  if old is None:
    logging.warning("%s has no stored run config (written by an older version); resuming without checking that "
                    "the config is unchanged.", where)
    return []
  if not (isinstance(old, Mapping) and all(isinstance(k, str) for k in old)):  # a hand edit, not something we write
    raise errors.InputError(f"{where} holds a damaged config record ({type(old).__name__} {_short(old)}, not the "
                            "key -> value mapping this code writes); restore the file from a backup or use a new "
                            f"--workdir (not {workdir_hint}).")
  changed = diff(old, new)
  if not changed:
    return []
  hard = structural(changed, old, new)
  if hard:
    # the structural keys first; past a few, the rest only counted (another job's run differs in ~80 keys)
    rest = [k for k in changed if k not in hard and k not in set(incidental)]
    shown = list(hard) + rest[:max(0, MAX_DESCRIBED - len(hard))]
    more = len(rest) + len(hard) - len(shown)
    lora = " (the shapes of the LoRA adapters it holds)" if any(k.startswith("model.lora.") for k in hard) else ""
    raise errors.InputError(
        f"the config differs from the one that wrote {where} in {describe(shown, old, new)}"
        f"{f' and {more} more key(s)' if more else ''}; "
        f"{', '.join(hard)} change{'s' if len(hard) == 1 else ''} the saved state's structure{lora}, so this run "
        f"cannot continue with {'it' if len(hard) == 1 else 'them'}: "
        f"restore the old value{'s' if len(hard) > 1 else ''}"
        f"{hint} or use a new --workdir (not {workdir_hint}){note}.")
  refused = [k for k in changed if not _allowed(k, allow)]
  if refused:
    raise errors.InputError(
        f"the config differs from the one that wrote {where} in {describe(changed, old, new)}; to continue this "
        f"run with the new values pass --config.train.allow_config_change={','.join(changed)}, otherwise restore "
        f"the old values{hint} or use a new --workdir (not {workdir_hint}){note}.")
  logging.warning("resuming %s with changed config keys (allowed by train.allow_config_change): %s", where,
                  describe(changed, old, new))
  return changed


def write_json_atomic(path: str, obj: Any) -> None:
  """Readers see the old file or the new one, never half of one; a refused write names `path`."""
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.write(json.dumps(obj, indent=2, sort_keys=True) + "\n")
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise OSError(e.errno, e.strerror, path) from e


def record_change(directory: str, step: int, old: Mapping[str, Any], new: Mapping[str, Any],
                  changed: list[str]) -> None:
  """`config.<step>.json` history next to the checkpoints (process 0 only); `config.0.json` on the first change."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_index() != 0 or not changed:
    return
  os.makedirs(directory, exist_ok=True)
  history = [n for n in os.listdir(directory) if n.startswith("config.") and n.endswith(".json") and n != "config.json"]
  if not history and step > 0:
    write_json_atomic(os.path.join(directory, "config.0.json"), dict(old))
  write_json_atomic(os.path.join(directory, f"config.{step}.json"), {**dict(new), "changed_keys": changed})


def change_metrics(changed: Iterable[str]) -> dict[str, int]:
  return {f"config_change/{k}": 1 for k in changed}
