"""``fastfair tune``: each method's front of average vs worst-class robust accuracy, found with Optuna (issue 51;
docs/tune.md).

:mod:`.space` holds the search spaces, read from the keys the methods and options declare; :mod:`.front` the fronts,
the rule that picks a point and the comparison; :mod:`.study` the study that runs the trials.
"""
