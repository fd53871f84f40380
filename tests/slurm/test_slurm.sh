#!/usr/bin/env bash
# The launch scripts on a real Slurm: starts a single-node Slurm on this machine (Debian's
# slurmctld, slurmd and munge; shared/SLURM_LOCAL.md has the recipe), submits the
# sbatch lines of docs/clusters.md and checks what a user relies on:
#   - a job trains to the end and exits 0 (srun --mpi=pmix, and mpirun inside the allocation);
#   - USR1 to the batch shell (what --signal=B:USR1@120 sends) makes the ranks checkpoint,
#     the script requeue, and the requeued run resume and end with the uninterrupted losses;
#   - a bad config ends with exit 2 and no requeue;
#   - a rank killed with SIGKILL requeues the job, at most TRIDENT_MAX_RESTARTS times;
#   - healing: a rank stopped (SIGSTOP) is named, its node drained with the reason, the
#     requeued job waits, and once the node is resumed it completes with the uninterrupted
#     losses; a failed preflight drains the node (or, with TRIDENT_DRAIN=0, excludes it
#     from the job) before any step; a bad TRIDENT_* value is exit 2; a job requeued with
#     fewer tasks continues from its checkpoint to the uninterrupted losses;
#   - spares: a rank killed on one of three node names (three slurmd on this host), the
#     node replaced by the spare and the next job step started in the allocation, resuming
#     from node memory (the partner's copy) to the uninterrupted losses;
#   - slurm/sweep.sbatch: a row per point, an impossible point recorded as failed;
#   - slurm/doctor.sbatch: the preflight passes on this node;
#   - slurm/mpirun_ec2.sh with a hostfile of this machine: to the end, USR1 + resume, and a
#     killed rank's run started again at once, from node memory.
# Slurm is stopped at the end whatever happened. Without root (or passwordless sudo) or
# where the packages cannot be installed, every check is reported as skipped.
# Prints one line per check (PASS/FAIL/SKIP) and "slurm summary: N passed, N failed, N skipped".
# Usage: tests/slurm/test_slurm.sh [BUILD_DIR]   (from the repository root)
set -uo pipefail
build=${1:-build}
repo=$PWD
checks=(to_end mpirun_in_allocation usr1_requeue_resume bad_config_exit2 diverged_exit4 sigkill_bounded_requeue
        stopped_rank_drained_resumed preflight_drains preflight_excludes_without_drain bad_variable_exit2
        elastic_fewer_tasks spare_takes_a_killed_nodes_place sweep_sbatch doctor_sbatch ec2_to_end ec2_usr1_resume
        ec2_restarts_a_killed_run)
