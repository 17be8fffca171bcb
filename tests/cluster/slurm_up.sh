#!/usr/bin/env bash
# A one-host SLURM cluster for the tests: munge, MariaDB (the accounting database), slurmdbd, slurmctld and slurmd
# as plain daemons (no systemd), this host's cores and memory as one node in one CPU partition, no GPUs.
#
#   tests/cluster/slurm_up.sh [STATE_DIR]      # default /tmp/stagedyolo-slurm
#   export SLURM_CONF=STATE_DIR/etc/slurm.conf  # what sinfo, sbatch, sacct and the jobs read
#   tests/cluster/slurm_down.sh [STATE_DIR]
#
# Everything it writes (configs, keys, database, spool, logs, pid files) lives under STATE_DIR, but for one link:
# /etc/slurm/slurm.conf, the config path srun uses inside jobs (see link_default_config). Needs root: slurmd runs jobs as their submitting user. Installs the Debian packages when missing.
# A second call while the cluster is up returns at once. On failure the last line on stderr starts with
# "slurm_up: FAILED:" and names what failed, with the daemon's own log line when there is one.
set -euo pipefail

STATE=$(realpath -m "${1:-/tmp/stagedyolo-slurm}")
ETC=$STATE/etc LOG=$STATE/log RUN=$STATE/run
CLUSTER=stagedyolo ACCOUNT=stagedyolo PARTITION=cpu
DB_PORT=3307 # not 3306, so a MariaDB the host already runs is left alone
export SLURM_CONF=$ETC/slurm.conf

fail() {
  echo "slurm_up: FAILED: $*" >&2
  exit 1
}

last_error_line() { # the most telling line of a daemon's log: its last error, else its last line
  local log=$1
  [[ -s $log ]] || { echo "(no log at $log)"; return; }
  grep -iE 'error|fatal|cannot|couldn|failed|refus' "$log" | tail -1 | grep . || tail -1 "$log"
}

