#!/usr/bin/env bash
# Runs every Python driver against jaxlib's own built-in coordination service
# (the reference implementation), to show the drivers themselves are right.
# Independent of the Rust build.  ~30 s.  Usage: tests/python/selftest_builtin.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY="$(scripts/setup-jax.sh | tail -n 1)"
DIR="$(pwd)/target/python-selftest"
rm -rf "$DIR"
mkdir -p "$DIR"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
FAILED=0
PASSED=0
SVC=""

cleanup() { if [[ -n "$SVC" ]] && kill -0 "$SVC" 2>/dev/null; then kill "$SVC"; wait "$SVC" 2>/dev/null || true; fi; }
trap cleanup EXIT

# start_service N NAME -> sets ADDR and SVC
start_service() {
    local out="$DIR/$2.svc.out"
    timeout 300 "$PY" tests/python/builtin_service.py --num-tasks "$1" --seconds 240 >"$out" 2>"$DIR/$2.svc.err" &
    SVC=$!
    for _ in $(seq 200); do grep -q LISTENING "$out" && break; sleep 0.05; done
    ADDR="$(awk '/LISTENING/{print $2}' "$out")"
    [[ -n "$ADDR" ]] || { echo "service for $2 did not start"; cat "$DIR/$2.svc.err"; exit 1; }
}

result() { # NAME RC
    if [[ "$2" == 0 ]]; then PASSED=$((PASSED + 1)); echo "ok   $1"; else FAILED=$((FAILED + 1)); echo "FAIL $1 (see $DIR)"; fi
}

# wait_all NAME PID... : all must exit 0
wait_all() {
    local name=$1 rc=0; shift
    for p in "$@"; do wait "$p" || rc=$?; done
    cleanup; SVC=""
    result "$name" "$rc"
}

for n in 1 2 3; do
    start_service "$n" "ops$n"
    pids=()
    for k in $(seq 0 $((n - 1))); do
        timeout 150 "$PY" tests/python/jax_client.py ops --address "$ADDR" --node-id "$k" --num-tasks "$n" \
            >"$DIR/ops$n.t$k.out" 2>"$DIR/ops$n.t$k.err" &
        pids+=($!)
    done
    wait_all "ops N=$n" "${pids[@]}"
done

start_service 2 loop
pids=()
for k in 0 1; do
    timeout 120 "$PY" tests/python/jax_client.py loop --address "$ADDR" --node-id "$k" --num-tasks 2 \
        --seconds 3 --acked "$DIR/loop.acked$k" >"$DIR/loop.t$k.out" 2>"$DIR/loop.t$k.err" &
    pids+=($!)
done
wait_all "loop N=2 3s" "${pids[@]}"

# hold: task 0 parks in a barrier over {0,2}, task 1 in a blocking get of K;
# task 2 waits for a line on stdin, then sets K and joins the barrier.
start_service 3 hold
C=(timeout 120 "$PY" tests/python/jax_client.py hold --address "$ADDR" --num-tasks 3)
"${C[@]}" --node-id 0 --action barrier --barrier-id hold/B --process-ids 0,2 >"$DIR/hold.t0.out" 2>"$DIR/hold.t0.err" &
h0=$!
"${C[@]}" --node-id 1 --action get --key hold/K >"$DIR/hold.t1.out" 2>"$DIR/hold.t1.err" &
h1=$!
mkfifo "$DIR/hold.in2"
"${C[@]}" --node-id 2 --wait-stdin --action set --action barrier --key hold/K --value V \
    --barrier-id hold/B --process-ids 0,2 <"$DIR/hold.in2" >"$DIR/hold.t2.out" 2>"$DIR/hold.t2.err" &
h2=$!
exec 7>"$DIR/hold.in2"
for _ in $(seq 300); do
    [[ "$(cat "$DIR"/hold.t?.out | grep -c '^READY$')" == 3 ]] && break
    sleep 0.1
done
sleep 0.5
echo go >&7
exec 7>&-
wait_all "hold N=3" "$h0" "$h1" "$h2"
grep -q '"value": "V"' "$DIR/hold.t1.out"; result "hold get saw the value" $?

# a real JAX job, N=2: process 0 hosting jax's service itself ...
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
pids=()
for k in 0 1; do
    extra=(); [[ $k == 0 ]] && extra=(--host-service)
    timeout 200 "$PY" tests/python/jax_job.py --coordinator "127.0.0.1:$PORT" --num-processes 2 --process-id "$k" \
        "${extra[@]}" >"$DIR/job-host.p$k.out" 2>"$DIR/job-host.p$k.err" &
    pids+=($!)
done
wait_all "jax_job N=2 (process 0 hosts the service)" "${pids[@]}"

# ... and against a separate service with the bind trick
start_service 2 job
pids=()
for k in 0 1; do
    timeout 200 "$PY" tests/python/jax_job.py --coordinator "$ADDR" --num-processes 2 --process-id "$k" \
        >"$DIR/job.p$k.out" 2>"$DIR/job.p$k.err" &
    pids+=($!)
done
wait_all "jax_job N=2 (external service, bind trick)" "${pids[@]}"

rc=0
timeout 200 "$PY" bench/python/jax_latency.py --builtin --iterations 50 >"$DIR/latency.json" 2>"$DIR/latency.err" || rc=$?
result "jax_latency --builtin --iterations 50" "$rc"
cat "$DIR/latency.json"

echo "$PASSED passed, $FAILED failed"
[[ $FAILED == 0 ]]
