def calc_total(items: list[tuple[str, float, int]]) -> float:
    """The total of (name, price, quantity) items."""
    return round(sum(price * quantity for _, price, quantity in items), 2)