pid_alive() { [[ -s $RUN/$1.pid ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

node_idle() { sinfo --noheader --partition "$PARTITION" --format '%T' 2>/dev/null | grep -qx 'idle'; }

wait_until() { # wait_until SECONDS COMMAND...: poll COMMAND every 0.2 s, false if it never succeeds
  local seconds=$1
  shift
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

already_up() {
  [[ -f $SLURM_CONF && $(readlink /etc/slurm/slurm.conf) == "$SLURM_CONF" ]] || return 1
  for daemon in munged mariadbd slurmdbd slurmctld slurmd; do pid_alive $daemon || return 1; done
  node_idle
}

install_packages() {
  local missing=()
  command -v munged >/dev/null || missing+=(munge)
  command -v mariadbd >/dev/null || missing+=(mariadb-server)
  command -v slurmdbd >/dev/null || missing+=(slurmdbd)
  { command -v slurmctld && command -v slurmd && command -v sbatch; } >/dev/null || missing+=(slurm-wlm)
  ((${#missing[@]})) || return 0
  echo "slurm_up: installing ${missing[*]}" >&2
  # policy-rc.d stops the packages' own service scripts from starting daemons with the system's configs
  if ! {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  } >"$LOG/apt.log" 2>&1; then
    fail "apt-get install ${missing[*]}: $(tail -1 "$LOG/apt.log")"
  fi
}

write_configs() {
  # The node as slurmd itself measures it (CPUs, sockets, cores, threads, RealMemory): a configured size above the
  # measured one would drain the node.
  local node
  node=$(slurmd -C | head -1) || fail "slurmd -C could not measure this host"
  local host=${node#NodeName=}
  host=${host%% *}
  cat >"$ETC/slurm.conf" <<EOF
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job may start again this many seconds later (default 120)
AuthInfo=socket=$RUN/munge.socket,cred_expire=20
CredType=cred/munge
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
# No cgroups: this kind of machine (a VM or container) rarely lets slurmd own a cgroup tree. Processes are tracked
# through /proc, nothing is pinned or memory-fenced.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
# The munge socket for talking to slurmdbd: SLURM takes it from here, not from AuthInfo
AccountingStoragePass=$RUN/munge.socket
# sacct shows the plugin's --comment (rule_<rule>_wildcards_<wildcards>): the tests map jobs to rules by it
AccountingStoreFlags=job_comment
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# Fast turnarounds for tests: a cancelled or timed-out job gets SIGKILL 5 s after SIGTERM (default 30 s).
KillWait=5
MinJobAge=300
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
SchedulerType=sched/backfill
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$RUN/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$ETC/slurmdbd.conf" # slurmdbd refuses a config others can read (it holds the database password)
  # SLURM 22.05 has no CgroupPlugin=disabled (slurmd fails on it): slurmd always loads a cgroup plugin, and with no
  # setting it picks the version the host mounts. Nothing uses it here (ProctrackType, TaskPlugin above).
  echo "# defaults: see slurm_up.sh" >"$ETC/cgroup.conf"
}

# The one path outside STATE_DIR. Inside a job, the executor plugin's job step drops every SLURM_* variable but the
# job's identity (SLURM_CONF too) before it calls srun, so srun needs the config at its built-in default path, as
# on any real cluster. A link, made only where no config exists; slurm_down.sh removes it if it is still ours.
link_default_config() {
  local default=/etc/slurm/slurm.conf
  [[ $(readlink "$default" 2>/dev/null) == "$SLURM_CONF" ]] && return
  [[ -e $default || -L $default ]] && fail "$default exists and is not ours; srun inside jobs would read it"
  mkdir -p /etc/slurm && ln -s "$SLURM_CONF" "$default"
}

start_munge() {
  pid_alive munged && return
  [[ -s $ETC/munge.key ]] || { dd if=/dev/urandom bs=1 count=1024 of="$ETC/munge.key" status=none && chmod 400 "$ETC/munge.key"; }
  # --force: munged refuses a socket folder under a world-writable /tmp otherwise
  munged --force --key-file="$ETC/munge.key" --socket="$RUN/munge.socket" --pid-file="$RUN/munged.pid" \
    --log-file="$LOG/munged.log" --seed-file="$STATE/munge.seed" \
    || fail "munged would not start: $(last_error_line "$LOG/munged.log")"
  wait_until 10 pid_alive munged || fail "munged: $(last_error_line "$LOG/munged.log")"
  munge --socket="$RUN/munge.socket" -n </dev/null | unmunge --socket="$RUN/munge.socket" >/dev/null \
    || fail "munge credentials do not round-trip: $(last_error_line "$LOG/munged.log")"
}

database_answers() { mariadb --protocol=socket --socket="$RUN/mariadb.sock" -u root -e 'select 1' >/dev/null 2>&1; }

start_mariadb() {
  pid_alive mariadbd && return
  if [[ ! -d $STATE/mysql/mysql ]]; then
    mariadb-install-db --no-defaults --user=root --datadir="$STATE/mysql" --auth-root-authentication-method=socket \
      >"$LOG/mariadb-install.log" 2>&1 || fail "mariadb-install-db: $(last_error_line "$LOG/mariadb-install.log")"
  fi
  mariadbd --no-defaults --user=root --datadir="$STATE/mysql" --socket="$RUN/mariadb.sock" \
    --bind-address=127.0.0.1 --port=$DB_PORT --pid-file="$RUN/mariadbd.pid" --log-error="$LOG/mariadb.log" \
    --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
  disown
  wait_until 60 database_answers || fail "mariadbd would not start: $(last_error_line "$LOG/mariadb.log")"
  mariadb --protocol=socket --socket="$RUN/mariadb.sock" -u root <<'EOF'
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
}

start_slurmdbd() {
  pid_alive slurmdbd && return
  # slurmdbd has no config option: it reads the slurmdbd.conf beside $SLURM_CONF
  slurmdbd || fail "slurmdbd would not start: $(last_error_line "$LOG/slurmdbd.log")"
  wait_until 60 sacctmgr --noheader list cluster >/dev/null 2>&1 \
    || fail "slurmdbd does not answer: $(last_error_line "$LOG/slurmdbd.log")"
}

register_cluster() { # sacct reads jobs per cluster; the account lets jobs carry one
  sacctmgr --noheader list cluster format=cluster | grep -qw "$CLUSTER" \
    || sacctmgr -i add cluster "$CLUSTER" >/dev/null || fail "sacctmgr add cluster $CLUSTER"
  sacctmgr --noheader list account format=account | grep -qw "$ACCOUNT" \
    || sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" >/dev/null || fail "sacctmgr add account $ACCOUNT"
  # root exists from the start, in account root: what is checked is root's association with our account
  sacctmgr --noheader list assoc user=root account="$ACCOUNT" format=account | grep -qw "$ACCOUNT" \
    || sacctmgr -i add user root account="$ACCOUNT" cluster="$CLUSTER" >/dev/null || fail "sacctmgr add user root"
}

start_slurm() {
  pid_alive slurmctld || slurmctld -f "$SLURM_CONF" \
    || fail "slurmctld would not start: $(last_error_line "$LOG/slurmctld.log")"
  wait_until 30 scontrol ping >/dev/null 2>&1 \
    || fail "slurmctld does not answer: $(last_error_line "$LOG/slurmctld.log")"
  pid_alive slurmd || slurmd -f "$SLURM_CONF" || fail "slurmd would not start: $(last_error_line "$LOG/slurmd.log")"
  wait_until 60 node_idle \
    || fail "the node is not idle ($(sinfo --noheader -o '%T %E' 2>&1 | head -1)): $(last_error_line "$LOG/slurmd.log")"
}

main() {
  already_up && {
    echo "slurm_up: already up (SLURM_CONF=$SLURM_CONF)"
    return
  }
  ((EUID == 0)) || fail "not root: slurmd must run as root to start jobs as their users"
  mkdir -p "$ETC" "$LOG" "$RUN" "$STATE/spool/ctld" "$STATE/spool/d"
  chmod 700 "$RUN" "$ETC"
  install_packages
  write_configs
  link_default_config
  start_munge
  start_mariadb
  start_slurmdbd
  register_cluster
  start_slurm
  echo "slurm_up: up: $(sinfo --version), node $(sinfo --noheader -o '%N %c CPUs %m MB') (SLURM_CONF=$SLURM_CONF)"
}

main
