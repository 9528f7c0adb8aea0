"""Each XLA compile of a real `python -m grpo_jax.main` run, in process CPU time, and the programs compiled alone.

`--config` (and `--workdir`, `--set KEY=VALUE` as `--config.KEY=VALUE`): runs `grpo_jax.main` in this process and
prints one line per backend compile (program name, CPU-s, wall s; process CPU over every thread, steadier than wall
time on a shared machine), then the compiles' total and the whole run's CPU-s; `--save DIR` also writes each compiled program's StableHLO
(DIR/<program>.<hash>.mlirbc). `--compile FILE...`: compiles saved programs in this process and nothing else (no
tracing or lowering; compile options made afresh, so this process's XLA_FLAGS apply: the way to compare flags, or to
profile a compile with `perf record -g`). Set GRPO_JAX_XLA_CACHE=off for a run (a cache hit compiles nothing).

  GRPO_JAX_XLA_CACHE=off python benchmarks/compile_log.py --config=configs/grpo_arith.py:small --workdir=/tmp/cl \
      --save /tmp/progs
  XLA_FLAGS=--xla_backend_optimization_level=0 python benchmarks/compile_log.py --compile /tmp/progs/jit_step.*.mlirbc
"""
import argparse
import hashlib
import os
import resource
import runpy
import sys
import time


def cpu_s() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


def run(main_args: list[str], save: str | None) -> int:
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  original = compiler.backend_compile_and_load
  rows = []

  def logged(backend, module, *args, **kwargs):
    name = ir.StringAttr(module.operation.attributes["sym_name"]).value
    if save:
      code = mlir.module_to_bytecode(module)
      os.makedirs(save, exist_ok=True)
      with open(os.path.join(save, f"{name}.{hashlib.sha1(code).hexdigest()[:8]}.mlirbc"), "wb") as f:
        f.write(code)
    t0, c0 = time.time(), cpu_s()
    out = original(backend, module, *args, **kwargs)
    rows.append((name, cpu_s() - c0, time.time() - t0))
    print(f"compile {name}: {rows[-1][1]:.2f} CPU-s, {rows[-1][2]:.2f} s", file=sys.stderr, flush=True)
    return out

  compiler.backend_compile_and_load = logged  # the one function every jit compile goes through (jax 0.10)
  t0, c0 = time.time(), cpu_s()
  sys.argv = ["grpo_jax.main"] + main_args
  code = 0
  try:
    runpy.run_module("grpo_jax.main", run_name="__main__")
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  print(f"{len(rows)} compiles: {sum(r[1] for r in rows):.2f} CPU-s ({sum(r[2] for r in rows):.2f} s); "
        f"the whole run {cpu_s() - c0:.2f} CPU-s ({time.time() - t0:.1f} s)", flush=True)
  for name, c, w in sorted(rows, key=lambda r: -r[1])[:8]:
    print(f"  {name:40s} {c:7.2f} CPU-s {w:7.2f} s")
  return code


def compile_saved(paths: list[str]) -> int:
  from jax._src import compiler, xla_bridge  # pylint: disable=g-import-not-at-top
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  from jax._src.lib import xla_client as xc  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  backend = xla_bridge.get_backend()
  devices = xc.DeviceList(tuple(backend.devices()[:1]))
  for p in paths:
    with open(p, "rb") as f:
      code = f.read()
    options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
    with mlir.make_ir_context():
      module = ir.Module.parse(code)
      t0, c0 = time.time(), cpu_s()
      backend.compile_and_load(module, devices, options)
      print(f"{os.path.basename(p)}: {cpu_s() - c0:.2f} CPU-s, {time.time() - t0:.2f} s", flush=True)
  return 0


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--config", help="run grpo_jax.main with this --config (configs/<exp>.py[:arg])")
  ap.add_argument("--workdir", help="the run's --workdir")
  ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="--config.KEY=VALUE (repeatable)")
  ap.add_argument("--save", metavar="DIR", help="with --config: write each compiled program's StableHLO here")
  ap.add_argument("--compile", nargs="+", metavar="FILE", help="compile saved .mlirbc programs alone")
  a = ap.parse_args(argv)
  if bool(a.config) == bool(a.compile):
    ap.error("give --config (a run to log), or --compile FILE...")
  if a.compile:
    return compile_saved(a.compile)
  main_args = [f"--config={a.config}"] + ([f"--workdir={a.workdir}"] if a.workdir else [])
  return run(main_args + [f"--config.{kv}" for kv in a.set], a.save)


if __name__ == "__main__":
  sys.exit(main())
