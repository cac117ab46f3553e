#!/usr/bin/env bash
# One-stage GRPO on several devices: msrun with our users' flags around scripts/grpo_one_stage.py.
#
#   scripts/run_grpo.sh --worker_num 8 --local_worker_num 8 --master_addr 127.0.0.1 --master_port 8118 \
#       --join True --log_dir outputs/msrun_log [--timeout SECONDS] -- --config CONFIG.yaml [key=value ...]
#
# Several nodes: one launcher per node, the same command on each but --node_rank (0 on the host that has
# --master_addr, where msrun starts its scheduler; 1, 2, ... elsewhere), e.g. two nodes of 8 devices:
#
#   scripts/run_grpo.sh --worker_num 16 --local_worker_num 8 --node_rank 0 --master_addr 10.0.0.1 \
#       --log_dir /shared/run1/msrun_log -- --config CONFIG.yaml --output_dir /shared/run1
#
# --log_dir and --output_dir must then be on a file system every node sees: each node logs under
# LOG_DIR/node_<n>/ (worker_<rank>.log, scheduler.log) and the launchers watch each other there.
# --cluster_time_out (msrun's, seconds) bounds the wait for every node to join; --node_timeout (default
# 30 s) the silence of another node's launcher before its node counts as lost.
#
# Everything after `--` goes to grpo_one_stage.py (which gets --use_parallel True). The training
# and inference layouts come from the config (actor_config.parallel_config,
# generate_config.parallel_config); their products must equal --worker_num.
#
# Failures: msrun already kills every worker of its node when one exits non-zero; this script then prints
# the first failing rank's error (from its log) and exits with msrun's code. With several nodes it also
# writes that report to LOG_DIR/node_<n>.failed: every other node's launcher stops its workers, prints it
# and exits 1; a node whose launcher goes silent (killed, host down) is reported by every other node as
# lost, naming its ranks, and they stop too. A rank with no progress for rl_config.collective_timeout_s (a
# collective waiting on another rank) exits on its own, naming the phase. --timeout (or MINDGRPO_TIMEOUT)
# bounds the whole job: past it the job is interrupted and the script exits 124.
#
# Stopping: SIGINT (Ctrl-C) or SIGTERM to this script stops its node's job: msrun, its scheduler and
# every worker (msrun starts each worker in its own session, which msrun's own group signal misses)
# with their reward workers get SIGTERM, then SIGKILL after MINDGRPO_STOP_GRACE seconds (default 10);
# the script exits 130 or 143 (and, with several nodes, the other nodes stop as above).
set -u -o pipefail

worker_num=8
local_worker_num=""
master_addr=127.0.0.1
master_port=8118
join=True
log_dir=msrun_log
timeout_s=${MINDGRPO_TIMEOUT:-0}
node_rank=""
cluster_time_out=""
node_timeout=30

grace_s=${MINDGRPO_STOP_GRACE:-10}

usage() { sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -h|--help) usage 0 ;;
    --*=*) key="${1%%=*}"; value="${1#*=}"; shift ;;
    --*) key="$1"; [ $# -ge 2 ] || { echo "run_grpo.sh: $1 needs a value" >&2; exit 2; }; value="$2"; shift 2 ;;
    *) echo "run_grpo.sh: unexpected argument '$1' (grpo_one_stage.py arguments go after --)" >&2; exit 2 ;;
  esac
  case "$key" in
    --worker_num) worker_num="$value" ;;
    --local_worker_num) local_worker_num="$value" ;;
    --master_addr) master_addr="$value" ;;
    --master_port) master_port="$value" ;;
    --join) join="$value" ;;
    --log_dir) log_dir="$value" ;;
    --timeout) timeout_s="$value" ;;
    --node_rank) node_rank="$value" ;;
    --cluster_time_out) cluster_time_out="$value" ;;
    --node_timeout) node_timeout="$value" ;;
    *) echo "run_grpo.sh: unknown flag $key (see --help)" >&2; exit 2 ;;
  esac
done
local_worker_num=${local_worker_num:-$worker_num}
for flag in worker_num local_worker_num master_port timeout_s node_timeout; do
  [[ "${!flag}" =~ ^[0-9]+$ ]] || { echo "run_grpo.sh: --${flag%_s} must be a whole number, got '${!flag}'" >&2; exit 2; }
done
nodes=$((worker_num / local_worker_num))
if [ "$local_worker_num" -eq 0 ] || [ $((nodes * local_worker_num)) -ne "$worker_num" ]; then
  echo "run_grpo.sh: --worker_num $worker_num is not a multiple of --local_worker_num $local_worker_num" >&2; exit 2
fi
if [ "$nodes" -gt 1 ] && [ -z "$node_rank" ]; then
  echo "run_grpo.sh: $nodes nodes (--worker_num $worker_num, --local_worker_num $local_worker_num) need --node_rank" >&2
  exit 2
