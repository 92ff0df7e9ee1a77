"""BASIS Lab dashboard. Start it from the repository root with ``streamlit run app/main.py``.

Pages: Launch (a sweep form), Runs (every run in the database, and the workers),
Compare (live charts and the paper's Table 3 for the selected runs), Run detail,
Diagnosis (bias, variance and MSE of the dW estimators) and Report (a sweep's report:
setup, Table 3, the paper's claims with verdicts, figures; HTML and Markdown downloads). Training happens in the job
manager's worker threads (or in ``python -m engine worker`` processes), which write
to the database; the pages only read it.

With ``BASIS_LAB_PASSWORD`` set, every page sits behind a password (``app.gate``).
"""

from pathlib import Path

import streamlit as st

from app import alerts, display, gate, state
from storage import StorageError, masked_url

# a local icon: a Material icon as page_icon is fetched from fonts.gstatic.com by every browser
st.set_page_config(page_title="BASIS Lab", page_icon=str(Path(__file__).with_name("icon.png")), layout="wide")

if not gate.unlocked():
    st.stop()

runs_page = st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", url_path="runs")
diagnosis_page = st.Page("views/diagnosis.py", title="Diagnosis", icon=":material/query_stats:", url_path="diagnosis")
page = st.navigation([
    st.Page(lambda: st.switch_page(runs_page), title="Home", url_path="home", default=True, visibility="hidden"),
    st.Page("views/launch.py", title="Launch", icon=":material/rocket_launch:", url_path="launch"),
    runs_page,
    st.Page("views/compare.py", title="Compare", icon=":material/monitoring:", url_path="compare"),
    st.Page("views/detail.py", title="Run detail", icon=":material/description:", url_path="detail"),
    diagnosis_page,
    st.Page("views/report.py", title="Report", icon=":material/summarize:", url_path="report"),
    # the Diagnosis page's address before it was renamed, so old links and bookmarks still lead to it
    st.Page(lambda: st.switch_page(diagnosis_page), title="Estimators", url_path="estimators", visibility="hidden"),
])

with st.sidebar:
    st.markdown("### :material/science: BASIS Lab")
    st.caption("Sketched-backprop training runs: launch, watch, compare.")
    st.toggle("Pause live updates", key=state.PAUSED, help="Stop the charts and tables from refreshing while you read them.")
    st.radio("Chart downloads", display.IMAGE_FORMATS, horizontal=True, key=display.IMAGE_FORMAT,
             help="The format of the camera button in every chart's toolbar.")
    st.caption(display.plain(f"Database: {masked_url(state.db_url())}"), help="Set BASIS_LAB_DB_URL before starting the app to use another database.")
    gate.logout_button()

try:
    state.lab()
except StorageError as e:
    st.error(display.plain(f"The database cannot be opened: {e}"))
    st.stop()

with st.sidebar:
    alerts.watcher(state.lab().store)  # a failed run raises a toast on every page (app.alerts)
state.guarded(page.run)()
