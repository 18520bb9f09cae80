def parse(text: str) -> dict[str, str]:
    """'a=1;b=2' -> {'a': '1', 'b': '2'}."""
    result = {}
    for item in text.split(";"):
        key, value = item.split("=")
        result[key] = value
    return result
