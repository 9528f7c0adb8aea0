"""A run's params -> a Hugging Face directory that transformers loads and generates from.

  python -m grpo_jax.export RUN_DIR OUT_DIR [--step N | --best] [--dtype float32|bfloat16] [--model_type qwen2|llama]
      [--format merged|peft|base] [--verbose]
  python -m grpo_jax.main --config=<the run's config> --workdir=RUN_DIR --config.job=export \\
      --config.export.out_dir=OUT_DIR     # the same, as a job (the export.* keys)

The model is what RUN_DIR/config.json (the run's resolved config) describes (a stage's directory, DIR/sft or an
R1 pipeline's DIR/r1_2_grpo: its stage.json's config); the params come from the newest (or the
given) committed checkpoint in RUN_DIR/checkpoints, falling back to older ones if the newest does not restore, or
from RUN_DIR/params (an SFT run's final params) when there are no checkpoints; the summary and the line it prints
name the step and checkpoint really read, and the newer ones passed over with why. OUT_DIR gets config.json (the source
checkpoint's, with our architecture fields, when the run started from hf:<dir>), safetensors, the tokenizer's files
(tokenizer.json, tokenizer_config.json, special_tokens_map.json, chat_template.jinja, ...) and
generation_config.json (the source's, else written from the tokenizer's bos/eos/pad ids). A run on the shipped
sentencepiece tokenizer gets no tokenizer files: transformers has no tokenizer class for it.

Params are restored to host memory (the CPU backend): 4 bytes per parameter, then written one tensor at a time.
OUT_DIR is written beside and renamed in whole; an existing one must be empty or an earlier export (safetensors
tagged hf_save.EXPORT_METADATA), replaced whole with its README.md carried over; never the run's base or tokenizer.

A LoRA run (model.lora.rank > 0) checkpoints adapters only: its base is read again from the source its checkpoint
names (checked against the recorded checksum), and `format` picks `merged` (the HF checkpoint above, W + scale·A·B)
or `peft` (OUT_DIR = adapter_config.json + adapter_model.safetensors with PEFT key names: peft_export.py), or
`base` (its frozen base as an HF checkpoint: what a PEFT directory needs when the base is not an hf: checkpoint,
whose adapter_config.json can name no base; the PEFT export's summary says so, with the command).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any, NamedTuple

import jax
import ml_collections

from grpo_jax.config import config_lib
from grpo_jax.hf import hf_io
from grpo_jax.hf import hf_save
from grpo_jax.hf import peft_export
from grpo_jax.hf import safetensors_io as st
from grpo_jax.infra import checkpoint as ckpt_lib
from grpo_jax.infra import console
from grpo_jax.infra import errors
from grpo_jax.infra import leftovers
from grpo_jax.infra import params_ckpt
from grpo_jax.model import lora as lora_lib
from grpo_jax.model import model as model_lib
from grpo_jax.run import run_config as run_config_lib
from grpo_jax.run import stages as stages_lib
from grpo_jax.hf import model_source
from grpo_jax.tasks import tokenizer_factory as tok_lib
from grpo_jax.tasks import hf_tokenizer

FORMATS = ("merged", "peft", "base")  # base: a LoRA run's frozen base, e.g. for its PEFT adapters (_base_hint)
KEPT = ("README.md",)  # an earlier export's files that no export writes (a model card): carried into the new one
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json")


def run_config(run_dir: str) -> ml_collections.ConfigDict:
  """RUN_DIR/config.json, or for a stage directory (DIR/sft, an R1 pipeline's DIR/r1_2_grpo, ...: config.json is
  DIR's) the config its stage.json records."""
  path = os.path.join(run_dir, "config.json")
  if not os.path.isfile(path):
    record = stages_lib.read_record(run_dir)
    if record is not None and isinstance(record.get("config"), dict):
      return _stage_config(run_dir, record["config"])
    stage_dirs = sorted(n for n in (os.listdir(run_dir) if os.path.isdir(run_dir) else ())
                        if os.path.isfile(os.path.join(run_dir, n, stages_lib.RECORD)))
    raise config_lib.ConfigError(f"{path} is missing; export reads a finished run's directory (the --workdir a "
                                 "run wrote, holding config.json and checkpoints/) or one stage's (holding "
                                 f"{stages_lib.RECORD})" + (f", e.g. {os.path.join(run_dir, stage_dirs[-1])}"
                                                             if stage_dirs else "") + ".")
  try:
    with open(path, encoding="utf-8") as f:
      d = json.load(f)
  except (OSError, ValueError) as e:
    raise errors.InputError(f"{path} does not read ({type(e).__name__}: {e}); export rebuilds the model from it: "
                            "restore it (running the run's command again rewrites it).") from None
  if not (isinstance(d, dict) and isinstance(d.get("model"), dict)):
    raise errors.InputError(f"{path} holds no 'model' section; export rebuilds the model from it: restore it "
                            "(running the run's command again rewrites it).")
  _check_model_unedited(run_dir, path, d["model"])
  return ml_collections.ConfigDict(d)


def _stage_config(run_dir: str, view: dict) -> ml_collections.ConfigDict:
  """A stage's recorded view (flat dotted keys of what the stage read) over the base config's defaults."""
  merged = config_lib.base_config().to_dict()
  for key, value in view.items():
    if key.startswith(("stage.", run_config_lib.RESOLVED)):
      continue
    *parents, leaf = key.split(".")
    node = merged
    for p in parents:
      if not isinstance(node.get(p), dict):
        node[p] = {}
      node = node[p]
    node[leaf] = value
  if not isinstance(merged.get("model"), dict):
    raise errors.InputError(f"{os.path.join(run_dir, stages_lib.RECORD)} records no model; export rebuilds the "
                            "model from it.")
  _check_model_unedited(run_dir, os.path.join(run_dir, stages_lib.RECORD), merged["model"])
  return ml_collections.ConfigDict(merged)


def _check_model_unedited(run_dir: str, path: str, model: dict) -> None:
  """config.json's model keys against the newest checkpoint's stored config: an edit made the checkpoints read as
  'every one damaged or unreadable' (the shapes differ), with advice about init checkpoints."""
  newest = ckpt_lib.newest_meta(os.path.join(run_dir, "checkpoints"))
  stored = newest[1].get("config") if newest else None
  if not isinstance(stored, dict):
    return  # no checkpoint, or one written before configs were stored

  def flat(prefix, node):
    for k, v in node.items():
      yield from flat(f"{prefix}.{k}", v) if isinstance(v, dict) else [(f"{prefix}.{k}", v)]
  changed = [f"{k} ({stored[k]!r} stored, {v!r} in config.json)" for k, v in flat("model", model)
             if k in stored and stored[k] != v]
  if changed:
    raise errors.InputError(f"{path} differs from the config stored with checkpoint {newest[0]} in "
                            f"{', '.join(changed[:4])}: it was edited after the run; restore those values.")


def _host_sharding():
  """One CPU device: restored params live in host memory even on a TPU/GPU machine."""
  return jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])


