"""Profiles: py-spy and torch.profiler captures attached to slow spans, with their top frames."""

import streamlit as st

from rltrace.ui import data, state

run = state.selected()
st.title("Profiles")
if not data.info(run)["profiles"]:
    st.info("No profiles in this run — see docs/profiling.md to capture py-spy or torch.profiler on slow phases.")
    st.stop()
