#!/usr/bin/env bash
# A single-node Apache Kafka broker (KRaft: broker and controller in one JVM)
# on a log dir, from the released jars scripts/setup-kafka.sh fetches: what
# docs/kafka.md "Moving to Kafka" hands a logfs data dir to, and a broker to try
# `logfs mount --bootstrap-server` against.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

usage() {
    cat <<'EOF'
usage: scripts/kafka-broker.sh [--port N] [--daemon] LOG_DIR
       scripts/kafka-broker.sh --stop LOG_DIR
       scripts/kafka-broker.sh --topics ARGS...

Starts Apache Kafka (scripts/setup-kafka.sh's jars, fetched when missing) as
one KRaft node, node.id 1, listening on 127.0.0.1:PORT (default 9092; its
controller on PORT+1), with LOG_DIR as its only log dir.  The first start
formats LOG_DIR (kafka-storage format: a new cluster id, meta.properties);
later starts serve what is there.  Its server.properties and log are kept in
LOG_DIR.broker/ beside the log dir.

  (default)  runs in the foreground; Ctrl-C or SIGTERM stops it cleanly
  --daemon   starts it in the background, returns once it serves requests
             (its pid in LOG_DIR.broker/broker.pid, its log in
             LOG_DIR.broker/broker.log)
  --stop     stops the broker started with --daemon on LOG_DIR, cleanly
             (SIGTERM: it flushes, checkpoints and writes .kafka_cleanshutdown),
             and returns once it has exited
  --topics   runs Kafka's kafka-topics tool (TopicCommand) with ARGS, e.g.
             --topics --bootstrap-server localhost:9092 --list
EOF
}

port=9092
daemon=false
action=start
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --port) port="$2"; shift 2 ;;
        --port=*) port="${1#--port=}"; shift ;;
        --daemon) daemon=true; shift ;;
        --stop) action=stop; shift ;;
        --topics) action=topics; shift; break ;;
        --) shift; break ;;
        -*) echo "kafka-broker: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) break ;;
    esac
done

bash "$root/scripts/setup-kafka.sh" >&2
version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$root/scripts/kafka/pom.xml")
libs=${LOGFS_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/logfs/kafka-$version/libs}
java_cp=(java -Xmx512m -Xms128m -Djava.awt.headless=true -cp "$libs/*")

if [ "$action" = topics ]; then
    exec "${java_cp[@]}" -Dlog4j2.level=WARN org.apache.kafka.tools.TopicCommand "$@"
fi

if [ $# -ne 1 ]; then
    usage >&2
    exit 2
fi
mkdir -p "$1"
log_dir="$(cd "$1" && pwd)"
state="$log_dir.broker"
mkdir -p "$state"
pid_file="$state/broker.pid"

if [ "$action" = stop ]; then
    if [ ! -f "$pid_file" ] || ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        echo "kafka-broker: no broker of $log_dir is running" >&2
        rm -f "$pid_file"
        exit 1
    fi
    pid=$(cat "$pid_file")
    kill -TERM "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
    rm -f "$pid_file"
    echo "kafka-broker: stopped the broker of $log_dir (pid $pid)"
    exit 0
fi

if [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
    echo "kafka-broker: a broker of $log_dir is running already (pid $(cat "$pid_file"))" >&2
    exit 1
fi
if ! [[ "$port" =~ ^[0-9]+$ ]]; then
    echo "kafka-broker: --port takes a port number, not '$port'" >&2
    exit 2
fi
controller_port=$((port + 1))
config="$state/server.properties"
cat > "$config" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://localhost:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$log_dir
auto.create.topics.enable=false
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
cat > "$state/log4j2.properties" <<EOF
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = $state/broker.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
EOF

if [ ! -f "$log_dir/meta.properties" ]; then
    # a data dir logfs wrote has no meta.properties: the broker's log dir is a new one, adopted into
    if [ -n "$(ls -A "$log_dir")" ]; then
        echo "kafka-broker: $log_dir is not empty and not a formatted Kafka log dir: give the broker a new" \
             "directory and move a logfs data dir into it with 'logfs to-kafka adopt'" >&2
        exit 1
    fi
    cluster_id=$("${java_cp[@]}" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
    if ! out=$("${java_cp[@]}" -Dlog4j2.configurationFile="$state/log4j2.properties" kafka.tools.StorageTool \
            format -t "$cluster_id" -c "$config" 2>&1); then
        echo "$out" >&2
        echo "kafka-broker: could not format $log_dir" >&2
        exit 1
    fi
    echo "kafka-broker: formatted $log_dir (cluster id $cluster_id)" >&2
fi

broker=("${java_cp[@]}" -Dlog4j2.configurationFile="$state/log4j2.properties" kafka.Kafka "$config")
if [ "$daemon" = false ]; then
    echo "kafka-broker: serving $log_dir at localhost:$port (Ctrl-C stops it cleanly; log: $state/broker.log)" >&2
    exec "${broker[@]}"
fi

log_start=$(( $(stat -c %s "$state/broker.log" 2>/dev/null || echo 0) + 1 ))   # this start's lines only
nohup "${broker[@]}" > "$state/broker.out" 2>&1 &
pid=$!
echo "$pid" > "$pid_file"
# ready once the broker logs that it started: before that, clients are refused or time out
for _ in $(seq 1 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
        rm -f "$pid_file"
        echo "kafka-broker: the broker exited; the end of its log:" >&2
        tail -20 "$state/broker.out" "$state/broker.log" >&2 2>/dev/null || true
        exit 1
    fi
    if tail -c +"$log_start" "$state/broker.log" 2>/dev/null | grep -q "Kafka Server started"; then
        echo "kafka-broker: serving $log_dir at localhost:$port (pid $pid; stop: scripts/kafka-broker.sh --stop $1)"
        exit 0
    fi
    sleep 0.2
done
echo "kafka-broker: the broker did not start within 120 s; see $state/broker.log" >&2
kill -TERM "$pid" 2>/dev/null || true
exit 1