class Source(NamedTuple):
  """What an export read: the params, the step they are from (0 = RUN_DIR/params), where, and the newer steps it
  passed over because they did not restore (step, why). Every label an export prints or writes comes from here."""
  params: Any
  step: int
  path: str
  skipped: tuple[tuple[int, str], ...] = ()

  def describe(self) -> str:
    fell = "; ".join(f"step {s} unusable ({why[:160]})" for s, why in self.skipped)
    return self.path + (f" (fell back: {fell})" if fell else "")


def restore_params(run_dir: str, mcfg, step: int = 0, config=None, want_adapters: bool = False) -> Source:
  """The params an export writes, on the host: a LoRA run's merged params, or with want_adapters (base, adapters).
  From the given checkpoint step, else the newest that restores (damaged ones passed over, named in `skipped`),
  else RUN_DIR/params (an SFT run's final params; step 0)."""
  sh = _host_sharding()
  abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                          model_lib.param_shapes(mcfg))
  ckpt_dir = os.path.join(run_dir, "checkpoints")
  steps = sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit()) if os.path.isdir(ckpt_dir) else []
  if steps:
    if step and step not in steps:
      raise config_lib.ConfigError(f"export.step={step} is not a checkpoint in {ckpt_dir}; it has steps {steps} "
                                   "(0 = the newest).")
    if mcfg.lora is not None:
      abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh),
                              lora_lib.adapter_shapes(mcfg))
    try:
      got = params_ckpt.restore_params_only(ckpt_dir, abstract, step or None)
    except ValueError as e:
      raise errors.InputError(f"{ckpt_dir}: {errors.one_line(str(e))}") from None
    where = os.path.join(ckpt_dir, str(got.step))
    if mcfg.lora is None:
      return Source(got.params, got.step, where, got.skipped)
    meta = ckpt_lib.read_meta(ckpt_dir, got.step)
    base = peft_export.load_base(peft_export.base_source(config, meta), mcfg, sh)
    peft_export.check_base(base, meta, where)
    params = (base, got.params) if want_adapters else merged_policy(mcfg, base, got.params)
    return Source(params, got.step, where, got.skipped)
  if step:  # was ignored: RUN_DIR/params written as step 0 for a step that does not exist
    raise config_lib.ConfigError(f"export.step={step}: {run_dir} has no committed checkpoint (only the final params/, "
                                 "step 0, if any); leave export.step at 0.")
  if want_adapters:
    raise config_lib.ConfigError(f"export.format='peft': {run_dir} has no LoRA checkpoints (its params/ are a full "
                                 "model); use export.format=merged.")
  params_dir = os.path.join(run_dir, "params")
  if os.path.isdir(params_dir):
    return Source(params_ckpt.load_params(params_dir, abstract), 0, params_dir)
  raise config_lib.ConfigError(f"{run_dir} has no checkpoints/ and no params/; nothing to export (did the run save "
                               "a checkpoint? train.ckpt_every sets how often).")


