#!/bin/bash
# Harbor verifier: reward 1 when every test passes, else 0.
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_config.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
