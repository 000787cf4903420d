def slugify(title):
    """A URL slug: lowercase words of letters and digits joined by single hyphens."""
    raise NotImplementedError