def merged_policy(mcfg, base: Any, adapters: Any) -> Any:
  """A LoRA run's policy as one model: W + scale·A·B in float32, whatever dtype the base was held in (a bfloat16
  base's merge rounded to bfloat16 lost much of a small adapter delta: the export was not the trained policy)."""
  return lora_lib.merged(mcfg, lora_lib.combine(base, adapters), jax.numpy.float32)


def _source_dir(config) -> str | None:
  src = model_source.source(config)
  return src[1] if src and os.path.isdir(src[1]) else None


def _generation_config(tok) -> dict:
  eos = list(getattr(tok, "eos_ids", (tok.eos_id,)))
  return {"bos_token_id": int(tok.bos_id), "eos_token_id": eos[0] if len(eos) == 1 else eos,
          "pad_token_id": int(tok.pad_id)}


def best_step(run_dir: str) -> tuple[int, dict]:
  """The checkpoint step a run kept as its best held-out score (train.keep_best) and its record."""
  ckpt_dir = os.path.join(run_dir, "checkpoints")
  best = ckpt_lib.best_step(ckpt_dir)
  if best is None:
    raise errors.InputError(f"export.best: no checkpoint in {ckpt_dir} records a finite held-out score (the run kept "
                            "no best step: train.keep_best was empty, or every evaluation was non-finite); export a "
                            "step (export.step / --step), or train with --config.train.keep_best=eval/accuracy.")
  return best


