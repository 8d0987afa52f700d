#!/usr/bin/env bash
# `make demo`: a real queue, end to end, in a private home under .demo/.
# Enqueue, run, crash the runner with kill -9 after an item's work is done,
# resume (--verify settles that item instead of re-running it), status,
# compact, and re-enqueue (only new items are added).
set -euo pipefail
cd "$(dirname "$0")/.."
export STATEQUEUE_HOME="$PWD/.demo/home"
rm -rf .demo && mkdir -p .demo/work
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "enqueue 30 items (a cron job would do this every time)"
seq -f 'page-%02g' 1 30 | statequeue enqueue

say "a worker: writes its output at once, then spends 0.3 s finishing up"
cat > .demo/worker.sh <<'SH'
#!/bin/sh
echo "processed $1" > ".demo/work/$1.txt"
printf '{"bytes": %d}' "$(wc -c < ".demo/work/$1.txt")" > "$STATEQUEUE_RESULT"
sleep 0.3  # e.g. an upload: the work is done, its result not yet recorded
SH
chmod +x .demo/worker.sh

say "run, and kill -9 the runner while page-05 is finishing up (its output exists)"
statequeue run --no-live -j2 -- .demo/worker.sh {} 2>/dev/null &
runner=$!
for _ in $(seq 400); do [ -s .demo/work/page-05.txt ] && break; sleep 0.05; done
kill -9 "$runner"
wait "$runner" 2>/dev/null || true
statequeue status

say "run again with --verify: interrupted items whose output exists are not run again"
statequeue run --no-live -j2 --verify 'test -s .demo/work/{}.txt' -- .demo/worker.sh {} 2>&1 |
  grep -v '^\[ok\]' || true
statequeue status --json

say "compact: results move to the archive, the journal shrinks"
statequeue compact

say "re-enqueue everything plus 5 new items: only the new ones are added"
seq -f 'page-%02g' 1 35 | statequeue enqueue
statequeue run --no-live -j4 -- .demo/worker.sh {}
statequeue status

say "stats: what the runs did (durations, throughput, failures, slowest, runners)"
statequeue stats
say "demo finished: queue data is in $STATEQUEUE_HOME/default"
