"""The Streamlit dashboard (``app/main.py``: ``make run``, ``basis-lab-dashboard``): pages in
``app.views``, one module a page, and beside them what pages share: the process's store and job
manager and per-session state (``state``), URL state (``viewstate``), the Launch form generated
from the run schema (``form``, ``tuning_launch``), Compare's parts (``compare_table``,
``metric_charts``, ``differences``, ``tuning_view``), the Runs page's tables and scatter
(``tables``, ``scatter``), Run detail's files (``runfiles``), confirmations (``confirm``),
dressing (``display``, ``text``), alerts, the password gate (``gate``) and the Slurm panel
(``slurm_panel``). A page's layout goes in its view; a piece two pages draw goes here; a number
or a table the CLI prints too goes in ``engine`` (``engine.analysis`` or ``engine.reads``), never
here. May import ``engine`` and ``storage``; neither imports ``app``."""
