"""The dashboard: Streamlit over DuckDB."""
