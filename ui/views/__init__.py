"""The dashboard's pages, run by `app.py` through st.navigation. (Not named `pages/`: Streamlit treats
a folder of that name next to the entrypoint as legacy auto-discovered pages, shows them before the
router runs, and AppTest then reruns a page without its entrypoint.)"""
