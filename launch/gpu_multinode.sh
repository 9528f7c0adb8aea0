#!/usr/bin/env bash
# Runs grpo_jax on several GPU nodes: one process per node seeing all its GPUs, joined by jax.distributed.
#
# Two ways to reach the nodes:
#   --slurm: one `srun` step (one task per node). JAX reads SLURM's variables itself, so only
#            GRPO_JAX_DISTRIBUTED=1 is set, and JAX_LOCAL_DEVICE_IDS=0,...,G-1 (JAX's SLURM default is one GPU per
#            process). Run it inside an allocation (salloc / sbatch).
#   --hosts h1,h2,...: plain ssh. The code is rsynced to every host, a venv is set up once per host, and each host
#            gets GRPO_JAX_COORDINATOR=<first host>:PORT, GRPO_JAX_NUM_PROCESSES, GRPO_JAX_PROCESS_ID.
# Logs land in ./gpu_logs/<run>/node<i>.log (ssh mode: collected with scp; slurm mode: srun --output).
# --hosts: the job on each host runs detached from its ssh session (launch/detached_job.sh): a dropped session
# leaves it running, its log in ~/grpo_logs/<run>.log and its status in <run>.status (launch/README.md:
# re-attaching). Ctrl-C, SIGTERM or SIGHUP to this script sends every host's job SIGINT (it finishes the step,
# saves, exits 0), waits for them (at most --stop-timeout seconds, default 600), collects the logs and exits with
# the first failing job's status (0 after a clean stop); a second Ctrl-C stops waiting (exit 130).
#
#   launch/gpu_multinode.sh --slurm --nodes 2 --gpus-per-node 8 --config configs/grpo_arith.py --workdir /shared/r1
#   launch/gpu_multinode.sh --hosts gpu1,gpu2 --config configs/grpo_arith.py --workdir /shared/r1 -- --config.x=1
#   add --dry-run to print the commands instead of running them
set -euo pipefail

MODE="" HOSTS="" NODES=2 GPUS=8 PORT=12345 CONFIG="configs/grpo_arith.py" WORKDIR="" MODULE="grpo_jax.main"
REMOTE_DIR="grpo_jax_src" VENV="\$HOME/grpo_jax_venv" JAX_VERSION="0.10.2" LOG_DIR="gpu_logs" RUN_NAME="" DRY=0
STOP_TIMEOUT=600
EXTRA=()

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit "${1:-0}"; }  # the header
die() { echo "error: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in --hosts|--nodes|--gpus-per-node|--port|--config|--workdir|--module|--run-name|--stop-timeout) [[ $# -ge 2 ]] || die "$1 needs a value; see --help";; esac
  case "$1" in
    --slurm) MODE=slurm; shift;;
    --hosts) MODE=ssh; HOSTS="$2"; shift 2;;
    --nodes) NODES="$2"; shift 2;;
    --gpus-per-node) GPUS="$2"; shift 2;;
    --port) PORT="$2"; shift 2;;
    --config) CONFIG="$2"; shift 2;;
    --workdir) WORKDIR="$2"; shift 2;;
    --module) MODULE="$2"; shift 2;;
    --run-name) RUN_NAME="$2"; shift 2;;
    --stop-timeout) STOP_TIMEOUT="$2"; shift 2;;
    --dry-run) DRY=1; shift;;
    -h|--help) usage 0;;
    --) shift; EXTRA=("$@"); break;;
    *) die "unknown flag $1; see --help";;
  esac
