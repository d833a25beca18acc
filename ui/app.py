"""The dashboard's entrypoint: the shared sidebar (run, comparison run, step range, live refresh)
and the router over the pages in `views/`. Start it with `rltrace ui RUN_DIR [RUN_DIR ...]`."""

from __future__ import annotations

import time

import streamlit as st

from rltrace.analysis import _format as fmt
from rltrace.store import CorruptPartError, StoreError, read_manifest
from rltrace.ui import data, runs, state, style

LIVE_REFRESH_S = 5  # how often a live run is checked for new parts
IN_FULL_RUN = "_in_full_run"  # True while the whole script runs, False while only a fragment does

# An emoji: the browser draws it itself. A :material/...: page icon is fetched from a public font
# host on every page load (the other icons come with Streamlit's own font, served from here).
st.set_page_config(page_title="rltrace", page_icon="📈", layout="wide")


def _valid_runs() -> list[str]:
    good = []
    for path in runs.run_dirs():
        try:
            read_manifest(path)
            good.append(path)
        except StoreError as exc:
            st.error(f"Cannot show {fmt.md(path)}: {fmt.md(exc)}")
    return good


def _pin(paths: list[str]) -> None:
    versions = st.session_state.setdefault(state.VERSIONS, {})
    for path in paths:
        versions.setdefault(path, runs.fingerprint(path))


def _reload(paths: list[str]) -> bool:
    """Move every run to the version of its files now; True if any changed."""
    versions = st.session_state[state.VERSIONS]
    changed = False
    for path in paths:
        now = runs.fingerprint(path)
        changed |= versions[path] != now
        versions[path] = now
    return changed


def _follow_live(paths: list[str]) -> list[str]:
    """Runs still being written; each full script run shows their files as they are now."""
    live = [p for p in paths if data.is_live(data.info(state.ref(p)), time.time_ns())]
    _reload(live)
    return live


@st.fragment(run_every=LIVE_REFRESH_S)
def _live_watch(paths: list[str], names: list[str]) -> None:
    """Every LIVE_REFRESH_S, rerun the page if a live run has new files (not during a full run:
    `_follow_live` already moved it on, and a rerun there would never end)."""
    st.caption(f":red[●] {fmt.md(', '.join(names))} {'is' if len(names) == 1 else 'are'} still being written: "
               f"checking for new steps every {LIVE_REFRESH_S} s")
    if not st.session_state.get(IN_FULL_RUN) and _reload(paths):
        st.rerun()


def _step_range(info: dict) -> None:
    first, last = info["first_step"], info["last_step"]
    if first is None:
        st.session_state[state.STEPS] = None
        st.sidebar.caption("No steps recorded yet.")
        return
    if first == last:
        st.session_state[state.STEPS] = (first, last)
        st.sidebar.caption(f"Step {first} (the only step so far)")
        return
    previous, bounds = st.session_state.get("step_range"), st.session_state.get("_step_bounds")
    if previous is None or bounds is None or st.session_state.get("_steps_of") != info["path"]:
        value = (first, last)
    else:
        a, b = previous
        b = last if b == bounds[1] else b  # a range that ended at the latest step follows new steps
        a, b = max(first, min(a, last)), max(first, min(b, last))
        value = (a, b) if a <= b else (first, last)
    st.session_state["step_range"] = value
    picked = st.sidebar.slider("Steps", first, last, key="step_range", help="every page shows these steps (inclusive)")
    st.session_state[state.STEPS] = (int(picked[0]), int(picked[1]))
    st.session_state["_step_bounds"] = (first, last)
    st.session_state["_steps_of"] = info["path"]


def sidebar(paths: list[str]) -> None:
    live = _follow_live(paths)
    infos = {p: data.info(state.ref(p)) for p in paths}
    if live:
        with st.sidebar:
            _live_watch(live, [infos[p]["name"] for p in live])
    label = {p: style.run_label(infos[p]["name"], p) for p in paths}
    st.sidebar.selectbox("Run", paths, format_func=label.get, key=state.RUN, persist_state="session",
                         on_change=state.run_changed)
    others = [state.NO_RUN] + [p for p in paths if p != st.session_state[state.RUN]]
    if len(paths) > 1:
        if st.session_state.get(state.COMPARE) not in others:
            st.session_state[state.COMPARE] = others[1]
        st.sidebar.selectbox(
            "Compare with", others, format_func=lambda p: "— none —" if p == state.NO_RUN else label[p],
            key=state.COMPARE, persist_state="session", help="the run that Compare puts side by side and Reward & mismatch overlays",
        )
    else:
        st.session_state[state.COMPARE] = state.NO_RUN
    info = infos[st.session_state[state.RUN]]
    _step_range(info)
    with st.sidebar:
        if st.button("Reload", key="reload", icon=":material/refresh:", help="read the run's files again (new steps, compactions)"):
            if _reload(paths):
                st.rerun()
        st.caption(f"{style.plural(info['spans'], 'span')} · {style.plural(len(info['processes']), 'process', 'processes')}"
                   f" · read-only  \n{fmt.md(info['path'])}")


def skipped_parts(paths: list[str]) -> None:
    """Name every part left out as damaged (--skip-corrupt), after the page: it may have found some."""
    for path in paths:
        for skipped in runs.skipped_parts(state.ref(path)):
            st.sidebar.warning(f"Skipped an unreadable part: {fmt.md(skipped)}")


paths = _valid_runs()
if not paths:
    st.title("rltrace")
    st.info("No run to show. Start the dashboard with `rltrace ui RUN_DIR [RUN_DIR ...]`.")
    st.stop()
_pin(paths)
st.session_state[IN_FULL_RUN] = True
try:
    sidebar(paths)
    page = st.navigation(
        {
            "Run": [st.Page(state.PAGES["overview"], title="Overview", icon=":material/dashboard:", default=True)],
            "Where the time goes": [
                st.Page(state.PAGES["timeline"], title="Timeline", icon=":material/view_timeline:"),
                st.Page(state.PAGES["waits"], title="Waiting stages", icon=":material/hourglass_top:"),
                st.Page(state.PAGES["profiles"], title="Profiles", icon=":material/local_fire_department:"),
                st.Page(state.PAGES["engine"], title="Engine", icon=":material/dns:"),
            ],
            "What the model learned": [
                st.Page(state.PAGES["reward"], title="Reward & mismatch", icon=":material/show_chart:"),
                st.Page(state.PAGES["metrics"], title="Metrics", icon=":material/monitoring:"),
                st.Page(state.PAGES["batches"], title="Batches", icon=":material/data_table:"),
            ],
            "Side by side": [st.Page(state.PAGES["compare"], title="Compare", icon=":material/compare_arrows:"),
                             st.Page(state.PAGES["whatif"], title="What if", icon=":material/alt_route:")],
        }
    )
    page.run()
    skipped_parts(paths)
except CorruptPartError as exc:  # without --skip-corrupt: say which file, and how to go on without it
    st.error(f"A damaged part file stops this page: {fmt.md(exc)}  \nRestart the dashboard with "
             "`rltrace ui --skip-corrupt RUN_DIR` to leave damaged parts out (each is then named in the sidebar).")
finally:
    st.session_state[IN_FULL_RUN] = False
