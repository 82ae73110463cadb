#!/usr/bin/env bash
# A multi-node Ray cluster, an S3 endpoint and Prometheus on one host, all on loopback
# (Ray's nodes on 127.0.0.2, the rest on 127.0.0.1).
#
#   infra/local/cluster.sh up        # head + CPU workers + engine workers, moto S3, Prometheus
#   source "$GRAVITYOCR_LOCAL_DIR/env.sh"   # RAY_ADDRESS, token auth, AWS_* for the S3 endpoint
#   infra/local/cluster.sh status
#   infra/local/cluster.sh down      # stops exactly what `up` started (by process group)
#
# The node groups mirror infra/kuberay: every Ray node advertises a custom resource named
# after its group (head, cpu_worker, engine_worker), so placement written against those
# resources behaves the same here and on Kubernetes.
#
# Settings (environment):
#   GRAVITYOCR_LOCAL_DIR   state: pids, logs, token, Ray temp dir   (/tmp/gravityocr-local)
#   GRAVITYOCR_PORT_BASE   first of a block of ports, see below      (20000)
#   CPU_WORKERS            CPU worker nodes (render, layout)         (1)
#   ENGINE_WORKERS         engine worker nodes (engine actors)       (1)
#   WORKER_CPUS            logical CPUs per worker node              (2)
#   RAY_NODE_HOST          the Ray nodes' loopback address           (127.0.0.2)
#   START_TIMEOUT_S        how long to wait for each Ray node        (180)
#   OBJECT_STORE_BYTES     object store per node                     (200000000)
#   RAY_AUTH_MODE          token or disabled; set on every `ray start` (token)
#   WITH_S3, WITH_PROMETHEUS   1 to start them                       (1, 1)
#   S3_BUCKETS             buckets created on the S3 endpoint        (gravityocr-input gravityocr-output)
#
# Ports, from GRAVITYOCR_PORT_BASE (B): B Ray GCS, B+1 dashboard, B+2 Ray client,
# B+3 Prometheus, B+4 S3, B+5 autoscaler metrics, B+6 dashboard metrics; and for Ray
# node i (the head is 0; up to 10 nodes): B+10+i metrics export, B+40+i and B+50+i
# dashboard agent, B+60+i runtime env agent, B+70+i node manager, B+80+i object manager,
# B+100+100*i .. +99 worker processes.
set -euo pipefail

DIR="${GRAVITYOCR_LOCAL_DIR:-/tmp/gravityocr-local}"
BASE="${GRAVITYOCR_PORT_BASE:-20000}"
CPU_WORKERS="${CPU_WORKERS:-1}"
ENGINE_WORKERS="${ENGINE_WORKERS:-1}"
WORKER_CPUS="${WORKER_CPUS:-2}"
OBJECT_STORE_BYTES="${OBJECT_STORE_BYTES:-200000000}"
AUTH_MODE="${RAY_AUTH_MODE:-token}"
WITH_S3="${WITH_S3:-1}"
WITH_PROMETHEUS="${WITH_PROMETHEUS:-1}"
S3_BUCKETS="${S3_BUCKETS:-gravityocr-input gravityocr-output}"
HERE="$(cd "$(dirname "$0")" && pwd)"
PROMETHEUS_CONFIG="$HERE/../prometheus/prometheus-local.yml"

# Ray's own address. Ray rewrites 127.0.0.1 (and localhost) to the host's routable IP, so
# the Ray nodes use another loopback address; the other services use 127.0.0.1.
RAY_HOST="${RAY_NODE_HOST:-127.0.0.2}"
HOST=127.0.0.1
GCS_PORT=$BASE
DASHBOARD_PORT=$((BASE + 1))
CLIENT_PORT=$((BASE + 2))
PROMETHEUS_PORT=$((BASE + 3))
S3_PORT=$((BASE + 4))
AUTOSCALER_METRICS_PORT=$((BASE + 5))
DASHBOARD_METRICS_PORT=$((BASE + 6))
START_TIMEOUT_S="${START_TIMEOUT_S:-180}"

log() { echo "[cluster.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' not found: $2"
}

port_open() {  # port_open PORT [HOST] -> 0 if something listens there
  (exec 3<>"/dev/tcp/${2:-$HOST}/$1") 2>/dev/null
}

wait_for() {  # wait_for DESCRIPTION SECONDS COMMAND...
  local what="$1" seconds="$2"; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what (logs: $DIR/logs)"
    sleep 1
  done
}

