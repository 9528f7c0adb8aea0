#!/usr/bin/env bash
# Runs grpo_jax on a Cloud TPU VM or a pod slice (all workers), big_vision's run_tpu.sh style.
#
# Steps, each idempotent: create the TPU (skipped if it exists), copy this repo (git archive of HEAD plus
# uncommitted tracked changes) to every worker, set up a venv once per worker (jax[tpu] + this package), run
# `GRPO_JAX_DISTRIBUTED=1 python -m grpo_jax.main ...` on --worker=all (one process per host; JAX discovers the pod),
# then copy each worker's log back into ./tpu_logs/<name>/.
#
#   launch/tpu_vm.sh --name grpo-v5e16 --zone us-west4-a --accelerator v5litepod-16 --version v2-alpha-tpuv5-lite \
#       --config configs/grpo_arith.py --workdir /mnt/my-bucket/runs/arith -- --config.train.steps=200
#   launch/tpu_vm.sh ... --dry-run         # print the gcloud commands, run nothing
#   launch/tpu_vm.sh ... --delete          # delete the TPU after the run
set -euo pipefail

NAME="" ZONE="" PROJECT="" ACCEL="v5litepod-16" VERSION="" SPOT=0 DRY=0 DELETE=0 CREATE=1
CONFIG="configs/grpo_arith.py" WORKDIR="" WORKERS="" MODULE="grpo_jax.main" REMOTE_DIR="grpo_jax_src"
VENV="\$HOME/grpo_jax_venv" JAX_VERSION="0.10.2" LOG_DIR="tpu_logs"
EXTRA=()

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit "${1:-0}"; }  # the header
die() { echo "error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in --name|--zone|--project|--accelerator|--version|--config|--workdir|--workers|--module) [[ $# -ge 2 ]] || die "$1 needs a value; see --help";; esac
  case "$1" in
    --name) NAME="$2"; shift 2;;
    --zone) ZONE="$2"; shift 2;;
    --project) PROJECT="$2"; shift 2;;
    --accelerator) ACCEL="$2"; shift 2;;
    --version) VERSION="$2"; shift 2;;
    --config) CONFIG="$2"; shift 2;;
    --workdir) WORKDIR="$2"; shift 2;;
    --workers) WORKERS="$2"; shift 2;;
    --module) MODULE="$2"; shift 2;;
    --spot) SPOT=1; shift;;
    --no-create) CREATE=0; shift;;
    --delete) DELETE=1; shift;;
    --dry-run) DRY=1; shift;;
    -h|--help) usage 0;;
    --) shift; EXTRA=("$@"); break;;
    *) die "unknown flag $1; see --help";;
  esac
