"""The suites of ``bench.run``, one a file; ``_context`` holds what they share."""
