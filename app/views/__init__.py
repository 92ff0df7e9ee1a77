"""The dashboard's pages, one script each, run top to bottom on every rerun: ``runs`` (every run,
live), ``launch`` (the sweep and tuning form), ``compare`` (charts and Table 3 of the selected
runs), ``detail`` (one run), ``diagnosis`` (estimator diagnoses), ``report`` (stored reports).
A new page is a script here and its line in ``app/main.py``; what it shares with other pages
goes in ``app``."""
