#!/usr/bin/env bash
# Size limits the project keeps: no source file of the service over 600
# lines (a file that grows past it holds more than one job: split it by
# audience or by layer), and the README at most 400 lines (detail goes to
# docs/). Prints each file over its limit and fails.
set -euo pipefail
cd "$(dirname "$0")/.."
over=0
while IFS= read -r f; do
  n=$(wc -l < "$f")
  if (( n > 600 )); then
    echo "$f: $n lines (at most 600)"
    over=1
  fi
done < <(find service/src -name '*.rs')
n=$(wc -l < README.md)
if (( n > 400 )); then
  echo "README.md: $n lines (at most 400; move detail to docs/)"
  over=1
fi
exit $over
