from shop.prices import calc_total


def receipt(items: list[tuple[str, float, int]]) -> str:
    lines = [f"{name} x{quantity}" for name, _, quantity in items]
    return "\n".join([*lines, f"total {calc_total(items):.2f}"])
