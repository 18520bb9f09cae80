import json
from pathlib import Path


def test_config():
    config = json.loads(Path("/app/config.json").read_text())
    assert config == {"name": "svc", "debug": False, "port": 8080, "hosts": ["a", "b"]}
