from pathlib import Path


def test_errors():
    lines = Path("/app/errors.log").read_text().splitlines()
    assert lines == [
        "2026-01-01T10:00:01 ERROR cannot open /var/data",
        "2026-01-01T10:00:04 ERROR timeout after 30 s",
        "2026-01-01T10:00:06 ERROR disk full",
    ]
