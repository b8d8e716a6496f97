"""The chaos suite: fault scenarios as data (``chaos/scenarios/*.yaml``) and one runner."""
