"""A blocking edge on a page (Overview, Timeline): the sentence, and the thread's stack one click away."""

from __future__ import annotations

import streamlit as st

from rltrace.analysis import _format as fmt


def show(edge: dict, key: str) -> None:
    """The edge of the report's `blocking` list (`rltrace.stacks`), its stack in an expander."""
    st.warning(fmt.md(edge["text"]), icon=":material/block:")
    with st.expander(f"Stack of {fmt.md(edge['who'])}, innermost call last", key=key):
        st.code("\n".join(reversed(edge.get("stack") or [])), language=None)


def of_span(report: dict, span_id: str | None) -> dict | None:
    """The edge of the thread whose innermost open span is `span_id`, if the report has one."""
    return next((e for e in report.get("blocking") or [] if e["span_id"] == span_id), None)
