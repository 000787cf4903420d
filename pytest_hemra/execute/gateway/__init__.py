"""HEMRA's model gateway: every model call of every trial passes here and is counted."""
