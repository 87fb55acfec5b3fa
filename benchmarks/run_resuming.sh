#!/usr/bin/env bash
# Runs `python -m benchmarks.run ARGS --resume` until it completes or $DEADLINE seconds (default
# 480) have passed. A native crash inside a peer kills the process; the rerun records that peer's
# crash, runs the case again without it (see run.py --resume) and carries on with the rest.
deadline=$(( SECONDS + ${DEADLINE:-480} ))
while (( SECONDS < deadline )); do
  timeout $(( deadline - SECONDS )) python -m benchmarks.run "$@" --resume
  rc=$?
  (( rc == 0 || rc == 124 )) && exit $rc
  echo "benchmarks.run exited with $rc; resuming"
done
exit 124
