#!/usr/bin/env bash
# Alternate PGQueuer's drain with the fair-share Worker's on the same PostgreSQL server,
# so that each round gives a ratio measured minutes apart (this machine's speed moves by
# a third within an hour: only same-round ratios mean anything; docs/benchmarks.md).
#
#   bench/alternate.sh ROUNDS [SCAN_MAX_AGE ...]
#
# Each round: PGQueuer x8 (bench/peer_pgqueuer.py --procs 8 --analyze), then one
# `readyq bench` Worker drain (x8 processes, 10 groups, Concurrency(10), inline) per
# SCAN_MAX_AGE given (none: the Worker's default), which also prints the raw loop's x8
# drain (batches of 10, finalize_and_claim) that its command measures first. Needs
# PGQueuer in $PGQ_PYTHON's virtualenv (default /tmp/pgq/bin/python; see
# bench/peer_pgqueuer.py) and readyq in
# $READYQ (default .venv/bin/readyq); $URL names the server, $JOBS the jobs per drain
# (default 5000, as issue 6's peer figures).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:?usage: bench/alternate.sh ROUNDS [SCAN_MAX_AGE ...]}
shift
PGQ_PYTHON=${PGQ_PYTHON:-/tmp/pgq/bin/python}
READYQ=${READYQ:-.venv/bin/readyq}
URL=${URL:-postgresql+psycopg://postgres@127.0.0.1:5432/postgres}
JOBS=${JOBS:-5000}
ages=("$@")
[ ${#ages[@]} -eq 0 ] && ages=(default)
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r $(date +%T)"
  "$PGQ_PYTHON" bench/peer_pgqueuer.py --procs 8 --analyze --jobs "$JOBS" | grep median
  for age in "${ages[@]}"; do
    option=()
    [ "$age" != default ] && option=(--scan-max-age "$age")
    echo -n "scan_max_age=$age: "
    "$READYQ" bench --url "$URL" --only drain --workers 8 --limits 10 --fair-workers 8 \
      --executors inline --jobs "$JOBS" --repeat 3 --modes process "${option[@]}" 2>/dev/null |
      grep -E "^(Worker process|raw process x8 limit 10, finalize_and_claim)"
  done
done
