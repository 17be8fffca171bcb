#!/usr/bin/env bash
# Stops the one-host SLURM cluster that tests/cluster/slurm_up.sh started in STATE_DIR: cancels its jobs, then stops
# exactly the daemons whose pid files are there (slurmd, slurmctld, slurmdbd, mariadbd, munged), newest first.
#
#   tests/cluster/slurm_down.sh [STATE_DIR] [--purge]   # --purge also deletes STATE_DIR (database, logs, keys)
set -uo pipefail

STATE=$(realpath -m "${1:-/tmp/stagedyolo-slurm}")
RUN=$STATE/run
export SLURM_CONF=$STATE/etc/slurm.conf

stop() { # stop DAEMON: SIGTERM, then SIGKILL after 20 s
  local pidfile=$RUN/$1.pid pid
  [[ -s $pidfile ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$pidfile"
}

cancel_jobs() { # a job's slurmstepd outlives slurmd: cancel the jobs while slurmctld can still reach them
  [[ -f $SLURM_CONF && -s $RUN/slurmctld.pid ]] || return 0
  kill -0 "$(cat "$RUN/slurmctld.pid")" 2>/dev/null || return 0
  scancel --full --signal=KILL --state=RUNNING 2>/dev/null
  scancel 2>/dev/null --state=PENDING
  for _ in $(seq 50); do
    [[ -z $(squeue --noheader 2>/dev/null) ]] && return 0
    sleep 0.2
  done
}

cancel_jobs
for daemon in slurmd slurmctld slurmdbd mariadbd munged; do stop $daemon; done
# slurm_up.sh's link to the config, if it is still ours
[[ $(readlink /etc/slurm/slurm.conf 2>/dev/null) == "$SLURM_CONF" ]] && rm -f /etc/slurm/slurm.conf
[[ ${2:-} == --purge ]] && rm -rf "$STATE"
echo "slurm_down: stopped (state in $STATE)"
