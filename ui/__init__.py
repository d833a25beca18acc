"""The dashboard: Streamlit over DuckDB (issue 7)."""
