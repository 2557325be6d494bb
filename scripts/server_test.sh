#!/usr/bin/env bash
# Runs a test command against a live `osprey serve`:
#   scripts/server_test.sh OSPREY_BINARY [serve args...] -- COMMAND [args...]
# Starts the server on a free port, waits for /health, runs COMMAND with OSPREY_URL set
# (e.g. http://127.0.0.1:41234), then stops the server. Fails if the server dies during the test
# (its log is printed). With OSPREY_SERVER_LOG set, the server's log is kept there.
# COMMAND also gets OSPREY_SERVER_PID and OSPREY_SERVER_LOG_FILE (the live log). With
# OSPREY_EXPECT_EXIT=1 the test is expected to end the server itself (a signal): the server must
# then exit with status 0 within 30 s.
set -euo pipefail
osprey=$1
shift
serve_args=()
while [[ $# -gt 0 && $1 != -- ]]; do serve_args+=("$1"); shift; done
[[ ${1:-} == -- ]] || { echo "server_test: missing -- COMMAND" >&2; exit 2; }
shift
log=$(mktemp)
"$osprey" serve --port 0 "${serve_args[@]}" >"$log" 2>&1 &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  [[ -z ${OSPREY_SERVER_LOG:-} ]] || cp "$log" "$OSPREY_SERVER_LOG"
  rm -f "$log"
}
trap cleanup EXIT
url=""
for _ in $(seq 1 300); do
  if ! kill -0 "$pid" 2>/dev/null; then echo "server_test: osprey serve exited:" >&2; cat "$log" >&2; exit 1; fi
  url=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" | head -1 || true)
  [[ -n $url ]] && curl -sf "$url/health" >/dev/null 2>&1 && break
  url=""
  sleep 0.2
done
[[ -n $url ]] || { echo "server_test: the server did not come up:" >&2; cat "$log" >&2; exit 1; }
rc=0
OSPREY_URL=$url OSPREY_SERVER_PID=$pid OSPREY_SERVER_LOG_FILE=$log "$@" || rc=$?
if [[ ${OSPREY_EXPECT_EXIT:-} == 1 ]]; then
  for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "server_test: osprey serve did not exit within 30 s of the test's end:" >&2
    cat "$log" >&2
    exit 1
  fi
  server_rc=0
  wait "$pid" || server_rc=$?
  echo "server_test: osprey serve exited with status $server_rc; its last lines:"
  tail -4 "$log"
  [[ $server_rc == 0 ]] || { echo "server_test: expected exit status 0" >&2; cat "$log" >&2; exit 1; }
  exit $rc
fi
if ! kill -0 "$pid" 2>/dev/null; then echo "server_test: osprey serve died during the test:" >&2; cat "$log" >&2; exit 1; fi
[[ $rc == 0 ]] || { echo "server_test: test failed (rc $rc); server log:" >&2; tail -20 "$log" >&2; }
exit $rc
