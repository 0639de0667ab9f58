"""The schema revisions, oldest first by their number."""
