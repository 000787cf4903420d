"""Reports: statistics, fairness flags, tables and formats, run comparison, CI gates."""

FORMATS = ("text", "markdown", "csv", "json", "html")  # here so `hemra --help` needn't load them