def export(run_dir: str, out_dir: str, *, step: int = 0, dtype: str = "float32", model_type: str = "",
           format: str = "merged", best: bool = False) -> dict:  # pylint: disable=redefined-builtin
  """Writes OUT_DIR; returns a summary {step, source, model_type, dtype, files, tokenizer[, base, best]}: `step`
  and `source` are what was really read (after any fallback past a damaged checkpoint). `best`: the step the run
  kept for its best held-out score (train.keep_best); never a fallback (a damaged best step is an error)."""
  if dtype not in ("float32", "bfloat16"):
    raise config_lib.ConfigError(f"export.dtype={dtype!r}: use 'float32' or 'bfloat16'.")
  if step < 0:
    raise config_lib.ConfigError(f"export.step={step}: use a checkpoint's step, or 0 for the newest.")
  if model_type not in ("", *hf_io.SUPPORTED):
    raise config_lib.ConfigError(f"export.model_type={model_type!r}: use '' (from the run), 'qwen2' or 'llama'.")
  if format not in FORMATS:
    raise config_lib.ConfigError(f"export.format={format!r}: use one of {FORMATS}.")
  if os.path.abspath(out_dir) == os.path.abspath(run_dir):
    raise config_lib.ConfigError(f"export.out_dir={out_dir} is the run directory; pick a new directory.")
  if best and step:
    raise config_lib.ConfigError(f"export.best and export.step={step} name two checkpoints; set one of them.")
  kept = best_step(run_dir) if best else None
  step = kept[0] if kept else step
  replace = check_out_dir(out_dir)
  config = run_config(run_dir)
  _check_not_a_source(out_dir, config)
  summary = _export(run_dir, out_dir, config, replace, step, dtype, model_type, format)
  if kept:
    summary["best"] = f"{kept[1]['metric']} {kept[1]['value']:.6g}, the {kept[1]['mode']} kept"
  return summary


def _export(run_dir, out_dir, config, replace, step, dtype, model_type,
            format) -> dict:  # pylint: disable=redefined-builtin
  mcfg = model_lib.ModelConfig.from_config(config.model)
  if format in ("peft", "base") and mcfg.lora is None:
    raise config_lib.ConfigError(f"export.format={format!r}: {run_dir} trained no adapters (model.lora.rank=0); use "
                                 "export.format=merged.")
  src = _source_dir(config)
  if format == "peft":
    got = restore_params(run_dir, mcfg, step, config, want_adapters=True)
    # the base the adapters were trained on, as the checkpoint records it: not the config's model source (an SFT
    # stage from sft.init_from=hf:X trains them on DIR/sft/params, and X named in adapter_config.json lacks the SFT)
    base_dir = _trained_base(run_dir, config, got)
    base_dir = base_dir[3:] if base_dir.startswith("hf:") else ""
    staged = _staging(out_dir)  # written whole beside OUT_DIR, then moved in: never a mix
    files = peft_export.save_peft(staged, mcfg, got.params[1], base_model=base_dir)
    _move_in(staged, out_dir, replace)
    return {"step": got.step, "source": got.describe(), "model_type": "peft-lora", "dtype": "float32",
            "files": files, "tokenizer": "none (an adapter directory: the base's tokenizer applies)",
            "base": base_dir or _base_hint(run_dir, config, got)}
  base = hf_io.read_json(os.path.join(src, "config.json")) if src else None
  model_type = model_type or (base or {}).get("model_type") or ("qwen2" if mcfg.qkv_bias else "llama")
  if model_type == "qwen2" and not mcfg.qkv_bias:
    raise config_lib.ConfigError("export.model_type='qwen2' needs q/k/v biases (model.qkv_bias); this model has "
                                 "none: use export.model_type=llama.")
  got = restore_params(run_dir, mcfg, step, config, want_adapters=format == "base")
  params = got.params[0] if format == "base" else got.params
  final, out_dir = out_dir, _staging(out_dir)  # written whole beside OUT_DIR, then moved in: never a mix
  hf_save.save_hf(out_dir, mcfg, params, model_type=model_type, dtype=dtype, base_config=base)
  spec = tok_lib.spec_for_config(config)
  tok_dir = None
  if tok_lib.is_hf(spec):
    tok_dir = hf_tokenizer.resolve(spec[3:] if spec.startswith("hf:") else spec)[0]
  for name in TOKENIZER_FILES if tok_dir else ():
    if os.path.isfile(os.path.join(tok_dir, name)):
      shutil.copyfile(os.path.join(tok_dir, name), os.path.join(out_dir, name))
  gen = next((os.path.join(d, "generation_config.json") for d in (src, tok_dir)
              if d and os.path.isfile(os.path.join(d, "generation_config.json"))), None)
  if gen:
    shutil.copyfile(gen, os.path.join(out_dir, "generation_config.json"))
  elif tok_dir:
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
      json.dump(_generation_config(tok_lib.load(spec)), f, indent=2)
  files = sorted(os.listdir(out_dir))
  _move_in(out_dir, final, replace)
  return {"step": got.step, "source": (f"the frozen base of {got.describe()}" if format == "base" else
                                       got.describe()),
          "model_type": model_type, "dtype": dtype, "files": files,
          "tokenizer": tok_dir or "shipped sentencepiece (no HF tokenizer files written)"}


