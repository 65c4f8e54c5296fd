"""``fastfair reproduce``: a paper's table re-run and set beside the paper's numbers.

``paper`` reads a preset's ``[paper]`` section, ``tables`` groups the presets into tables,
``runs`` expands a table into runs at a scale, ``verdict`` compares, ``write`` writes
the target's report ``<key>.md`` and its figure, ``cost`` estimates GPU hours, ``command`` ties them together.
"""