passed=0 failed=0 skipped=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
summary() { echo "slurm summary: $passed passed, $failed failed, $skipped skipped"; }
skip_all() {
  for c in "${checks[@]}"; do echo "SKIP $c: $1"; done
  skipped=${#checks[@]}
  summary
  exit 0
}

[ -x "$build/trident" ] || { echo "no $build/trident: build first"; failed=1; summary; exit 1; }
if [ "$(id -u)" = 0 ]; then sudo=()
elif sudo -n true 2>/dev/null; then sudo=(sudo -n)
else skip_all "needs root or passwordless sudo to run slurmd and munged"; fi

need=()
for c in slurmctld slurmd sbatch munged; do command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || need+=("$c"); done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing Slurm (missing: ${need[*]})"
  pkgs=(slurmctld slurmd slurm-client munge)
  apt() { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"; }
  { apt || { "${sudo[@]}" apt-get update -qq && apt; }; } >/dev/null 2>&1 ||
    skip_all "cannot install ${pkgs[*]} (apt-get)"
fi
PATH=$PATH:/usr/sbin

T=$(mktemp -d /tmp/trident-slurm.XXXXXX)
chmod 755 "$T"
mkdir -p "$T"/{etc,state,spool,log,run,out}
started_munge=0
stop_slurm() {
  [ -n "${SLURM_CONF:-}" ] && scancel --quiet $(squeue -h -o %i 2>/dev/null) 2>/dev/null
  for pid in "$T"/run/slurmd.*.pid "$T/run/slurmctld.pid"; do
    [ -s "$pid" ] && "${sudo[@]}" kill "$(cat "$pid")" 2>/dev/null
  done
  [ "$started_munge" = 1 ] && [ -s /run/munge/munged.pid ] && "${sudo[@]}" kill "$(cat /run/munge/munged.pid)" 2>/dev/null
  pkill -9 -f "$T" 2>/dev/null  # ranks of a job that outlived its daemons
  rm -f /dev/shm/trident-*-tn[123]-r*  # the memory tier's snapshots that the spares check left (tn2's)
  if [ "$failed" -gt 0 ]; then
    for f in "$T"/log/*.log; do echo "--- $f (tail)"; tail -15 "$f"; done
  fi
  rm -rf "$T"
}
trap stop_slurm EXIT

# munge: the package may already run it (systemd hosts); else start it by hand.
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  [ -s /etc/munge/munge.key ] || "${sudo[@]}" mungekey --create >/dev/null 2>&1
  "${sudo[@]}" chown munge:munge /etc/munge/munge.key && "${sudo[@]}" chmod 400 /etc/munge/munge.key
  "${sudo[@]}" mkdir -p /run/munge && "${sudo[@]}" chown munge:munge /run/munge
  "${sudo[@]}" runuser -u munge -- /usr/sbin/munged && started_munge=1
  munge -n 2>/dev/null | unmunge >/dev/null 2>&1 || skip_all "munged does not start"
fi

H=$(hostname -s)
# Ports of this run's own (two runs on one machine, or a Slurm already there, cannot meet).
free_port() {
  local p
  while true; do
    p=$((20000 + RANDOM % 20000))
    ss -Htln "sport >= :$p and sport <= :$((p + 4))" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
}
port=$(free_port)
cat > "$T/etc/slurm.conf" <<EOF
ClusterName=tridenttest
SlurmctldHost=$H(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
SlurmUser=root
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
EnforcePartLimits=ALL
ReturnToService=2
KillWait=5
MinJobAge=600
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool/%n
SlurmctldPidFile=$T/run/slurmctld.pid
SlurmdPidFile=$T/run/slurmd.%n.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.%n.log
NodeName=$H NodeAddr=127.0.0.1 CPUs=8 RealMemory=4000 State=UNKNOWN
NodeName=tn[1-3] NodeHostname=$H NodeAddr=127.0.0.1 Port=[$((port + 2))-$((port + 4))] CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
PartitionName=spares Nodes=tn[1-3] MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
mkdir -p "$T"/spool/{"$H",tn1,tn2,tn3}
export SLURM_CONF=$T/etc/slurm.conf
"${sudo[@]}" env SLURM_CONF="$SLURM_CONF" slurmctld -c || skip_all "slurmctld does not start"
"${sudo[@]}" env SLURM_CONF="$SLURM_CONF" slurmd -N "$H" || skip_all "slurmd does not start"
# Three more node names on this host, one slurmd each (the spares check); a Slurm that
# cannot run them skips that check alone.
spare_nodes=1
for n in tn1 tn2 tn3; do "${sudo[@]}" env SLURM_CONF="$SLURM_CONF" slurmd -N "$n" || spare_nodes=0; done
for _ in $(seq 300); do sinfo -h -p debug -o %t 2>/dev/null | grep -qx idle && break; sleep 0.1; done
sinfo -h -p debug -o %t | grep -qx idle || skip_all "the node does not come up: $(sinfo -h -p debug -o '%t %E' 2>&1)"
for _ in $(seq 100); do [ "$(sinfo -h -p spares -t idle -o %D 2>/dev/null)" = 3 ] && break; sleep 0.1; done
[ "$(sinfo -h -p spares -t idle -o %D 2>/dev/null)" = 3 ] || spare_nodes=0
echo "Slurm $(sinfo --version | awk '{print $2}') up on $H ($T)"

# The jobs' ranks share 2 cores; Open MPI refuses root unless told (the tests may run as root).
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# The preflight's all-reduce bar, low: these ranks share 2 cores with the tests running beside
# them (its own check below sets one no machine reaches).
export TRIDENT_PREFLIGHT_BUSBW=0.01
steps=120
train_flags=(--train.steps=$steps --log.every_steps=1 --log.val_every_steps=0 --log.sample_every_steps=0)

job_field() { scontrol -o show job "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"; }
wait_job() {  # id, seconds: waits until the job has ended (not a requeue); prints its state
  local id=$1 limit=$2 start=$SECONDS state
  while [ $((SECONDS - start)) -lt "$limit" ]; do
    state=$(job_field "$id" JobState)
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) echo "$state"; return 0 ;; esac
    sleep 0.5
  done
  echo "TIMEOUT_WAITING($(job_field "$id" JobState))"
}
wait_for_line() {  # file, extended regex, count, seconds: until the regex has matched count lines
  local start=$SECONDS n
  while [ $((SECONDS - start)) -lt "$4" ]; do
    n=$(grep -cE "$2" "$1" 2>/dev/null)
    [ "${n:-0}" -ge "$3" ] && return 0
    sleep 0.2
  done
  return 1
}
final_loss() { grep -E "^step +$steps/$steps \|" "$1" | tail -1 | sed 's/.*| loss \([0-9.]*\) |.*/\1/'; }
submit() {  # name, env assignments..., --, sbatch arguments: prints the job id
  local name=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" TRIDENT_CKPT_DIR="$T/ckpt_$name" \
    sbatch --parsable --job-name="$name" --output="$T/out/$name.out" "$@"
}
run_flags() { echo "--log.run_dir=$T/run_$1"; }

# 1. The line of docs/clusters.md (on one node, two tasks), to the end (srun --mpi=pmix).
id=$(submit to_end -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.ini "${train_flags[@]}" "$(run_flags a)")
state=$(wait_job "$id" 300)
reference_loss=$(final_loss "$T/out/to_end.out")
if [ "$state" = COMPLETED ] && [ "$(job_field "$id" ExitCode)" = 0:0 ] && [ -n "$reference_loss" ] &&
   grep -q '^done:' "$T/out/to_end.out"; then
  pass "to_end (srun --mpi=pmix, 2 ranks, final loss $reference_loss)"
else
  fail to_end "state $state, exit $(job_field "$id" ExitCode); output: $(tail -5 "$T/out/to_end.out" 2>&1)"
fi

# 2. mpirun inside the allocation: the same losses.
id=$(submit mpirun TRIDENT_LAUNCHER=mpirun -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.ini \
  "${train_flags[@]}" "$(run_flags b)")
state=$(wait_job "$id" 300)
loss=$(final_loss "$T/out/mpirun.out")
if [ "$state" = COMPLETED ] && [ -n "$loss" ] && [ "$loss" = "$reference_loss" ]; then
  pass "mpirun_in_allocation (final loss $loss)"
else
  fail mpirun_in_allocation "state $state, final loss '$loss' vs '$reference_loss'; output: $(tail -5 "$T/out/mpirun.out" 2>&1)"
fi

# 3. USR1 to the batch shell: checkpoint, requeue, resume, the same final loss.
id=$(submit usr1 -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.ini "${train_flags[@]}" "$(run_flags c)")
out=$T/out/usr1.out
if wait_for_line "$out" "^step +20/$steps " 1 120; then
  scancel --signal=USR1 --batch "$id"
  state=$(wait_job "$id" 300)
  loss=$(final_loss "$out")
  if [ "$state" = COMPLETED ] && [ "$(job_field "$id" Restarts)" = 1 ] && grep -q 'requeueing job' "$out" &&
     grep -q '^resumed from .*continuing after step' "$out" && [ "$loss" = "$reference_loss" ]; then
    pass "usr1_requeue_resume ($(grep -m1 -o 'continuing after step [0-9]*' "$out"), final loss $loss)"
  else
    fail usr1_requeue_resume "state $state, restarts $(job_field "$id" Restarts), final loss '$loss' vs '$reference_loss'; output: $(grep -E 'requeue|resumed|error|done' "$out")"
  fi
else
  fail usr1_requeue_resume "no step 20 line: $(tail -5 "$out" 2>&1)"
fi

# 4. A bad config: exit 2, one clear error, not requeued.
id=$(submit bad -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.ini --model.n_head=3 "$(run_flags d)")
state=$(wait_job "$id" 120)
if [ "$state" = FAILED ] && [ "$(job_field "$id" ExitCode)" = 2:0 ] && [ "$(job_field "$id" Restarts)" = 0 ] &&
   grep -q '^trident: error: .*n_head' "$T/out/bad.out"; then
  pass "bad_config_exit2 ($(grep -m1 '^trident: error:' "$T/out/bad.out"))"
else
  fail bad_config_exit2 "state $state, exit $(job_field "$id" ExitCode), restarts $(job_field "$id" Restarts); output: $(tail -5 "$T/out/bad.out" 2>&1)"
fi

# 4b. A run that diverges (a NaN in rank 0's gradients from step 2 on): exit 4, not requeued.
id=$(submit diverged TRIDENT_TEST_NAN_RANK=0 TRIDENT_TEST_NAN_STEPS=2-100000 -- --nodes=1 --ntasks-per-node=2 \
  slurm/train.sbatch configs/tiny.ini "${train_flags[@]}" --train.max_bad_steps=2 "$(run_flags g)")
state=$(wait_job "$id" 120)
if [ "$state" = FAILED ] && [ "$(job_field "$id" ExitCode)" = 4:0 ] && [ "$(job_field "$id" Restarts)" = 0 ] &&
   grep -q 'the run diverged (exit 4): not requeued' "$T/out/diverged.out"; then
  pass "diverged_exit4 ($(grep -m1 -o '^trident: diverged: [^;]*' "$T/out/diverged.out" | cut -c1-80))"
else
  fail diverged_exit4 "state $state, exit $(job_field "$id" ExitCode), restarts $(job_field "$id" Restarts); output: $(tail -5 "$T/out/diverged.out" 2>&1)"
fi

# 5. A rank killed with SIGKILL, twice, with one restart allowed: requeued once, then the job fails.
id=$(submit sigkill TRIDENT_MAX_RESTARTS=1 TRIDENT_CKPT_EVERY=10 -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch \
  configs/tiny.ini "${train_flags[@]}" "$(run_flags e)")
out=$T/out/sigkill.out
# The ranks' own command lines start with build/trident (srun's and mpirun's do not).
kill_a_rank() { pkill -9 -f -n "^build/trident train.*$T/ckpt_sigkill"; }
step_lines() { grep -cE "^step +[0-9]+/$steps " "$out" 2>/dev/null; }
ok=1
# run 1: killed after step 12 (checkpoint at 10); run 2: resumes, killed two steps later.
if wait_for_line "$out" "^step +12/$steps " 1 120; then kill_a_rank || ok=0; else ok=0; fi
if [ "$ok" = 1 ] && wait_for_line "$out" "^trident job $id run 2 " 1 120 && wait_for_line "$out" '^resumed from ' 1 120; then
  wait_for_line "$out" "^step +[0-9]+/$steps " $(($(step_lines) + 2)) 120 && kill_a_rank || ok=0
else ok=0; fi
state=$(wait_job "$id" 120)
if [ "$ok" = 1 ] && [ "$state" = FAILED ] && [ "$(job_field "$id" Restarts)" = 1 ] &&
   grep -q 'requeueing (1 of at most 1' "$out" && grep -q 'not requeued (TRIDENT_MAX_RESTARTS=1)' "$out"; then
  pass "sigkill_bounded_requeue (exit $(job_field "$id" ExitCode), requeued once, resumed $(grep -m1 -o 'after step [0-9]*' "$out"))"
else
  fail sigkill_bounded_requeue "kills ok=$ok, state $state, restarts $(job_field "$id" Restarts); output: $(grep -E 'trident job|resumed|error' "$out")"
fi

# 5b. A rank that stops (SIGSTOP, as a hung GPU or kernel would) after step 12: rank 0's
# collective (or a save's receive) times out, names it on this node, and the script drains the node; the requeued
# job waits for a node; resumed by hand (ParallelCluster would replace it), it goes on from
# its last checkpoint (step 10) to the uninterrupted losses.
node_field() { scontrol -o show node "$H" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$1=//p"; }
node_reason() { scontrol -o show node "$H" 2>/dev/null | sed -n 's/.* Reason=\(.*\) \[.*/\1/p'; }
wait_for_drain() {  # seconds: until the node is drained (or draining)
  local start=$SECONDS
  while [ $((SECONDS - start)) -lt "$1" ]; do
    case $(node_field State) in *DRAIN*) return 0 ;; esac
    sleep 0.2
  done
  return 1
}
resume_node() { scontrol update NodeName="$H" State=RESUME 2>/dev/null; }
id=$(submit heal TRIDENT_CKPT_EVERY=10 -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.ini \
  "${train_flags[@]}" --parallel.timeout_s=10 "$(run_flags h)")
out=$T/out/heal.out
ok=1 why=
if wait_for_line "$out" "^step +12/$steps " 1 120; then
  pkill -STOP -f -n "^build/trident train.*$T/ckpt_heal" || { ok=0; why="no rank to stop"; }
else ok=0; why="no step 12"; fi
if [ "$ok" = 1 ] && wait_for_drain 90; then
  reason=$(node_reason)
  wait_for_line "$out" "requeueing" 1 30
  # The rank stopped is the newest one started; the stop lands in step 12 or after (on a
  # busy machine as late as step 20's save, where rank 0 waits in a receive from it).
  [[ $reason =~ ^trident:\ rank\ [01]\ stopped\ \(last\ seen\ in\ step\ (1[2-9]|2[0-9])\):\ (all_reduce|recv|send) ]] ||
    { ok=0; why="reason '$reason'"; }
  # The requeued job waits for a node (the script's requeue comes after the drain).
  for _ in $(seq 100); do [ "$(job_field "$id" JobState)" = PENDING ] && break; sleep 0.2; done
  [ "$(job_field "$id" JobState)" = PENDING ] || { ok=0; why="$why; job $(job_field "$id" JobState) with the node drained"; }
  resume_node
else
  ok=0; why="$why; node not drained: $(node_field State) $(node_reason)"
  resume_node
fi
state=$(wait_job "$id" 300)
loss=$(final_loss "$out")
if [ "$ok" = 1 ] && [ "$state" = COMPLETED ] && [ "$(job_field "$id" Restarts)" = 1 ] &&
   grep -q "drained $H" "$out" && grep -qE 'continuing after step [12]0' "$out" && [ "$loss" = "$reference_loss" ]; then
  pass "stopped_rank_drained_resumed (Reason=\"$reason\", resumed $(grep -m1 -oE 'after step [0-9]+' "$out"), final loss $loss)"
else
  fail stopped_rank_drained_resumed "$why; state $state, restarts $(job_field "$id" Restarts), final loss '$loss' vs '$reference_loss'; output: $(grep -E 'trident|drain|resumed|requeue' "$out" | tail -24)"
fi

# 5c. A preflight the node fails (a bandwidth it cannot reach): drained before any step,
# the job requeued and waiting; then with TRIDENT_DRAIN=0 the node is excluded instead.
preflight_case() {  # name, TRIDENT_DRAIN: waits for the requeue; leaves the job id in $id
  id=$(submit "$1" TRIDENT_PREFLIGHT_BUSBW=1000000 TRIDENT_DRAIN="$2" -- --nodes=1 --ntasks-per-node=2 \
    slurm/train.sbatch configs/tiny.ini "${train_flags[@]}" "$(run_flags "$1")")
  wait_for_line "$T/out/$1.out" "requeueing" 1 120
}
preflight_case preflight_drain 1
out=$T/out/preflight_drain.out
drained=0; wait_for_drain 30 && drained=1
reason=$(node_reason)
pending=$(job_field "$id" JobState)
scancel "$id"; wait_job "$id" 60 >/dev/null
resume_node
if [ "$drained" = 1 ] && [[ $reason == "trident: preflight failed: all-reduce node $H"* ]] &&
   ! grep -qE "^step +[0-9]+/" "$out" && grep -q "drained $H" "$out"; then
  pass "preflight_drains (Reason=\"$reason\", no step run, job then $pending)"
else
  fail preflight_drains "drained $drained, reason '$reason'; output: $(grep -E 'trident|doctor|drain|requeue|FAIL' "$out" | tail -10)"
fi
preflight_case preflight_exclude 0
out=$T/out/preflight_exclude.out
# The script prints "requeueing" before it requeues and then excludes: wait for its verdict.
wait_for_line "$out" "excluded $H from this job|could not exclude" 1 60
excluded=$(job_field "$id" ExcNodeList)
state_now=$(node_field State)
scancel "$id"; wait_job "$id" 60 >/dev/null
if [ "$excluded" = "$H" ] && [[ $state_now != *DRAIN* ]] && grep -q "excluded $H from this job" "$out"; then
  pass "preflight_excludes_without_drain (ExcNodeList=$excluded, node $state_now)"
else
  fail preflight_excludes_without_drain "ExcNodeList '$excluded', node $state_now; output: $(grep -E 'trident|drain|exclu|requeue' "$out" | tail -10)"
  resume_node
fi

# 5d. A TRIDENT_* variable with an impossible value: one error, exit 2, not requeued.
id=$(submit badvar TRIDENT_DRAIN=maybe -- --nodes=1 --ntasks-per-node=2 slurm/train.sbatch configs/tiny.ini)
state=$(wait_job "$id" 60)
if [ "$state" = FAILED ] && [ "$(job_field "$id" ExitCode)" = 2:0 ] && [ "$(job_field "$id" Restarts)" = 0 ] &&
   [ "$(grep -c '^trident: error: TRIDENT_DRAIN=maybe' "$T/out/badvar.out")" = 1 ]; then
  pass "bad_variable_exit2 ($(grep -m1 '^trident: error:' "$T/out/badvar.out"))"
else
  fail bad_variable_exit2 "state $state, exit $(job_field "$id" ExitCode); output: $(tail -3 "$T/out/badvar.out")"
fi

# 5e. Elastic: 4 tasks, stopped by USR1 after step 20 and requeued; Slurm then gives the
# job 2 tasks (the pending job's size changed, as a --nodes=MIN-MAX job gets fewer nodes):
# the checkpoint is resharded from dp 4 to dp 2, the global batch kept, the losses those
# of the uninterrupted 2-rank run.
id=$(submit elastic TRIDENT_PREFLIGHT=0 -- --ntasks=4 slurm/train.sbatch configs/tiny.ini "${train_flags[@]}" \
  "$(run_flags i)")
out=$T/out/elastic.out
ok=1
if wait_for_line "$out" "^step +20/$steps " 1 120; then
  scancel --signal=USR1 --batch "$id"
  wait_for_line "$out" "requeueing job" 1 120 || ok=0
  for _ in $(seq 100); do [ "$(job_field "$id" JobState)" = PENDING ] && break; sleep 0.1; done
  # Held while its size changes (a requeued job waits a few seconds before it may start).
  scontrol hold "$id" && scontrol update JobId="$id" NumTasks=2 || ok=0
  scontrol release "$id"
else ok=0; fi
state=$(wait_job "$id" 300)
loss=$(final_loss "$out")
# Stopped at a step from 20 on: USR1 lands within a step or a few of it, as the load of the
# machine (the unit tests run beside) lets slurmd deliver it.
resumed_at=$(grep -m1 -oE 'continuing after step [0-9]+' "$out" | grep -oE '[0-9]+$')
if [ "$ok" = 1 ] && [ "$state" = COMPLETED ] && grep -qE "^trident job $id run 2 .*, 2 tasks," "$out" &&
   grep -q '^grid: dp=4 ' "$out" && grep -q '^grid: dp=2 ' "$out" && [ "${resumed_at:-0}" -ge 20 ] &&
   [ "${resumed_at:-0}" -lt "$steps" ] && [ "$loss" = "$reference_loss" ]; then
  pass "elastic_fewer_tasks (4 tasks, then 2: $(grep -m1 -o 'continuing after step [0-9]*' "$out"), final loss $loss)"
else
  fail elastic_fewer_tasks "ok=$ok, state $state, tasks $(job_field "$id" NumTasks), final loss '$loss' vs '$reference_loss'; output: $(grep -E '^grid|trident job|resumed|^trident: error' "$out")"
fi

# 6. A sweep in one allocation of 2 tasks: two points run, a 4-rank point is recorded as failed.
printf 'config = configs/tiny.ini\nlayout = 1x1x1 2x1x1 4x1x1\nglobal_batch = 8\nsteps = 3\nflags = --log.val_batches=0\n' \
  > "$T/grid"
id=$(TRIDENT_SWEEP_DIR="$T/sweep" sbatch --parsable --job-name=sweep --output="$T/out/sweep.out" --ntasks=2 \
  slurm/sweep.sbatch "$T/grid")
state=$(wait_job "$id" 300)
csv=$T/sweep/results.csv
if [ "$state" = COMPLETED ] && [ "$(grep -c ',ok,' "$csv" 2>/dev/null)" = 2 ] &&
   grep -q 'needs 4 ranks, the allocation has 2' "$csv"; then
  pass "sweep_sbatch (3 rows: 2 ok, 1 failed as it should)"
else
  fail sweep_sbatch "state $state; csv: $(cat "$csv" 2>&1); output: $(tail -5 "$T/out/sweep.out" 2>&1)"
fi

# 7. The preflight on this node. The bandwidth floor is the one the training jobs above use
# (TRIDENT_PREFLIGHT_BUSBW): the test checks the sbatch wiring, and on a loaded 2-core CI box the
# CPU default (0.3 GB/s) is not always met.
id=$(sbatch --parsable --job-name=doctor --output="$T/out/doctor.out" --ntasks=2 slurm/doctor.sbatch configs/tiny.ini \
  "$T/ckpt_doctor" --expect_busbw "$TRIDENT_PREFLIGHT_BUSBW")
state=$(wait_job "$id" 120)
if [ "$state" = COMPLETED ] && grep -q '^doctor: all checks passed' "$T/out/doctor.out" &&
   grep -q '| ranks | ok | 2 ranks on 1 host' "$T/out/doctor.out"; then
  pass "doctor_sbatch ($(grep '^doctor:' "$T/out/doctor.out"))"
else
  fail doctor_sbatch "state $state; output: $(tail -12 "$T/out/doctor.out" 2>&1)"
fi

# 7c. Spares: three node names on this host (tn1-tn3), one task each, TRIDENT_SPARE_NODES=1:
# training on tn1 and tn2, tn3 waiting; the memory tier every 5 steps, no disk checkpoint
# before the end. The rank on tn2 is killed (kill -9) after step 37: the script drains tn2,
# puts tn3 in its place and starts the next job step at once (no requeue); it resumes
# from node memory, rank 1's piece from tn1's copy (tn2's memory is not tn3's), loses at
# most 5 steps and ends at the uninterrupted run's loss. The launcher is mpirun over TCP:
# srun's PMIx plugin and Open MPI's shared-memory transport take two node names on one
# host for one node (their folders and segments collide), which separate hosts are not.
if [ "$spare_nodes" = 1 ]; then
  id=$(submit spare TRIDENT_SPARE_NODES=1 TRIDENT_LAUNCHER=mpirun TRIDENT_PREFLIGHT=0 OMPI_MCA_btl=self,tcp -- \
    --partition=spares --nodes=3 --ntasks-per-node=1 slurm/train.sbatch configs/tiny.ini "${train_flags[@]}" \
    --checkpoint.memory_every_steps=5 "$(run_flags s)")
  out=$T/out/spare.out
  ok=1
  if wait_for_line "$out" "^step +37/$steps " 1 120; then
    victim=
    for pid in $(pgrep -f "^build/trident train.*$T/ckpt_spare"); do
      tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'SLURMD_NODENAME=tn2' && victim=$pid
    done
    killed_at=$(date +%s.%N)
    [ -n "$victim" ] && kill -9 "$victim" || ok=0
  else ok=0; fi
  # From the kill to the restarted step's first step line.
  restart_s= from=
  if [ "$ok" = 1 ] && wait_for_line "$out" '^resumed from node memory' 1 120; then
    from=$(sed -n 's/^resumed from node memory: continuing after step \([0-9]*\).*/\1/p' "$out" | head -1)
    wait_for_line "$out" "^step +$((from + 1))/$steps " 2 60 &&
      restart_s=$(echo "$(date +%s.%N) $killed_at" | awk '{printf "%.1f", $1 - $2}')
  fi
  state=$(wait_job "$id" 300)
  loss=$(final_loss "$out")
  # Every step after the resume at the uninterrupted run's loss (the reference: check 1).
  same_losses=0
  losses_of() { grep -E "^step +[0-9]+/$steps " "$1" | awk -F'|' '{ print $1 $2 }' | tail -n "$2"; }
  [ -n "$from" ] && [ "$(losses_of "$out" $((steps - from)))" = "$(losses_of "$T/out/to_end.out" $((steps - from)))" ] &&
    same_losses=1
  # Goodput: the parts of the last line add up to its total within 1% (the restart and
  # the steps trained again among them).
  goodput=$(grep -E '^goodput [0-9.]+% of [0-9.]+ s: ' "$out" | tail -1)
  goodput_adds_up=$(echo "$goodput" | awk -F'[:,] ' '{split($1, w, " "); total = w[4]; sum = 0
    for (i = 2; i <= NF; i++) { n = split($i, p, " "); sum += p[n - 1] }
    print (total > 0 && sum >= 0.99 * total && sum <= 1.01 * total && $0 ~ /restart/) ? 1 : 0}')
  again=$(sed -n 's/^restart after step [0-9]*: [0-9.]* s from its last step to this run.s first, \([0-9]*\) step.*/\1/p' "$out")
  if [ "$ok" = 1 ] && [ "$state" = COMPLETED ] && [ "$(job_field "$id" Restarts)" = 0 ] && [ -n "$restart_s" ] &&
     grep -q 'spare tn3 takes the place of tn2' "$out" &&
     grep -qE "^resumed from node memory: continuing after step $from \(rank 0 from their own node's memory in [0-9.]+ s; rank 1 from node tn1's copy \(partner\)" "$out" &&
     [ -n "$again" ] && [ "$again" -le 5 ] && [ "$goodput_adds_up" = 1 ] && [ "$same_losses" = 1 ]; then
    pass "spare_takes_a_killed_nodes_place (killed after step 37, resumed after step $from from node memory, $again step(s) trained again, $restart_s s from the kill to the next step, steps $((from + 1))-$steps at the uninterrupted losses, final $loss)"
    grep -E '^(trident job|spares|resumed|restart after|done:|goodput)' "$out" | sed 's/^/  /'
  else
    fail spare_takes_a_killed_nodes_place "kill ok=$ok, state $state, restarts $(job_field "$id" Restarts), from '$from', again '$again', restart '$restart_s' s, goodput adds up '$goodput_adds_up' ($goodput), losses after the resume the same: $same_losses, final loss '$loss' vs '$reference_loss'; output: $(grep -E 'trident job|spare|resumed|restart|error|warning' "$out")"
  fi
else
  skipped=$((skipped + 1))
  echo "SKIP spare_takes_a_killed_nodes_place: this Slurm does not run a slurmd for each of several node names on one host"
fi

# 8-9. slurm/mpirun_ec2.sh over a hostfile naming this machine (no Slurm involved).
echo "$H slots=2" > "$T/hosts.txt"
ec2() {  # name, extra flags: runs the script in the background, output in $T/out/NAME.out
  local name=$1; shift
  TRIDENT_CKPT_DIR= bash slurm/mpirun_ec2.sh "$T/hosts.txt" 2 configs/tiny.ini "${train_flags[@]}" \
    --checkpoint.dir="$T/ckpt_$name" "--log.run_dir=$T/run_$name" "$@" > "$T/out/$name.out" 2>&1 &
  ec2_pid=$!
}
finish_ec2() {  # seconds: waits for the launcher, killing it (and its ranks) past the bound
  if ! timeout "$1" tail --pid=$ec2_pid -f /dev/null; then
    kill $ec2_pid 2>/dev/null
    pkill -9 -f "$T/ckpt_ec2" 2>/dev/null
  fi
  wait $ec2_pid
}
ec2 ec2_a
finish_ec2 300; rc=$?
loss=$(final_loss "$T/out/ec2_a.out")
if [ "$rc" = 0 ] && [ "$loss" = "$reference_loss" ]; then pass "ec2_to_end (final loss $loss)"
else fail ec2_to_end "exit $rc, final loss '$loss' vs '$reference_loss': $(tail -5 "$T/out/ec2_a.out")"; fi

ec2 ec2_b
if wait_for_line "$T/out/ec2_b.out" "^step +20/$steps " 1 120; then
  kill -USR1 $ec2_pid
  finish_ec2 120; rc1=$?
  ec2 ec2_b
  finish_ec2 300; rc2=$?
  loss=$(final_loss "$T/out/ec2_b.out")
  if [ "$rc1" = 0 ] && [ "$rc2" = 0 ] && grep -q '^resumed from' "$T/out/ec2_b.out" && [ "$loss" = "$reference_loss" ]; then
    pass "ec2_usr1_resume ($(grep -m1 -o 'continuing after step [0-9]*' "$T/out/ec2_b.out"), final loss $loss)"
  else
    fail ec2_usr1_resume "exits $rc1 $rc2, final loss '$loss' vs '$reference_loss': $(tail -5 "$T/out/ec2_b.out")"
  fi
else
  kill $ec2_pid 2>/dev/null
  fail ec2_usr1_resume "no step 20 line: $(tail -5 "$T/out/ec2_b.out")"
fi

# 10. mpirun_ec2.sh's restart: a rank killed after step 37 (memory tier every 5 steps); the
# script starts the run again at once on its host, which resumes from node memory and ends
# at the uninterrupted loss.
ec2 ec2_c --checkpoint.memory_every_steps=5
if wait_for_line "$T/out/ec2_c.out" "^step +37/$steps " 1 120; then
  victim=$(pgrep -f "^[^ ]*build/trident train.*$T/ckpt_ec2_c" | tail -1)  # a rank, not mpirun
  [ -n "$victim" ] && kill -9 "$victim"
  finish_ec2 300; rc=$?
  loss=$(final_loss "$T/out/ec2_c.out")
  if [ "$rc" = 0 ] && grep -q '^trident: restarting at ' "$T/out/ec2_c.out" &&
     grep -q '^resumed from node memory: continuing after step' "$T/out/ec2_c.out" && [ "$loss" = "$reference_loss" ]; then
    pass "ec2_restarts_a_killed_run ($(grep -m1 -o 'continuing after step [0-9]*' "$T/out/ec2_c.out") from node memory, final loss $loss)"
  else
    fail ec2_restarts_a_killed_run "exit $rc, final loss '$loss' vs '$reference_loss': $(grep -E '^trident|resumed|error' "$T/out/ec2_c.out" | tail -5)"
  fi
else
  kill $ec2_pid 2>/dev/null
  fail ec2_restarts_a_killed_run "no step 37 line: $(tail -5 "$T/out/ec2_c.out")"
fi

summary
[ "$failed" -eq 0 ]
