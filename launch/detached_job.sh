# Sourced by tpu_vm.sh and gpu_multinode.sh: the job on each host runs detached from the ssh session that started
# it, and the launcher stops it with SIGINT when it is itself interrupted.
#
# Why: the job used to run inside the session (`python ... 2>&1 | tee run.log`). A Ctrl-C or SIGTERM to the launcher
# killed only the local ssh / gcloud (without a pty the remote side gets no signal), and when the session went away
# (that, a laptop asleep, a network blip) tee died of SIGPIPE and the job's next log line raised BrokenPipeError:
# the run died without saving. Now each host keeps, under ~/grpo_logs/, per run name (B below):
#   B.log     the job's output (stdout and stderr)
#   B.pgid    the job's process group (= its session: setsid), written when it starts
#   B.status  its exit status, written when it ends (absent while it runs)
# and the session only follows B.log, then exits with B.status.

# The job's wrapper on the host, run by `setsid -f bash -c` with $0 = B: it survives the SIGINT the stop sends to
# its group (the trap; bash defers it until python exits) so that it can write python's status. `setsid -f`, not
# `setsid ... &`: a non-interactive shell starts `&` commands with SIGINT ignored, which the job would inherit.
DETACHED_WRAPPER='trap : INT TERM HUP; echo $$ > "$0.pgid"; "$@" > "$0.log" 2>&1; '
DETACHED_WRAPPER+='echo $? > "$0.status.tmp"; mv "$0.status.tmp" "$0.status"'  # written whole: a reader never sees ""

# Host-side: follows "$B.log" from line $1 (tail -n's argument) until the job has ended or $2 seconds have passed
# (0: no limit), then exits with the job's status; 124 when it is still running, 1 when it ended without one
# (killed with SIGKILL). The watcher loop, not `tail --pid=<job>`: the job is not this shell's child, and a host
# whose init is slow to reap leaves it a zombie that kill -0 still finds.
detached_follow() {
  local from="$1" limit="$2"
  cat <<EOF
P=""; for i in \$(seq 100); do P=\$(cat "\$B.pgid" 2>/dev/null) && [ -n "\$P" ] && break; sleep 0.1; done; \
(t=0; while [ ! -f "\$B.status" ] && kill -0 "\$P" 2>/dev/null && [ $limit = 0 -o \$t -lt \$(($limit * 2)) ]; \
do sleep 0.5; t=\$((t + 1)); done) & W=\$!; tail -n $from -s 0.5 -F --pid=\$W "\$B.log" 2>/dev/null; \
kill \$W 2>/dev/null; \
if [ -f "\$B.status" ]; then exit "\$(cat "\$B.status")"; fi; \
if [ -n "\$P" ] && kill -0 "\$P" 2>/dev/null; then echo "\$(hostname): the job is still running after $limit s \
(process group \$P)" >&2; exit 124; fi; echo "\$(hostname): the job ended without a status (killed?)" >&2; exit 1
EOF
}

# Host-side: starts the job detached and follows its log. $1: B (~/grpo_logs/NAME), $2: env assignments, $3: the
# command, quoted for the host's shell. One && chain up to the start (with what the caller puts before it, `cd DIR
# &&`): a step that fails exits, and the job never starts in the wrong place. A job of the same run still running
# there is refused (its B.pgid would be overwritten: the launcher could no longer stop it).
detached_start() {
  local b="$1" env="$2" cmd="$3"
  echo -n "mkdir -p ~/grpo_logs && B=$b && if [ -f \"\$B.pgid\" ] && [ ! -f \"\$B.status\" ] && \
kill -0 -- -\"\$(cat \"\$B.pgid\")\" 2>/dev/null; then echo \"error: \$(hostname): a job of this run is still running \
(process group \$(cat \"\$B.pgid\")); see launch/README.md to re-attach or stop it\" >&2; exit 2; fi && \
rm -f \"\$B.pgid\" \"\$B.status\" && : > \"\$B.log\" && $env setsid -f bash -c '$DETACHED_WRAPPER' \"\$B\" $cmd \
</dev/null &>/dev/null || exit 1; "
  detached_follow +1 0
}

# Host-side: SIGINT to the job's process group (grpo_jax.main finishes the step, saves, exits 0), then follows the
# log until it has ended, at most $2 seconds. $1: B. (A job started a moment ago may not have written B.pgid yet.)
detached_stop() {
  echo -n "B=$1; for i in \$(seq 100); do [ -s \"\$B.pgid\" ] && break; sleep 0.1; done; \
P=\$(cat \"\$B.pgid\" 2>/dev/null) || { echo \"\$(hostname): no job (\$B.pgid is missing)\" >&2; exit 1; }; \
[ -f \"\$B.status\" ] || kill -INT -- -\"\$P\" 2>/dev/null; "
  detached_follow 5 "$2"  # the last lines too: the job's first reply to the signal may be in the log already
}

# Launcher-side. The streams (ssh / gcloud following each host's log) run in the background, their pids in STREAMS,
# so that a signal is handled at once: bash runs a trap only after its foreground command exits. wait_streams
# fills STREAM_RCS with their statuses, or returns 1 as soon as SIGINT, SIGTERM or SIGHUP arrives (its name in
# SIGNALLED). A signal the launcher's caller ignores (nohup: SIGHUP) cannot be trapped and stays ignored.
STREAMS=() STREAM_RCS=() SIGNALLED=""
trap_stop_signals() { trap 'SIGNALLED=INT' INT; trap 'SIGNALLED=TERM' TERM; trap on_hup HUP; }
# SIGHUP: the terminal is gone (or the pipe to it: `launcher | tee`, tee dead with it). The stop must still run, and
# a line written there would end this script (EIO with set -e, or SIGPIPE) before it: a terminal or pipe is swapped
# for /dev/null; a file (`launcher > log 2>&1`) keeps the lines.
on_hup() {
  SIGNALLED=HUP
  if [[ -t 1 || -p /dev/stdout ]]; then exec >/dev/null; fi
  if [[ -t 2 || -p /dev/stderr ]]; then exec 2>/dev/null; fi
}
wait_streams() {
  local i rc
  for i in "${!STREAMS[@]}"; do
    [[ -z "$SIGNALLED" ]] || return 1  # it came while the streams started
    wait "${STREAMS[$i]}" && rc=0 || rc=$?
    [[ -z "$SIGNALLED" ]] || return 1  # wait returned for the trap: the stream may still be running
    STREAM_RCS[$i]=$rc
  done
}

# After a signal: the streams are stopped (the stop commands follow the logs instead), the commands that send the
# jobs SIGINT and wait for them run in the background (pids in STOPPERS, started by the caller), and a second
# signal stops waiting: exit 130, the jobs go on stopping on their own.
STOPPERS=()
stop_streams() {
  echo "launch: SIG$SIGNALLED received: sending SIGINT to the job on every host (it finishes the step, saves and \
exits 0); waiting up to ${STOP_TIMEOUT}s. Ctrl-C again stops waiting (the jobs go on stopping)." >&2
  local p
  for p in "${STREAMS[@]}"; do  # gcloud runs ssh as its child, which SIGTERM to gcloud alone leaves streaming
    pkill -TERM -P "$p" 2>/dev/null || true
    kill "$p" 2>/dev/null || true
  done
  trap 'kill "${STOPPERS[@]}" 2>/dev/null || true; echo "launch: stopped waiting; the jobs go on stopping on their own \
(see launch/README.md to follow or collect their logs)" >&2; exit 130' INT TERM HUP
}