# start NAME COMMAND...: run in its own session (so its process group is its pid) and
# record the pid; `down` signals that process group and nothing else.
start() {
  local name="$1"; shift
  if [[ -f "$DIR/pids/$name.pid" ]] && kill -0 "$(cat "$DIR/pids/$name.pid")" 2>/dev/null; then
    die "$name is already running (pid $(cat "$DIR/pids/$name.pid")); run '$0 down' first"
  fi
  setsid "$@" >"$DIR/logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$DIR/pids/$name.pid"
  log "started $name (pid $!)"
}

ray_env() {  # the auth settings every `ray start` and every client must share
  export RAY_AUTH_MODE="$AUTH_MODE"
  if [[ "$AUTH_MODE" == token ]]; then
    export RAY_AUTH_TOKEN_PATH="$DIR/auth_token"
  fi
  # Local teardown: no 30 s drain on SIGTERM (that is for Serve upgrades on Kubernetes).
  export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0
  export RAY_USAGE_STATS_ENABLED=0
}

alive_nodes() {  # number of alive Ray nodes, from the dashboard's state API
  python - "http://$HOST:$DASHBOARD_PORT" <<'EOF' 2>/dev/null || echo 0
import sys
from ray.util.state import list_nodes
print(len(list_nodes(address=sys.argv[1], filters=[("state", "=", "ALIVE")], timeout=10)))
EOF
}

node_ports() {  # every port of Ray node i, fixed: predictable for Prometheus and firewalls
  local i=$1
  echo --metrics-export-port=$((BASE + 10 + i)) --dashboard-agent-listen-port=$((BASE + 40 + i)) \
    --dashboard-agent-grpc-port=$((BASE + 50 + i)) --runtime-env-agent-port=$((BASE + 60 + i)) \
    --node-manager-port=$((BASE + 70 + i)) --object-manager-port=$((BASE + 80 + i)) \
    --min-worker-port=$((BASE + 100 + 100 * i)) --max-worker-port=$((BASE + 199 + 100 * i))
}

nodes_at_least() { [[ $(alive_nodes) -ge $1 ]]; }

start_ray() {
  need ray "pip install -e . (ray[serve,data] is a dependency)"
  ray_env
  if [[ "$AUTH_MODE" == token && ! -s "$DIR/auth_token" ]]; then
    (umask 077; python -c 'import secrets; print(secrets.token_hex(32))' > "$DIR/auth_token")
  fi
  local common=(--block --disable-usage-stats --num-gpus=0 --object-store-memory="$OBJECT_STORE_BYTES"
                --node-ip-address="$RAY_HOST")
  AUTOSCALER_METRIC_PORT=$AUTOSCALER_METRICS_PORT DASHBOARD_METRIC_PORT=$DASHBOARD_METRICS_PORT \
  start ray-head ray start --head "${common[@]}" --port=$GCS_PORT \
    --dashboard-host=$HOST --dashboard-port=$DASHBOARD_PORT --ray-client-server-port=$CLIENT_PORT \
    $(node_ports 0) --temp-dir="$DIR/ray" --num-cpus=1 --resources='{"head": 1}'
  wait_for "the Ray head on $RAY_HOST:$GCS_PORT" "$START_TIMEOUT_S" port_open $GCS_PORT "$RAY_HOST"
  wait_for "the Ray dashboard on $HOST:$DASHBOARD_PORT" "$START_TIMEOUT_S" port_open $DASHBOARD_PORT
  wait_for "the Ray head to register" "$START_TIMEOUT_S" nodes_at_least 1

  # One node at a time: nodes sharing a host and session directory pick their socket and
  # log file names by counting what is there, so two starting together can collide.
  # As on KubeRay: cpu_worker counts CPUs, engine_worker is 1 per node (one engine per GPU node).
  local i=1 k group n units expected
  for group in cpu_worker engine_worker; do
    if [[ $group == cpu_worker ]]; then n=$CPU_WORKERS units=$WORKER_CPUS; else n=$ENGINE_WORKERS units=1; fi
    for ((k = 0; k < n; k++)); do
      start "ray-$group-$k" ray start "${common[@]}" --address=$RAY_HOST:$GCS_PORT $(node_ports $i) \
        --num-cpus="$WORKER_CPUS" --resources="{\"$group\": $units}"
      i=$((i + 1))
      wait_for "Ray node $i of the cluster ($group $k)" "$START_TIMEOUT_S" nodes_at_least $i
    done
  done
  expected=$i
  log "Ray: $expected nodes at $RAY_HOST:$GCS_PORT, dashboard http://$HOST:$DASHBOARD_PORT"
}

