import sys

sys.path.insert(0, "/app")
from shop import compute_total
from shop.receipt import receipt


def test_total():
    assert compute_total([("pen", 1.5, 2), ("pad", 2.0, 1)]) == 5.0


def test_receipt():
    assert receipt([("pen", 1.5, 2)]).splitlines()[-1] == "total 3.00"
