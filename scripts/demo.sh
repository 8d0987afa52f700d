#!/usr/bin/env bash
# `make demo`: a real queue, end to end, in a private home under .demo/.
# Enqueue, run, crash the runner with kill -9, resume, status, compact, and
# re-enqueue (only new items are added).
set -euo pipefail
cd "$(dirname "$0")/.."
export STATEQUEUE_HOME="$PWD/.demo/home"
rm -rf .demo && mkdir -p .demo/work
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "enqueue 30 items (a cron job would do this every time)"
seq -f 'page-%02g' 1 30 | statequeue enqueue

say "a worker that takes 0.1 s per item and writes a JSON result"
cat > .demo/worker.sh <<'SH'
#!/bin/sh
sleep 0.1
echo "processed $1" > ".demo/work/$1.txt"
printf '{"bytes": %d}' "$(wc -c < ".demo/work/$1.txt")" > "$STATEQUEUE_RESULT"
SH
chmod +x .demo/worker.sh

say "run, and kill -9 the runner after 1 second"
statequeue run --no-live -j2 -- .demo/worker.sh {} 2>/dev/null &
runner=$!
sleep 1
kill -9 "$runner"
wait "$runner" 2>/dev/null || true
statequeue status

say "run again: finished items are kept, the interrupted ones run again"
statequeue run --no-live -j2 --verify 'test -s .demo/work/{}.txt' -- .demo/worker.sh {}
statequeue status --json

say "compact: results move to the archive, the journal shrinks"
statequeue compact

say "re-enqueue everything plus 5 new items: only the new ones are added"
seq -f 'page-%02g' 1 35 | statequeue enqueue
statequeue run --no-live -- .demo/worker.sh {}
statequeue status
say "demo finished: queue data is in $STATEQUEUE_HOME/default"
