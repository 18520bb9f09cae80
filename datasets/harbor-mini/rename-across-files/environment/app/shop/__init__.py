from shop.prices import calc_total

__all__ = ["calc_total"]
