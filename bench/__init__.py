"""Hearth benchmark harness: runs Hearth and peer servers side by side and reports ratios."""
