"""GravityOCR."""
