# Sourced by train.sbatch and mpirun_ec2.sh: a launcher (srun, mpirun) run in the
# background with its messages kept, to name the node of a rank that died, and shown as
# they come; the wait for it through the USR1 the scripts pass on to the ranks.

# start_step LOG COMMAND...: sets step_pid (the launcher) and step_tail_pid.
start_step() {
  local log=$1
  shift
  : > "$log"
  "$@" 2>>"$log" &
  step_pid=$!
  tail -s 0.2 -n +1 -f --pid="$step_pid" "$log" >&2 &
  step_tail_pid=$!
}

# wait_step: the launcher's exit status into $status. A trapped signal ends `wait` early
# (status > 128) while the ranks still save: wait again; if they ended meanwhile, one more
# wait returns their status (127: it was this one).
wait_step() {
  local last
  while true; do
    status=0
    wait "$step_pid" || status=$?
    [ "$status" -gt 128 ] || break
    kill -0 "$step_pid" 2>/dev/null && continue
    last=0
    wait "$step_pid" 2>/dev/null || last=$?
    [ "$last" = 127 ] || status=$last
    break
  done
  wait "$step_tail_pid" 2>/dev/null || true
}

# dead_rank_node LOG: the node the launcher names for the first rank that died (srun:
# "srun: error: NODE: task N: Killed", before it ends the others; mpirun: "... on node NODE
# exited on signal 9"), or nothing.
dead_rank_node() {
  sed -n -e 's/^srun: error: \([^:]*\): tasks\{0,1\} [0-9,-]*: [A-Z].*/\1/p' \
         -e 's/.* on node \([^ ]*\) exited on signal .*/\1/p' "$1" 2>/dev/null | head -1
}
