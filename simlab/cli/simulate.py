"""``simlab simulate`` (filled in by the foundation work)."""
