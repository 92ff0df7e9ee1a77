"""Plain-Python foundations every layer shares: checks of values (``checks``), names of
choices (``choices``), presets as plain data (``presets``), paired statistics and verdict
words (``stats``), durations (``units``), plain user text (``text``), ``logging`` held down for
a block (``loggers``) and the estimator family as data (``estimators``). A constant or a rule
that two layers must agree on goes here, once. May import NumPy and SciPy, nothing else of
the engine."""
