#!/usr/bin/env bash
# Runs grpo_jax on a Cloud TPU VM or a pod slice (all workers), big_vision's run_tpu.sh style.
#
# Steps, each idempotent: create the TPU (skipped if it exists), copy this repo (git archive of HEAD plus
# uncommitted tracked changes) to every worker, set up a venv once per worker (jax[tpu] + this package), run
# `GRPO_JAX_DISTRIBUTED=1 python -m grpo_jax.main ...` on --worker=all (one process per host; JAX discovers the pod),
# then copy each worker's log back into ./tpu_logs/<name>/.
# The job on each worker runs detached from the ssh session (launch/detached_job.sh): a dropped session leaves it
# running, its log in ~/grpo_logs/run.log and its status in run.status (launch/README.md: re-attaching). Ctrl-C,
# SIGTERM or SIGHUP to this script sends every worker's job SIGINT (it finishes the step, saves, exits 0), waits
# for them (at most --stop-timeout seconds, default 600), collects the logs and exits with the jobs' status; a
# second Ctrl-C stops waiting (exit 130).
#
#   launch/tpu_vm.sh --name grpo-v5e16 --zone us-west4-a --accelerator v5litepod-16 --version v2-alpha-tpuv5-lite \
#       --config configs/grpo_arith.py --workdir /mnt/my-bucket/runs/arith -- --config.train.steps=200
#   launch/tpu_vm.sh ... --dry-run         # print the gcloud commands, run nothing
#   launch/tpu_vm.sh ... --delete          # delete the TPU after the run
set -euo pipefail

NAME="" ZONE="" PROJECT="" ACCEL="v5litepod-16" VERSION="" SPOT=0 DRY=0 DELETE=0 CREATE=1
CONFIG="configs/grpo_arith.py" WORKDIR="" WORKERS="" MODULE="grpo_jax.main" REMOTE_DIR="grpo_jax_src"
VENV="\$HOME/grpo_jax_venv" JAX_VERSION="0.10.2" LOG_DIR="tpu_logs" STOP_TIMEOUT=600
EXTRA=()

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit "${1:-0}"; }  # the header
die() { echo "error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in --name|--zone|--project|--accelerator|--version|--config|--workdir|--workers|--module|--stop-timeout) [[ $# -ge 2 ]] || die "$1 needs a value; see --help";; esac
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
    --stop-timeout) STOP_TIMEOUT="$2"; shift 2;;
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
[[ "$STOP_TIMEOUT" =~ ^[1-9][0-9]*$ ]] || die "--stop-timeout=$STOP_TIMEOUT must be a positive integer (seconds)"
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
. "$REPO/launch/detached_job.sh"
GC=(gcloud compute tpus tpu-vm)
LOC=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project="$PROJECT")

# show: prints a command (prefixed "+ ", arguments with shell characters in single quotes); run: prints it and runs
# it unless --dry-run.
show() {
  local out="${PREFIX:-+}" a
  for a in "$@"; do
    if [[ "$a" =~ ^[A-Za-z0-9_./:=@,+%-]+$ ]]; then out+=" $a"; else out+=" ${a@Q}"; fi
  done
  echo "$out"
}
run() { show "$@"; [[ "$DRY" == 1 ]] || "$@"; }

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

# 4. run on every host, detached (launch/detached_job.sh); each writes its own log, and gcloud streams all of them
# here. Every argument is quoted for the remote shell (a --workdir with a space was split there into
# --workdir=<its first word> and a stray argument).
QEXTRA=""
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do QEXTRA+=" $(printf '%q' "$a")"; done
JOB="$VENV/bin/python -m $MODULE --config=$(printf '%q' "$CONFIG") --workdir=$(printf '%q' "$WORKDIR")$QEXTRA"
RUN="cd $REMOTE_DIR && $(detached_start "~/grpo_logs/run" "GRPO_JAX_DISTRIBUTED=1" "$JOB")"
STOP_CMD=("${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all \
  --command="$(detached_stop "~/grpo_logs/run" "$STOP_TIMEOUT")")
STATUS=0 ENDED=1  # ENDED=0: a job may still be running (a lost session, a stop that timed out): no --delete
if [[ "$DRY" == 1 ]]; then
  run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command="$RUN"
  PREFIX="# on Ctrl-C, SIGTERM or SIGHUP:" show "${STOP_CMD[@]}"
else
  trap_stop_signals
  show "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command="$RUN"
  "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command="$RUN" &
  STREAMS=($!)
  if wait_streams; then
    STATUS="${STREAM_RCS[0]}"
    if [[ "$STATUS" == 255 ]]; then  # ssh's own status: the connection failed or was lost, not the job's
      ENDED=0
      echo "launch: the session ended with ssh's status 255 (connection lost?): the job on each worker runs on, \
detached; see launch/README.md to follow it, stop it or collect its log" >&2
    fi
  else
    stop_streams
    show "${STOP_CMD[@]}"
    "${STOP_CMD[@]}" &
    STOPPERS=($!)
    wait "${STOPPERS[0]}" && STATUS=0 || STATUS=$?
    [[ "$STATUS" != 124 ]] || ENDED=0  # some job still saving after --stop-timeout
  fi
  trap - INT TERM HUP
fi

# 5. collect logs from every worker
# (this exited 1 here, silently, when the TPU listed no workers: the run's status lost and --delete skipped)
N_WORKERS="$(count_workers)"
if [[ "$N_WORKERS" -lt 1 ]]; then
  echo "warning: TPU $NAME lists no workers now (preempted or deleted?); no logs collected" >&2
  ENDED=1  # no job runs on a TPU without workers: the lost session (255) was the preemption, and --delete goes on
fi
run mkdir -p "$LOG_DIR/$NAME"
for ((w = 0; w < N_WORKERS; w++)); do
  run "${GC[@]}" scp "$NAME:grpo_logs/run.log" "$LOG_DIR/$NAME/worker$w.log" "${LOC[@]}" --worker="$w" || true
done

if [[ "$DELETE" == 1 && "$ENDED" == 0 ]]; then
  echo "warning: not deleting TPU $NAME: its job may still be running (delete it with \
${GC[*]} delete $NAME ${LOC[*]})" >&2
elif [[ "$DELETE" == 1 ]]; then
  run "${GC[@]}" delete "$NAME" "${LOC[@]}" --quiet
fi
exit "$STATUS"