fi
node_rank=${node_rank:-0}
if ! [[ "$node_rank" =~ ^[0-9]+$ ]] || [ "$node_rank" -ge "$nodes" ]; then
  echo "run_grpo.sh: --node_rank must be 0 to $((nodes - 1)), got '$node_rank'" >&2; exit 2
fi
first_rank=$((node_rank * local_worker_num))
last_rank=$((first_rank + local_worker_num - 1))
# one node: the logs straight under LOG_DIR; several: each node its own folder, the launchers' files beside
node_log="$log_dir"
[ "$nodes" -gt 1 ] && node_log="$log_dir/node_$node_rank"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
msrun_bin="$(command -v msrun || true)"
if [ -z "$msrun_bin" ] && [ -x "$here/../.venv/bin/msrun" ]; then
  # the README's set-up, not activated: msrun starts the workers with the `python` on PATH
  export PATH="$(cd "$here/../.venv/bin" && pwd):$PATH"
  msrun_bin="$(command -v msrun)"
fi
[ -n "$msrun_bin" ] || { echo "run_grpo.sh: msrun not found (activate the environment with MindSpore)" >&2; exit 2; }

cmd=("$msrun_bin" "--worker_num=$worker_num" "--local_worker_num=$local_worker_num" "--master_addr=$master_addr"
     "--master_port=$master_port" "--join=$join" "--log_dir=$node_log")
[ "$nodes" -gt 1 ] && cmd+=("--node_rank=$node_rank")
[ -n "$cluster_time_out" ] && cmd+=("--cluster_time_out=$cluster_time_out")
cmd+=("$here/grpo_one_stage.py" --use_parallel True "$@")
echo "run_grpo.sh: ${cmd[*]}"
[ "$timeout_s" != 0 ] && cmd=(timeout -s INT -k 60 "$timeout_s" "${cmd[@]}")

