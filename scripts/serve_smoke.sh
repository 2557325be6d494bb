# Sourced by the GPU scripts (gpu_graph_test.sh, gpu_overlap.sh): one short serve session.
# serve_smoke OSPREY MODEL PORT LOG METRICS_OUT [serve flags...]: starts `osprey serve` on the GPU
# with the model, waits for /health (120 s at most), sends 4 completions, saves /metrics to
# METRICS_OUT and stops the server. Returns non-zero if the server never answered or a request
# failed.
serve_smoke() {
  local osprey=$1 model=$2 port=$3 log=$4 metrics=$5
  shift 5
  "$osprey" serve --model "$model" --device cuda --port "$port" "$@" > "$log" 2>&1 &
  local pid=$!
  local up=1
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && { up=0; break; }
    sleep 1
  done
  local rc=$up
  for i in 1 2 3 4; do
    curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"Ana has $i apples.\", \"max_tokens\": 32}" || rc=1
    echo
  done
  curl -sf "http://127.0.0.1:$port/metrics" > "$metrics" || rc=1
  kill "$pid"
  wait "$pid" 2>/dev/null
  return $rc
}
