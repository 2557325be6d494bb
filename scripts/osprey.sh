#!/usr/bin/env bash
# Builds osprey if needed, then runs it with the given arguments: scripts/osprey.sh generate ...
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
[[ -x "$root/build/osprey" ]] || bash "$root/scripts/build.sh" >&2
exec "$root/build/osprey" "$@"
