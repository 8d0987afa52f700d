#!/bin/sh
# The worker of the README's quick start: `statequeue run` calls it once per item (a number).
# It works for a moment, stores a JSON result, and fails the first attempt of every number
# ending in 7, so that the quick start shows a failure, `retry` and `--retries` at work.
set -eu
n=$1
sleep 0.01
case "$n" in
*7)
    if [ "$STATEQUEUE_ATTEMPT" = 1 ]; then
        echo "item $n: the first attempt fails, on purpose" >&2
        exit 1
    fi
    ;;
esac
printf '{"square": %d}\n' $((n * n)) >"$STATEQUEUE_RESULT"