descendants() {  # every process below pid $1
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

stop_job() {  # $1: why, $2: this script's exit code
  trap '' INT TERM
  echo "run_grpo.sh: $1: stopping the job (msrun, its workers and theirs)" >&2
  # the job's process groups: its own session's, and each worker's (msrun runs them with setsid)
  local groups pid pgid left waited=0
  groups="$job"
  for pid in $(descendants "$job"); do
    pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')
    [ -n "$pgid" ] && groups="$groups $pgid"
  done
  groups=$(echo "$groups" | tr ' ' '\n' | sort -u)
  for pgid in $groups; do kill -TERM -- "-$pgid" 2>/dev/null; done
  while :; do
    left=""
    for pgid in $groups; do kill -0 -- "-$pgid" 2>/dev/null && left="$left $pgid"; done
    [ -z "$left" ] && break
    if [ "$waited" -ge "$((grace_s * 10))" ]; then
      echo "run_grpo.sh: still running after ${grace_s}s, killing process groups$left" >&2
      for pgid in $left; do kill -KILL -- "-$pgid" 2>/dev/null; done
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$job" 2>/dev/null
  rm -f "$log_dir/node_$node_rank.alive"
}

on_signal() {  # $1: the signal, $2: the exit code
  stop_job "$1" "$2"
  publish failed "node $node_rank (ranks $first_rank-$last_rank) was stopped by $1"
  exit "$2"
}

# ------------------------------------------------------------------ several nodes: the launchers watch each other
# Under LOG_DIR (shared by the nodes): node_<n>.alive (rewritten every second while node n's job runs),
# node_<n>.failed (node n's failure report), node_<n>.done (node n's job ended well). Files of an earlier
# run are told apart by their signature at start-up (a node removes its own when it starts).

publish() {  # $1: failed | done, $2: the contents; written whole (temp + rename)
  [ "$nodes" -gt 1 ] || return 0
  printf '%s\n' "$2" > "$log_dir/node_$node_rank.$1.tmp" && mv -f "$log_dir/node_$node_rank.$1.tmp" "$log_dir/node_$node_rank.$1"
  rm -f "$log_dir/node_$node_rank.alive"
}

signature() { stat -c '%i %Y %s' "$1" 2>/dev/null; }
ranks_of() { echo "$(($1 * local_worker_num))-$(($1 * local_worker_num + local_worker_num - 1))"; }

declare -A stale_failed stale_done beat_seen beat_at
peer_failed() {  # the first other node with a failure report of this run, if any
  local n
  for ((n = 0; n < nodes; n++)); do
    [ "$n" -eq "$node_rank" ] && continue
    [ -e "$log_dir/node_$n.failed" ] && [ "$(signature "$log_dir/node_$n.failed")" != "${stale_failed[$n]}" ] \
      && { echo "$n"; return; }
  done
}

watch_nodes() {  # while the job runs: beat, and stop the job when another node failed or went silent
  local n beat=0 seen failed
  for ((n = 0; n < nodes; n++)); do
    stale_failed[$n]=$(signature "$log_dir/node_$n.failed")
    stale_done[$n]=$(signature "$log_dir/node_$n.done")
    beat_seen[$n]=$(cat "$log_dir/node_$n.alive" 2>/dev/null)
    beat_at[$n]=-1  # not heard from yet in this run (msrun's --cluster_time_out bounds the wait for it)
  done
  while kill -0 "$job" 2>/dev/null; do
    beat=$((beat + 1))
    echo "$(hostname) $$ $beat" > "$log_dir/node_$node_rank.alive.tmp" \
      && mv -f "$log_dir/node_$node_rank.alive.tmp" "$log_dir/node_$node_rank.alive"
    failed=$(peer_failed)
    if [ -n "$failed" ]; then
      stop_job "node $failed failed" 1
      echo "run_grpo.sh: node $failed (ranks $(ranks_of "$failed")) failed:" >&2
      cat "$log_dir/node_$failed.failed" >&2
      publish failed "node $node_rank (ranks $first_rank-$last_rank) stopped: node $failed failed first"
      exit 1
    fi
    for ((n = 0; n < nodes; n++)); do
      [ "$n" -eq "$node_rank" ] && continue
      [ -e "$log_dir/node_$n.done" ] && [ "$(signature "$log_dir/node_$n.done")" != "${stale_done[$n]}" ] && continue
      seen=$(cat "$log_dir/node_$n.alive" 2>/dev/null)
      if [ -n "$seen" ] && [ "$seen" != "${beat_seen[$n]}" ]; then
        beat_seen[$n]=$seen
        beat_at[$n]=$SECONDS
      elif [ "${beat_at[$n]}" -ge 0 ] && [ $((SECONDS - beat_at[$n])) -gt "$node_timeout" ]; then
        stop_job "node $n lost" 1
        echo "run_grpo.sh: node $n (ranks $(ranks_of "$n")) lost: its launcher has not reported in" \
             "$log_dir for $((SECONDS - beat_at[$n])) s (killed, host down, or the folder is not shared)" >&2
        publish failed "node $node_rank (ranks $first_rank-$last_rank) stopped: node $n (ranks $(ranks_of "$n")) was lost"
        exit 1
      fi
    done
    sleep 1
  done
}

failure_report() {  # what this node's logs say about its failure ($1: msrun's exit code)
  local log rank sched="$node_log/scheduler.log"
  [ "$1" -eq 124 ] && echo "run_grpo.sh: the job did not finish within ${timeout_s}s and was stopped"
  if [ -f "$sched" ] && grep -q "InitTCPServer\] Failed to init the tcp server" "$sched"; then
    echo "run_grpo.sh: node $node_rank: msrun's scheduler could not listen on $master_addr:$master_port" \
         "($(grep -o -m1 "Failed to call bind.*" "$sched" | sed 's/^Failed to call bind, url: [^ ]* //')):" \
         "the port is taken, or a second launcher sees --master_addr as its own host (only node 0's may)"
  fi
  # the first rank whose log holds an error: its last lines, without MindSpore's C++ log noise
  for log in $(ls "$node_log"/worker_*.log 2>/dev/null | sort -V); do
    if grep -q -E "^Traceback|grpo_one_stage: error:|^watchdog: |Error:" "$log"; then
      rank="${log##*worker_}"; rank="${rank%.log}"
      echo "run_grpo.sh: rank $rank failed (log $log):"
      grep -v -E "^\[(WARNING|INFO|DEBUG)\]" "$log" | grep -E -A 30 "^Traceback|grpo_one_stage: error:|^watchdog: " \
        | tail -n 30
      break
    fi
  done
  echo "run_grpo.sh: node $node_rank (ranks $first_rank-$last_rank): exit code $1"
}

if [ "$nodes" -gt 1 ]; then
  mkdir -p "$log_dir" || exit 2
  rm -f "$log_dir/node_$node_rank".{alive,failed,done}
fi
# msrun in a session of its own: a terminal's Ctrl-C reaches this script, which stops the job whole
setsid "${cmd[@]}" &
job=$!
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM
[ "$nodes" -gt 1 ] && watch_nodes
wait "$job"
code=$?

if [ "$code" -ne 0 ]; then
  report=$(failure_report "$code")
  failed=""
  [ "$nodes" -gt 1 ] && failed=$(peer_failed)
  if [ -n "$failed" ]; then  # another node failed first: its report is the cause
    echo "run_grpo.sh: node $failed (ranks $(ranks_of "$failed")) failed:" >&2
    cat "$log_dir/node_$failed.failed" >&2
  fi
  for ((n = 0; n < nodes; n++)); do  # a node gone silent (its launchers beat every second) before this one failed
    [ "$n" -eq "$node_rank" ] || [ "${beat_at[$n]:--1}" -lt 0 ] || [ $((SECONDS - beat_at[$n])) -le 5 ] \
      || [ "$(signature "$log_dir/node_$n.done")" != "${stale_done[$n]}" ] \
      || echo "run_grpo.sh: node $n (ranks $(ranks_of "$n")) lost: its launcher has not reported in $log_dir" \
              "for $((SECONDS - beat_at[$n])) s" >&2
  done
  echo "$report" >&2
  publish failed "$report"
else
  publish done "node $node_rank (ranks $first_rank-$last_rank) finished"
fi
exit "$code"