done
[[ -n "$NAME" ]] || die "--name is required (the TPU VM's name)"
# checked here: a bad count was bash's 'unbound variable' (exit 1) at the log collection, after the whole run
[[ -z "$WORKERS" || "$WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--workers=$WORKERS must be a positive integer (the hosts)"
[[ -n "$ZONE" ]] || die "--zone is required (e.g. us-west4-a)"
[[ -n "$WORKDIR" ]] || die "--workdir is required (an absolute path every worker mounts)"
# grpo_jax.main refuses an object-store workdir (its records are written with local file calls): before a TPU is made.
[[ "$WORKDIR" != *://* ]] || die "--workdir=$WORKDIR: an object-store workdir is not supported (the run's records \
are written with local file calls); pass an absolute path every worker mounts, e.g. the bucket mounted with gcsfuse"
# A relative path would land inside ~/$REMOTE_DIR on every worker, which the next launch's copy step deletes
# (rm -rf): a resume would find no checkpoints and start over.
[[ "$WORKDIR" == /* ]] || die "--workdir=$WORKDIR is relative: on the workers it would \
land inside ~/$REMOTE_DIR, which the next launch deletes; pass an absolute path every worker mounts"

if [[ -z "$VERSION" ]]; then  # the TPU software image that matches each generation
  case "$ACCEL" in
    v5litepod-*) VERSION="v2-alpha-tpuv5-lite";;
    v5p-*) VERSION="v2-alpha-tpuv5";;
    v6e-*) VERSION="v2-alpha-tpuv6e";;
    v4-*) VERSION="tpu-ubuntu2204-base";;
    *) die "--version is required for --accelerator=$ACCEL (the TPU software image)";;
  esac
fi

REPO="$(cd "$(dirname "$0")/.." && pwd)"
GC=(gcloud compute tpus tpu-vm)
LOC=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project="$PROJECT")

# Prints a command (prefixed "+ ", arguments with shell characters in single quotes); runs it unless --dry-run.
run() {
  local out="+" a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then out+=" $a"; else out+=" ${a@Q}"; fi
  done
  echo "$out"
  [[ "$DRY" == 1 ]] || "$@"
}

# Hosts in the slice: from the TPU's network endpoints, or the chip count / 4 chips per host when dry-running.
count_workers() {
  if [[ -n "$WORKERS" ]]; then echo "$WORKERS"; return; fi
  if [[ "$DRY" == 0 ]]; then  # a preempted or deleted TPU lists none (or describe fails): 0, not an exit
    { "${GC[@]}" describe "$NAME" "${LOC[@]}" --format='value(networkEndpoints.ipAddress)' 2>/dev/null || true; } \
      | tr ';' '\n' | grep -c . || true
    return
  fi
  local n="${ACCEL##*-}"
  case "$ACCEL" in
    v5litepod-*|v6e-*) echo $(( n > 8 ? n / 4 : 1 ));;      # v5e / v6e: suffix = chips
    v4-*|v5p-*) echo $(( n > 8 ? n / 8 : 1 ));;              # v4 / v5p: suffix = TensorCores (2 per chip)
    *) echo 1;;
  esac
}

# 1. create (idempotent)
if [[ "$CREATE" == 1 ]]; then
  if [[ "$DRY" == 0 ]] && "${GC[@]}" describe "$NAME" "${LOC[@]}" >/dev/null 2>&1; then
    echo "TPU $NAME exists; not creating it."
  else
    CREATE_CMD=("${GC[@]}" create "$NAME" "${LOC[@]}" --accelerator-type="$ACCEL" --version="$VERSION")
    [[ "$SPOT" == 1 ]] && CREATE_CMD+=(--spot)
    run "${CREATE_CMD[@]}"
  fi
fi

# 2. copy the code to all workers (a tarball keeps scp to one file per worker)
TARBALL="/tmp/grpo_jax_src.tar.gz"
if [[ "$DRY" == 0 ]]; then
  TARBALL="$(mktemp -d)/grpo_jax_src.tar.gz"
  STASH="$(cd "$REPO" && git stash create || true)"
  (cd "$REPO" && git archive --format=tar.gz -o "$TARBALL" "${STASH:-HEAD}")
fi
run "${GC[@]}" scp "$TARBALL" "$NAME:grpo_jax_src.tar.gz" "${LOC[@]}" --worker=all
run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all \
  --command="rm -rf $REMOTE_DIR && mkdir -p $REMOTE_DIR && tar -xzf grpo_jax_src.tar.gz -C $REMOTE_DIR"

# 3. venv once per worker (a marker file records the jax version it was built for)
SETUP="set -e; if [ ! -f $VENV/.grpo_jax_$JAX_VERSION ]; then python3 -m venv $VENV && \
$VENV/bin/pip install -q 'jax[tpu]==$JAX_VERSION' && touch $VENV/.grpo_jax_$JAX_VERSION; fi; \
$VENV/bin/pip install -q -e $REMOTE_DIR"
run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command="$SETUP"

# 4. run on every host; each writes its own log, and gcloud streams all of them here. Every argument is quoted for
# the remote shell (a --workdir with a space was split there into --workdir=<its first word> and a stray argument).
QEXTRA=""
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do QEXTRA+=" $(printf '%q' "$a")"; done
RUN="cd $REMOTE_DIR && mkdir -p ~/grpo_logs && GRPO_JAX_DISTRIBUTED=1 $VENV/bin/python -m $MODULE \
--config=$(printf '%q' "$CONFIG") --workdir=$(printf '%q' "$WORKDIR")$QEXTRA 2>&1 | tee ~/grpo_logs/run.log; exit \${PIPESTATUS[0]}"
STATUS=0
run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command="$RUN" || STATUS=$?

# 5. collect logs from every worker
# (this exited 1 here, silently, when the TPU listed no workers: the run's status lost and --delete skipped)
N_WORKERS="$(count_workers)"
[[ "$N_WORKERS" -ge 1 ]] || echo "warning: TPU $NAME lists no workers now (preempted or deleted?); no logs collected" >&2
run mkdir -p "$LOG_DIR/$NAME"
for ((w = 0; w < N_WORKERS; w++)); do
  run "${GC[@]}" scp "$NAME:grpo_logs/run.log" "$LOG_DIR/$NAME/worker$w.log" "${LOC[@]}" --worker="$w" || true
done

if [[ "$DELETE" == 1 ]]; then
  run "${GC[@]}" delete "$NAME" "${LOC[@]}" --quiet
fi
exit "$STATUS"
