#!/usr/bin/env bash
# The first run on an accelerator, in one script and under 8 minutes (a 15-minute device loan leaves room to rerun):
#
#   1. env    the Python, JAX and devices it runs on (nvidia-smi on a GPU)
#   2. tests  the GPU-path tests: cuDNN flash attention and the Pallas GPU (Triton) kernel against the einsum path,
#             blockwise attention under bf16, the continuous engine against the static one, packed passes against
#             padded ones, the bf16 RL rollout (on a CPU the GPU-only ones skip: --cpu only collects them)
#   3. main   the main job (configs/grpo_arith.py, its SFT stage cut short) for a few GRPO steps
#   4. bench  benchmarks/grpo_step.py on a bf16 model of GPU size: seconds per step, MFU of the step and of the
#             update against the device's peak, and decode's HBM bandwidth against the datasheet's
#             (grpo_jax/perf/flops.py PEAKS: H100, H200, A100, TPUs)
#
# Usage (from the repository root):
#   bash benchmarks/device_check.sh [--out DIR] [--wheels DIR]   on the GPU machine
#   bash benchmarks/device_check.sh --cpu [--out DIR]            the same stages, tiny, on the CPU (CI: tests/test_device_check.py)
#   bash benchmarks/device_check.sh --fetch DIR                  here (a machine with the package index): the wheels of
#                                                                the project's dependencies a bare accelerator image
#                                                                lacks (ml-collections, tensorflow-datasets, tensorboardX
#                                                                and theirs), for --wheels DIR there
# Every stage's output goes to DIR/<stage>.log; DIR/summary.txt has one line per stage and the figures; the exit
# status is 0 only if every stage passed. PYTHON picks the interpreter (default python3).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
MODE=gpu OUT="${TMPDIR:-/tmp}/grpo_jax_device_check" WHEELS="" FETCH=""
value() {  # value FLAG NEXT_ARG: a flag's directory argument, or one line and exit 2 where it is missing
  if [[ -z "${2:-}" || "$2" == --* ]]; then
    echo "device_check.sh: $1 needs a directory (e.g. $1 /tmp/device_check)" >&2
    exit 2
  fi
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --out) value "$1" "${2:-}"; OUT="$2"; shift ;;
    --wheels) value "$1" "${2:-}"; WHEELS="$2"; shift ;;
    --fetch) value "$1" "${2:-}"; FETCH="$2"; shift ;;
    *) echo "device_check.sh: unknown argument $1 (--cpu, --out DIR, --wheels DIR, --fetch DIR)" >&2; exit 2 ;;
  esac
  shift
done
if [[ -n "$WHEELS" ]] && ! compgen -G "$WHEELS/*.whl" > /dev/null; then
  echo "device_check.sh: --wheels $WHEELS: no *.whl there; fill it with --fetch $WHEELS on a machine with the package index" >&2
  exit 2
fi

# The project's pins (setup.py) that a bare CUDA image of JAX, flax, optax and orbax lacks, with their own needs; promise
# ships no wheel, so it is built here (pure Python). Python 3.12 wheels (the accelerator image's Python).
MISSING="ml-collections==1.1.0 tensorflow-datasets==4.9.10 array-record==0.8.6 tensorboardX==2.6.5 importlib_resources==7.1.0
dm-tree==0.1.10 docstring_parser==0.18.0 googleapis-common-protos==1.76.0 immutabledict==4.3.1 simple-parsing==0.1.9
tensorflow-metadata==1.21.0 termcolor==3.3.0 toml==0.10.2"
if [[ -n "$FETCH" ]]; then
  mkdir -p "$FETCH"
  for spec in $MISSING; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$FETCH" "$spec" || exit 1
  done
  "$PY" -m pip wheel -q --no-deps -w "$FETCH" promise==2.3 || exit 1
  du -sh "$FETCH"
  exit 0
fi

if ! err="$(mkdir -p "$OUT" 2>&1)"; then  # an argument error as the others: one line, exit 2, before any stage
  echo "device_check.sh: --out $OUT: cannot make that directory (${err##*: }); pass a directory path" >&2
  exit 2
