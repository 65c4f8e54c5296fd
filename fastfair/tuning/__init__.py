"""``fastfair tune``: each method's front of average vs worst-class robust accuracy, found with Optuna (issue 51).

:mod:`.space` holds the search spaces, read from the keys the methods and options declare.
"""
