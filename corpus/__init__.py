"""Real-document training and evaluation data from Debian's documentation packages."""
