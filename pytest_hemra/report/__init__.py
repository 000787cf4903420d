"""Reports: statistics, fairness flags, tables and formats, run comparison, CI gates."""

FORMATS = ("text", "markdown", "csv", "json", "html")  # here so `hemra --help` needn't load them
SLOW_BUILD_SECS = 120.0  # `hemra check`: an image build past this is slow (report.health)
