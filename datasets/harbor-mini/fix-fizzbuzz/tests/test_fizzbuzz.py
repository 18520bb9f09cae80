import sys

sys.path.insert(0, "/app")
from fizzbuzz import fizzbuzz


def test_words():
    assert [fizzbuzz(n) for n in (1, 3, 5, 15, 30, 7)] == ["1", "Fizz", "Buzz", "FizzBuzz", "FizzBuzz", "7"]