def _trained_base(run_dir: str, config, got: Source) -> str:
  """The source of the base a LoRA checkpoint's adapters were trained on (hf:<dir>, a params checkpoint, seed:N)."""
  return peft_export.base_source(config, ckpt_lib.read_meta(os.path.join(run_dir, "checkpoints"), got.step))


def _base_hint(run_dir: str, config, got: Source) -> str:
  """A PEFT adapter of a base that is not a Hugging Face checkpoint (a params checkpoint such as DIR/sft/params, or
  the seed's random init): adapter_config.json cannot name it (base_model_name_or_path stays null), so the summary
  says how to export the base the adapters were trained on."""
  source = _trained_base(run_dir, config, got)
  return (f"the adapters were trained on {source}, which is not a Hugging Face checkpoint, so adapter_config.json "
          f"names no base: export the base too (python -m grpo_jax.export {run_dir} BASE_DIR --format=base --step "
          f"{got.step}) and load PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE_DIR), OUT_DIR)")


def _check_not_a_source(out_dir: str, config) -> None:
  """OUT_DIR is none of the directories the run reads: its hf: base (or an earlier export it started from) was
  replaced whole by the export of the run trained on it, and a LoRA run's adapters no longer restore without it."""
  src, spec = model_source.source(config), tok_lib.spec_for_config(config)
  sources = [(f"base checkpoint ({src[0]})", src[1])] if src else []
  if tok_lib.is_hf(spec):  # hf:<dir>, or a tokenizer.json path
    sources.append(("tokenizer", spec[3:] if spec.startswith("hf:") else os.path.dirname(spec)))
  for what, d in sources:
    if os.path.realpath(d) == os.path.realpath(out_dir):
      raise config_lib.ConfigError(f"export.out_dir={out_dir} is the run's {what} directory, which the export would "
                                   "replace; pick a new directory.")


def _is_export(d: str) -> bool:
  """An earlier export: config.json with a model_type (or adapter_config.json), nothing but checkpoint and tokenizer
  files, and safetensors written by an export (hf_save.EXPORT_METADATA): another program's checkpoint of the same
  file names is not replaced."""
  try:
    names = os.listdir(d)
    if "adapter_config.json" in names:  # an earlier PEFT adapter export
      ok = isinstance(hf_io.read_json(os.path.join(d, "adapter_config.json"), "adapter_config.json"), dict)
    else:
      ok = isinstance(hf_io.read_json(os.path.join(d, "config.json")).get("model_type"), str)
  except (OSError, ValueError):
    return False
  known = {"config.json", "generation_config.json", "model.safetensors.index.json", "adapter_config.json",
           "README.md", *TOKENIZER_FILES}
  weights = [n for n in names if n.endswith(".safetensors")]
  return (ok and all(n in known or n.endswith(".safetensors") for n in names) and bool(weights)
          and all(st.read_metadata(os.path.join(d, n)).get("written_by") ==
                  hf_save.EXPORT_METADATA["written_by"] for n in weights))


def check_out_dir(out_dir: str) -> bool:
  """True when OUT_DIR holds an earlier export, which the new one replaces whole; a directory of anything else
  that is not empty is refused (before anything is read or written)."""
  if not os.path.exists(out_dir):
    return False
  if not os.path.isdir(out_dir):
    raise config_lib.ConfigError(f"export.out_dir={out_dir} is a file; pass a directory path.")
  if not os.listdir(out_dir):
    return False
  if _is_export(out_dir):
    return True
  raise config_lib.ConfigError(f"export.out_dir={out_dir} is not empty and is not an earlier export (files other "
                               "than a Hugging Face checkpoint's, or weights another program wrote); pick a new or "
                               "empty directory.")


