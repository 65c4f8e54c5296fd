"""fastfair tune: search spaces, studies and the fronts they find (docs/tune.md)."""
