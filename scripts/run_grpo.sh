#!/usr/bin/env bash
# One-stage GRPO on several devices: msrun with our users' flags around scripts/grpo_one_stage.py.
#
#   scripts/run_grpo.sh --worker_num 8 --local_worker_num 8 --master_addr 127.0.0.1 --master_port 8118 \
#       --join True --log_dir outputs/msrun_log [--timeout SECONDS] -- --config CONFIG.yaml [key=value ...]
#
# Everything after `--` goes to grpo_one_stage.py (which gets --use_parallel True). The training
# and inference layouts come from the config (actor_config.parallel_config,
# generate_config.parallel_config); their products must equal --worker_num.
#
# Failures: msrun already kills every worker when one exits non-zero; this script then prints
# the first failing rank's error (from its log) and exits with msrun's code. A rank with no progress
# for rl_config.collective_timeout_s (a collective waiting on another rank) exits on its own, naming
# the phase. --timeout (or MINDGRPO_TIMEOUT) bounds the whole job: past it the job is interrupted
# (msrun's SIGINT handler kills its workers) and the script exits 124.
#
# Stopping: SIGINT (Ctrl-C) or SIGTERM to this script stops the whole job: msrun, its scheduler and
# every worker (msrun starts each worker in its own session, which msrun's own group signal misses)
# with their reward workers get SIGTERM, then SIGKILL after MINDGRPO_STOP_GRACE seconds (default 10);
# the script exits 130 or 143.
set -u -o pipefail

worker_num=8
local_worker_num=""
master_addr=127.0.0.1
master_port=8118
join=True
log_dir=msrun_log
timeout_s=${MINDGRPO_TIMEOUT:-0}

grace_s=${MINDGRPO_STOP_GRACE:-10}

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }

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
    *) echo "run_grpo.sh: unknown flag $key (see --help)" >&2; exit 2 ;;
  esac
done
local_worker_num=${local_worker_num:-$worker_num}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
msrun_bin="$(command -v msrun || true)"
if [ -z "$msrun_bin" ] && [ -x "$here/../.venv/bin/msrun" ]; then
  # the README's set-up, not activated: msrun starts the workers with the `python` on PATH
  export PATH="$(cd "$here/../.venv/bin" && pwd):$PATH"
  msrun_bin="$(command -v msrun)"
fi
[ -n "$msrun_bin" ] || { echo "run_grpo.sh: msrun not found (activate the environment with MindSpore)" >&2; exit 2; }

cmd=("$msrun_bin" "--worker_num=$worker_num" "--local_worker_num=$local_worker_num" "--master_addr=$master_addr"
     "--master_port=$master_port" "--join=$join" "--log_dir=$log_dir"
     "$here/grpo_one_stage.py" --use_parallel True "$@")
echo "run_grpo.sh: ${cmd[*]}"
[ "$timeout_s" != 0 ] && cmd=(timeout -s INT -k 60 "$timeout_s" "${cmd[@]}")

descendants() {  # every process below pid $1
  local child
  for child in $(pgrep -P "$1"); do
    echo "$child"
    descendants "$child"
  done
}

stop_job() {  # $1: the signal received, $2: this script's exit code
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
  exit "$2"
}

# msrun in a session of its own: a terminal's Ctrl-C reaches this script, which stops the job whole
setsid "${cmd[@]}" &
job=$!
trap 'stop_job SIGINT 130' INT
trap 'stop_job SIGTERM 143' TERM
wait "$job"
code=$?

if [ "$code" -ne 0 ]; then
  [ "$code" -eq 124 ] && echo "run_grpo.sh: the job did not finish within ${timeout_s}s and was stopped" >&2
  # the first rank whose log holds an error: its last lines, without MindSpore's C++ log noise
  for log in $(ls "$log_dir"/worker_*.log 2>/dev/null | sort -V); do
    if grep -q -E "^Traceback|grpo_one_stage: error:|^watchdog: |Error:" "$log"; then
      rank="${log##*worker_}"; rank="${rank%.log}"
      echo "run_grpo.sh: rank $rank failed (log $log):" >&2
      grep -v -E "^\[(WARNING|INFO|DEBUG)\]" "$log" | grep -E -A 30 "^Traceback|grpo_one_stage: error:|^watchdog: " \
        | tail -n 30 >&2
      break
    fi
  done
  echo "run_grpo.sh: exit code $code" >&2
fi
exit "$code"