def _staging(out_dir: str) -> str:
  """OUT_DIR.export-tmp-<host>-<pid>, after removing what an export killed on this host left beside OUT_DIR (its
  staging directory, or the earlier export it had renamed aside): up to a model's size each, never read again."""
  base = f"{os.path.abspath(out_dir).rstrip(os.sep)}.export-tmp-"
  leftovers.remove(base, lambda rest: rest.removesuffix(".old"), "export staging directories", this_process=True)
  return f"{base}{leftovers.owner()}"


def _move_in(staged: str, out_dir: str, replace: bool) -> None:
  """The staged export becomes OUT_DIR: a rename; an earlier export is renamed aside first, then deleted, so
  OUT_DIR is at every moment the old export, absent, or the new one."""
  old = f"{staged}.old"
  if replace:
    for name in KEPT:
      if os.path.isfile(os.path.join(out_dir, name)) and not os.path.exists(os.path.join(staged, name)):
        shutil.copyfile(os.path.join(out_dir, name), os.path.join(staged, name))
    os.replace(out_dir, old)
  elif os.path.isdir(out_dir):
    os.rmdir(out_dir)  # empty (check_out_dir)
  os.replace(staged, out_dir)
  if replace:
    shutil.rmtree(old)


def run_job(config, workdir: str) -> dict:
  """`job=export`: the run in --workdir to `export.out_dir`."""
  e = config.export
  if jax.process_count() > 1:
    raise config_lib.ConfigError("job=export runs in one process (it reads the checkpoint into host memory); run "
                                 "`python -m grpo_jax.export RUN_DIR OUT_DIR` on one host, without "
                                 "GRPO_JAX_DISTRIBUTED.")
  if not e.out_dir:
    raise config_lib.ConfigError("config.export.out_dir: is empty; job=export writes the Hugging Face directory "
                                 "there (set --config.export.out_dir=DIR).")
  summary = export(workdir, e.out_dir, step=int(e.step), dtype=e.dtype, model_type=e.model_type,
                   format=e.get("format", "merged"), best=bool(e.get("best", False)))
  print(describe(summary, e.out_dir))
  return summary


def describe(summary: dict, out_dir: str) -> str:
  """The one line an export ends with: the step and checkpoint really read (after any fallback)."""
  best = f" (best held-out: {summary['best']})" if summary.get("best") else ""
  line = (f"exported step {summary['step']}{best} from {summary['source']} ({summary['model_type']}, {summary['dtype']}) "
          f"-> {out_dir}: {', '.join(summary['files'])}; tokenizer: {summary['tokenizer']}")
  return line + (f"; base: {summary['base']}" if summary.get("base") else "")


def main(argv=None) -> int:
  ap = errors.ArgParser(description=__doc__.splitlines()[0])
  ap.add_argument("run_dir")
  ap.add_argument("out_dir")
  ap.add_argument("--step", type=int, default=0, help="checkpoint step (0 = the newest)")
  ap.add_argument("--best", action="store_true",
                  help="the step the run kept for its best held-out score (train.keep_best)")
  ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  ap.add_argument("--model_type", default="", choices=("", *hf_io.SUPPORTED))
  ap.add_argument("--format", default="merged", choices=FORMATS,
                  help="a LoRA run: merged HF checkpoint, a PEFT adapter directory, or its frozen base")
  ap.add_argument("--verbose", action="store_true", help="tracebacks and the libraries' full logs")
  a = ap.parse_args(argv)
  console.setup_logging(a.verbose)  # a damaged checkpoint's read errors: one line each, not orbax's tracebacks
  try:
    s = export(a.run_dir, a.out_dir, step=a.step, dtype=a.dtype, model_type=a.model_type, format=a.format,
               best=a.best)
  except Exception as e:  # pylint: disable=broad-except
    verdict = errors.classify(e)
    if verdict is None:
      raise  # a bug: the traceback is the report
    console.silence_libraries()  # the error line is the last one (orbax's event loop, closed at exit, printed after)
    print(f"Error: {errors.one_line(str(e))}" if isinstance(e, errors.InputError) else verdict[1], file=sys.stderr)
    return verdict[0]
  print(describe(s, a.out_dir))
  return 0


if __name__ == "__main__":
  sys.exit(main())
