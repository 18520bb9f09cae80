"""The circuit breaker counts consecutive infrastructure errors only, and 0 never trips."""

from __future__ import annotations

from polar.rollout.breaker import CircuitBreaker


def test_the_breaker_counts_only_consecutive_errors():
    breaker = CircuitBreaker(3)
    for error in ("a", "b", None, "c", "d"):
        breaker.record(error)
    assert not breaker.tripped and breaker.consecutive == 2
    breaker.record("e")
    assert breaker.tripped and breaker.last_error == "e" and "3 rollouts in a row" in breaker.message(0)
    never = CircuitBreaker(0)
    for _ in range(100):
        never.record("x")
    assert not never.tripped
