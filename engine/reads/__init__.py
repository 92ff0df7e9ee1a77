"""What the lab reads from its database for people: run summaries and Table 3 (``queries``), the
reports built, stored and written from a selection of runs (``reports``), tuning campaigns as
stored (``campaigns``), step-time and grid estimates from finished runs (``estimates``) and a
campaign's plan before launch (``tuning_plan``). The CLI, the Python API and the dashboard's pages
read through here; a new query, table or report read goes here. Starts no job and trains nothing
(that is ``engine.runner``, which may call these reads); may import ``engine.analysis`` and below,
and ``storage``."""
