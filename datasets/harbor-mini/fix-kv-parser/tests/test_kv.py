import sys

sys.path.insert(0, "/app")
from kv import parse


def test_simple():
    assert parse("a=1;b=2") == {"a": "1", "b": "2"}


def test_spaces_and_empty_items():
    assert parse("a=1; b = 2;") == {"a": "1", "b": "2"}
    assert parse("") == {}
