"""BASIS Lab dashboard. Start it from the repository root with ``streamlit run app/main.py``.

Pages: Launch (a sweep form), Runs (every run in the database), Compare (live
charts and the paper's Table 3 for the selected runs) and Run detail. Training
happens in the job manager's worker threads, which write to the database; the
pages only read it.
"""

import streamlit as st

from app import state
from storage import StorageError

st.set_page_config(page_title="BASIS Lab", page_icon=":material/science:", layout="wide")

page = st.navigation([
    st.Page("views/launch.py", title="Launch", icon=":material/rocket_launch:"),
    st.Page("views/runs.py", title="Runs", icon=":material/table_rows:", default=True),
    st.Page("views/compare.py", title="Compare", icon=":material/monitoring:"),
    st.Page("views/detail.py", title="Run detail", icon=":material/description:"),
])

with st.sidebar:
    st.markdown("### :material/science: BASIS Lab")
    st.caption("Sketched-backprop training runs: launch, watch, compare.")
    st.toggle("Pause live updates", key=state.PAUSED, help="Stop the charts and tables from refreshing while you read them.")
    st.caption(f"Database: `{state.db_url()}`", help="Set BASIS_LAB_DB_URL before starting the app to use another database.")

state.keep_widget_state("launch.")
try:
    state.lab()
except StorageError as e:
    st.error(f"The database cannot be opened: {e}")
    st.stop()

state.guarded(page.run)()