start_s3() {
  need moto_server "pip install 'moto[server]'"
  start s3 moto_server -H $HOST -p $S3_PORT
  wait_for "the S3 endpoint on $HOST:$S3_PORT" 60 port_open $S3_PORT
  AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local python - "http://$HOST:$S3_PORT" $S3_BUCKETS <<'EOF'
import sys
import boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
for bucket in sys.argv[2:]:
    s3.create_bucket(Bucket=bucket)
EOF
  log "S3: http://$HOST:$S3_PORT, buckets: $S3_BUCKETS"
}

start_prometheus() {
  need prometheus "apt-get install prometheus (Debian's package)"
  mkdir -p "$DIR/prometheus/data"
  # The config finds Ray's service discovery file relative to itself: ../ray/...
  cp "$PROMETHEUS_CONFIG" "$DIR/prometheus/prometheus.yml"
  start prometheus prometheus --config.file="$DIR/prometheus/prometheus.yml" \
    --storage.tsdb.path="$DIR/prometheus/data" --web.listen-address=$HOST:$PROMETHEUS_PORT \
    --storage.tsdb.retention.time=1d
  wait_for "Prometheus on $HOST:$PROMETHEUS_PORT" 60 \
    python -c "import urllib.request; urllib.request.urlopen('http://$HOST:$PROMETHEUS_PORT/-/ready', timeout=2)"
  log "Prometheus: http://$HOST:$PROMETHEUS_PORT"
}

write_env() {
  {
    echo "# source this file to use the local cluster"
    echo "export RAY_ADDRESS=$RAY_HOST:$GCS_PORT"
    echo "export RAY_API_SERVER_ADDRESS=http://$HOST:$DASHBOARD_PORT"
    echo "export RAY_AUTH_MODE=$AUTH_MODE"
    [[ "$AUTH_MODE" == token ]] && echo "export RAY_AUTH_TOKEN_PATH=$DIR/auth_token"
    if [[ "$WITH_S3" == 1 ]]; then
      echo "export AWS_ENDPOINT_URL=http://$HOST:$S3_PORT"
      echo "export AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_DEFAULT_REGION=us-east-1"
    fi
    [[ "$WITH_PROMETHEUS" == 1 ]] && echo "export PROMETHEUS_URL=http://$HOST:$PROMETHEUS_PORT"
    true
  } > "$DIR/env.sh"
}

stop_one() {  # stop_one PIDFILE: TERM the process group, KILL it if still there after 30 s
  local pidfile="$1" pid name
  pid="$(cat "$pidfile")"; name="$(basename "$pidfile" .pid)"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 30); do
      kill -0 -- "-$pid" 2>/dev/null || break
      sleep 1
    done
    if kill -0 -- "-$pid" 2>/dev/null; then
      log "$name did not stop on SIGTERM: SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    log "stopped $name"
  fi
  rm -f "$pidfile"
}

down() {
  [[ -d "$DIR/pids" ]] || { log "nothing to stop in $DIR"; return 0; }
  local f
  # Workers before the head, the head before the services it reports to.
  for f in "$DIR"/pids/ray-cpu_worker-*.pid "$DIR"/pids/ray-engine_worker-*.pid \
           "$DIR"/pids/ray-head.pid "$DIR"/pids/prometheus.pid "$DIR"/pids/s3.pid; do
    [[ -f "$f" ]] && stop_one "$f"
  done
  return 0
}

status() {
  local f pid
  for f in "$DIR"/pids/*.pid; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then echo "$(basename "$f" .pid) running (pid $pid)";
    else echo "$(basename "$f" .pid) not running"; fi
  done
  [[ -f "$DIR/env.sh" ]] && cat "$DIR/env.sh"
  return 0
}

case "${1:-}" in
  up)
    mkdir -p "$DIR/pids" "$DIR/logs"
    ready=0
    trap 'if [[ $ready != 1 ]]; then log "up failed: stopping what was started"; down; fi' EXIT
    start_ray
    if [[ "$WITH_S3" == 1 ]]; then start_s3; fi
    if [[ "$WITH_PROMETHEUS" == 1 ]]; then start_prometheus; fi
    write_env
    ready=1
    log "ready: source $DIR/env.sh"
    ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
