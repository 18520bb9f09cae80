import json
from pathlib import Path


def test_totals():
    totals = json.loads(Path("/app/totals.json").read_text())
    assert totals == {"north": 12.5, "south": 6.5, "east": 7}
