#!/bin/bash
# Harbor verifier with named components in reward.json: the tests pass, and the old name is gone.
cd /app
tests=0
renamed=0
python3 -m pytest -q -p no:cacheprovider /tests/test_shop.py && tests=1
grep -rq 'calc_total' --include='*.py' /app || renamed=1
reward=$(( tests * renamed ))
printf '{"reward": %d, "tests": %d, "renamed": %d}\n' "$reward" "$tests" "$renamed" > /logs/verifier/reward.json
