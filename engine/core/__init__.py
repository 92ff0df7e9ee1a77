"""Plain-Python foundations: checks of values, names of choices, presets as plain data, paired statistics. May import NumPy and SciPy, nothing else of the engine."""