done
[[ -n "$MODE" ]] || die "choose --slurm or --hosts h1,h2,..."
[[ -n "$WORKDIR" ]] || die "--workdir is required (a path every node can write, e.g. on a shared filesystem)"
# grpo_jax.main refuses an object-store workdir (its records are written with local file calls).
[[ "$WORKDIR" != *://* ]] || die "--workdir=$WORKDIR: an object-store workdir is not supported (the run's records \
are written with local file calls); pass an absolute path on a shared filesystem"
# A relative path would resolve inside the code's copy on every node (ssh: ~/$REMOTE_DIR, which the next launch's
# rsync --delete empties; slurm: the repository, not this directory): a resume would find no checkpoints.
[[ "$WORKDIR" == /* ]] || die "--workdir=$WORKDIR is relative: on the nodes it would \
resolve inside the code's copy (which the next --hosts launch deletes); pass an absolute path on a shared filesystem"
# numbers checked here: a bad one failed on the nodes, after the copy and set-up (GRPO_JAX_COORDINATOR=h1:abc)
for kv in "--nodes=$NODES" "--gpus-per-node=$GPUS" "--port=$PORT" "--stop-timeout=$STOP_TIMEOUT"; do
  [[ "${kv#*=}" =~ ^[1-9][0-9]*$ ]] || die "$kv must be a positive integer"
done
RUN_NAME="${RUN_NAME:-$(basename "$WORKDIR")}"
RUN_NAME="${RUN_NAME//[^A-Za-z0-9_.-]/_}"  # a log file name on every node and here
REPO="$(cd "$(dirname "$0")/.." && pwd)"
QREPO="$(printf '%q' "$REPO")"
. "$REPO/launch/detached_job.sh"

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

QEXTRA=""
for a in "${EXTRA[@]+"${EXTRA[@]}"}"; do QEXTRA+=" $(printf '%q' "$a")"; done
# every argument quoted for the remote shell (a --workdir with a space was split there into two arguments)
TRAIN="-m $MODULE --config=$(printf '%q' "$CONFIG") --workdir=$(printf '%q' "$WORKDIR")$QEXTRA"

if [[ "$MODE" == slurm ]]; then
  # Shared filesystem assumed: the venv is built once, by the first node, next to the code.
  SETUP="set -e; cd $QREPO; if [ ! -f .venv_gpu/.grpo_jax_$JAX_VERSION ]; then python3 -m venv .venv_gpu && \
.venv_gpu/bin/pip install -q 'jax[cuda12]==$JAX_VERSION' && .venv_gpu/bin/pip install -q -e . && \
touch .venv_gpu/.grpo_jax_$JAX_VERSION; fi"
  run srun --nodes=1 --ntasks=1 bash -c "$SETUP"
  run mkdir -p "$LOG_DIR/$RUN_NAME"
  # JAX's SLURM detection makes each process see only GPU SLURM_LOCALID (one process per GPU): with one task per
  # node that was GPU 0 of every node. JAX_LOCAL_DEVICE_IDS (commas: not in --export's list) keeps all of them.
  IDS="$(seq -s, 0 $((GPUS - 1)))"
  run srun --nodes="$NODES" --ntasks-per-node=1 --gpus-per-node="$GPUS" --kill-on-bad-exit=1 \
    --output="$LOG_DIR/$RUN_NAME/node%t.log" --export=ALL,GRPO_JAX_DISTRIBUTED=1 \
    bash -c "cd $QREPO && JAX_LOCAL_DEVICE_IDS=$IDS .venv_gpu/bin/python $TRAIN"
  exit 0
fi

IFS=',' read -r -a HOST_LIST <<< "$HOSTS"
N="${#HOST_LIST[@]}"
[[ "$N" -ge 1 ]] || die "--hosts needs at least one host name"
for h in "${HOST_LIST[@]}"; do  # an empty or spaced name would be a process of the job that never starts (a hang)
  [[ "$h" =~ ^[A-Za-z0-9_.@-]+$ ]] || die "--hosts=$HOSTS: host name '$h' is empty or has a space or colon; write [user@]h1,h2,..."
done
COORD="${HOST_LIST[0]#*@}:$PORT"  # the first host's name (ssh's user@ is not part of the address)

SETUP="set -e; if [ ! -f $VENV/.grpo_jax_$JAX_VERSION ]; then python3 -m venv $VENV && \
$VENV/bin/pip install -q 'jax[cuda12]==$JAX_VERSION' && touch $VENV/.grpo_jax_$JAX_VERSION; fi; \
$VENV/bin/pip install -q -e $REMOTE_DIR"
for h in "${HOST_LIST[@]}"; do
  run rsync -az --delete --exclude=.git --exclude='*.pyc' "$REPO/" "$h:$REMOTE_DIR/"
  run ssh "$h" "$SETUP"
done

run mkdir -p "$LOG_DIR/$RUN_NAME"
B="~/grpo_logs/$RUN_NAME"  # the job's files on each host: B.log, B.pgid, B.status (launch/detached_job.sh)
STOP="$(detached_stop "$B" "$STOP_TIMEOUT")"
[[ "$DRY" == 1 ]] || trap_stop_signals
for ((i = 0; i < N; i++)); do
  h="${HOST_LIST[$i]}"
  CMD="cd $REMOTE_DIR && $(detached_start "$B" "GRPO_JAX_DISTRIBUTED=1 GRPO_JAX_COORDINATOR=$COORD \
GRPO_JAX_NUM_PROCESSES=$N GRPO_JAX_PROCESS_ID=$i" "$VENV/bin/python $TRAIN")"
  if [[ "$DRY" == 1 ]]; then
    run ssh "$h" "$CMD"
  else
    # Every line prefixed with its node so interleaved output stays readable; $! is ssh's pid (the stop kills it).
    show ssh "$h" "$CMD"
    ssh "$h" "$CMD" > >(sed -u "s/^/[node$i] /") 2>&1 &
    STREAMS+=($!)
  fi
done
STATUS=0
if [[ "$DRY" == 1 ]]; then
  for h in "${HOST_LIST[@]}"; do PREFIX="# on Ctrl-C, SIGTERM or SIGHUP:" show ssh "$h" "$STOP"; done
elif wait_streams; then
  for i in "${!STREAM_RCS[@]}"; do
    [[ "$STATUS" != 0 ]] || STATUS="${STREAM_RCS[$i]}"  # the first failing job's
    if [[ "${STREAM_RCS[$i]}" == 255 ]]; then  # ssh's own status: the connection failed or was lost, not the job's
      echo "launch: node$i's session ended with ssh's status 255 (connection lost?): its job runs on, detached; \
see launch/README.md to follow it, stop it or collect its log" >&2
    fi
  done
else
  stop_streams
  for ((i = 0; i < N; i++)); do
    show ssh "${HOST_LIST[$i]}" "$STOP"
    ssh "${HOST_LIST[$i]}" "$STOP" > >(sed -u "s/^/[node$i] /") 2>&1 &
    STOPPERS+=($!)
  done
  for p in "${STOPPERS[@]}"; do
    wait "$p" && rc=0 || rc=$?
    [[ "$STATUS" != 0 ]] || STATUS="$rc"
  done
fi
[[ "$DRY" == 1 ]] || trap - INT TERM HUP
for ((i = 0; i < N; i++)); do
  run scp "${HOST_LIST[$i]}:grpo_logs/$RUN_NAME.log" "$LOG_DIR/$RUN_NAME/node$i.log" || true
done
exit "$STATUS"
