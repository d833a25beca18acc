"""Batches: frozen batches (debug replay) with decoded text, bad-text flags and per-token log-probs."""

import streamlit as st

from rltrace.ui import data, state

run = state.selected()
st.title("Batches")
if not data.info(run)["batches"]:
    st.info("No frozen batches in this run — see docs/replay.md to enable freezing.")
    st.stop()
