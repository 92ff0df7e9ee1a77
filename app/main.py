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
from urllib.parse import urlparse

import streamlit as st

from app import alerts, display, gate, state
from storage import StorageError, masked_url

# a local icon: a Material icon as page_icon is fetched from fonts.gstatic.com by every browser
st.set_page_config(page_title="BASIS Lab", page_icon=str(Path(__file__).with_name("icon.png")), layout="wide")

if not gate.unlocked():
    st.stop()

def _home() -> None:
    """The address without a page (``/``, ``/home``) opens Runs; any other names no page
    (Streamlit falls back to this default one): said in one line, with the pages there are."""
    base = st.get_option("server.baseUrlPath").strip("/")
    path = urlparse(st.context.url or "").path.strip("/")
    asked = path[len(base):].strip("/") if base and path.startswith(base) else path
    if asked in ("", "home"):
        st.switch_page(runs_page)
    st.warning(display.plain(f"There is no page {asked!r}; the pages are "
                             + ", ".join(f"/{p.url_path} ({p.title})" for p in shown_pages) + "."),
               icon=":material/link_off:")
    for p in shown_pages:
        st.page_link(p, label=p.title, icon=p.icon)


runs_page = st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", url_path="runs")
diagnosis_page = st.Page("views/diagnosis.py", title="Diagnosis", icon=":material/query_stats:", url_path="diagnosis")
shown_pages = [
    st.Page("views/launch.py", title="Launch", icon=":material/rocket_launch:", url_path="launch"),
    runs_page,
    st.Page("views/compare.py", title="Compare", icon=":material/monitoring:", url_path="compare"),
    st.Page("views/detail.py", title="Run detail", icon=":material/description:", url_path="detail"),
    diagnosis_page,
    st.Page("views/report.py", title="Report", icon=":material/summarize:", url_path="report"),
]
page = st.navigation([
    st.Page(_home, title="Home", url_path="home", default=True, visibility="hidden"),
    *shown_pages,
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
