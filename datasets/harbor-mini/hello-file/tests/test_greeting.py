from pathlib import Path


def test_greeting():
    assert Path("/app/greeting.txt").read_text() == "hello, polar\n"
