import re


def parse_duration(text):
    """Seconds in a duration like "2h", "45m", "1h30m" or "1h30m15s"."""
    match = re.match(r"(\d+)([hms])", text)
    number, unit = match.groups()
    return int(number) * {"h": 3600, "m": 60, "s": 1}[unit]