fi
OUT="$(cd "$OUT" && pwd)"  # the stages run from the repository root: a relative --out is the caller's
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ -n "$WHEELS" ]]; then  # install where nothing can be fetched: the wheels of --fetch, no dependency resolution
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/grpo_jax_site \
    "$WHEELS"/*.whl || exit 1
  export PYTHONPATH="$PYTHONPATH:/tmp/grpo_jax_site"
fi
if [[ "$MODE" == cpu ]]; then
  export JAX_PLATFORMS=cpu
else
  export JAX_PLATFORMS="${JAX_PLATFORMS:-cuda}"  # tests/conftest.py defaults to the CPU otherwise
fi
cd "$ROOT" || exit 1
T0=$SECONDS
FAILED=0

stage() {  # stage NAME SECONDS COMMAND...: runs it under a time limit, its output in OUT/NAME.log
  local name="$1" limit="$2" t=$SECONDS
  shift 2
  echo "== $name (at most ${limit}s): $*"
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  local status=ok
  [[ $rc -ne 0 ]] && status="FAIL(rc=$rc)" && FAILED=1
  echo "STAGE $name $status seconds=$((SECONDS - t))" | tee -a "$SUMMARY"
  tail -n 3 "$OUT/$name.log"
}

stage env 60 bash -c "'$PY' -c 'import sys, jax; print(sys.version.split()[0], \"jax\", jax.__version__, jax.devices())' \
  && { [[ $MODE == cpu ]] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; }"

# the GPU-path tests; on the CPU they are only collected (the suite runs their CPU parts)
TESTS="tests/test_attention.py::test_cudnn_equals_einsum_on_gpu
tests/test_packing.py::test_pallas_gpu_kernel_on_gpu_equals_each_sample_alone
tests/test_attention.py::test_blockwise_under_vmap_and_bf16
tests/test_engine.py::test_same_samples_as_static_for_any_slot_count
tests/test_engine.py::test_teacher_forcing_log_probs_match_static
tests/test_packing.py::test_packed_policy_pass_equals_padded
tests/test_rl_step.py::test_chunked_early_exit_bucketed_rollout_gives_the_same_samples_and_logprobs"
if [[ "$MODE" == cpu ]]; then
  stage tests 120 "$PY" -m pytest -q -p no:xdist -p no:cacheprovider -o addopts="" --collect-only $TESTS
  # the main job's path on a tiny model: one SFT step, one GRPO step, one evaluation of 4 problems; 16 new tokens,
  # 2 samples per eval problem and a 64-example train split (not the config's 72, 4 and 20,000): the same stages and
  # programs, ~20% fewer CPU-seconds (test_device_check runs it in every CI run)
  stage main 120 "$PY" -m grpo_jax.main --config=configs/grpo_arith.py:small --workdir="$OUT/main" \
    --config.model.hidden=32 --config.model.layers=1 --config.model.inter=64 --config.sft.steps=1 \
    --config.sft.batch=8 --config.train.steps=1 --config.train.eval_every=1 --config.eval.size=4 \
    --config.eval.batch=4 --config.eval.n_samples=2 --config.sampling.max_new_tokens=16 \
    --config.task.train_size=64 --config.task.test_size=16 --config.log.plots=False --config.log.tensorboard=False
  stage bench 120 "$PY" benchmarks/grpo_step.py --hidden 32 --layers 1 --heads 2 --kv 1 --inter 64 --vocab 64 \
    --prompts 8 --G 8 --L 32 --steps 2 --no-perf
else
  stage tests 210 "$PY" -m pytest -q -p no:xdist -p no:cacheprovider -o addopts="" -rs $TESTS
  stage main 150 "$PY" -m grpo_jax.main --config=configs/grpo_arith.py --workdir="$OUT/main" \
    --config.sft.steps=50 --config.train.steps=5 --config.train.eval_every=5 --config.eval.size=100 \
    --config.log.plots=False --config.log.tensorboard=False
  stage bench 180 "$PY" benchmarks/grpo_step.py --hidden 1024 --layers 8 --heads 16 --kv 4 --inter 4096 \
    --vocab 32000 --prompts 16 --G 8 --L 256 --steps 4 --dtype bfloat16
fi

# the figures: the main job's steps (perf/step_time_s), the benchmark's RESULT line and its MFU / HBM line
"$PY" - "$OUT" >> "$SUMMARY" <<'EOF'
import json, os, re, sys
out = sys.argv[1]
rows = []
if os.path.exists(os.path.join(out, "main", "metrics.jsonl")):
  rows = [json.loads(l) for l in open(os.path.join(out, "main", "metrics.jsonl"))]
steps = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r]
if steps:
  print(f"FIGURE main_steps={len(steps)} first_step_s={steps[0]:.2f} "
        f"later_step_s={(sorted(steps[1:])[len(steps[1:]) // 2] if len(steps) > 1 else float('nan')):.3f} "
        f"eval_accuracy={[r['eval/accuracy'] for r in rows if 'eval/accuracy' in r]}")
log = open(os.path.join(out, "bench.log")).read() if os.path.exists(os.path.join(out, "bench.log")) else ""
for line in log.splitlines():
  if line.startswith("RESULT ") or re.search(r": MFU step ", line) or line.startswith("grpo_jax auto:"):
    print("FIGURE " + line)
EOF
echo "DEVICE_CHECK $([[ $FAILED -eq 0 ]] && echo ok || echo failed) mode=$MODE total_seconds=$((SECONDS - T0))" \
  | tee -a "$SUMMARY"
exit $FAILED
