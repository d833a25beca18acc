"""Property: whatever a caller passes to `phase`, `log_samples`, `log_metrics` and `freeze`, every
row it gave is either stored or counted as dropped with a reason, and the run always reads.

A call that raises (a user mistake at the call site, e.g. a non-numeric metric) gave nothing."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rltrace
from rltrace import store
from rltrace.cli.info import collect

texts = st.text(alphabet=st.characters(codec=None, exclude_categories=()), max_size=12)  # surrogates included
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=True, allow_infinity=True), texts
)
values = st.one_of(scalars, st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=3))
column_names = st.one_of(
    st.sampled_from(["sample_id", "group_id", "response_len", "prompt_len", "reward", "finish_reason", "weight_version",
                     "train_version", "gen_start", "tag", "uid"]),
    texts.filter(lambda t: t and t not in ("step", "logged_ns", "process_id", "role", "rank", "host", "pid")),
)
sample_rows = st.lists(st.dictionaries(column_names, values, max_size=4), max_size=6)
attributes = st.dictionaries(texts.filter(lambda k: k and k not in ("step", "weight_version")), values, max_size=6)
metrics = st.dictionaries(texts.filter(bool), st.one_of(st.floats(), st.integers(min_value=-(2**80), max_value=2**80), texts), max_size=4)
freeze_rows = st.lists(
    st.fixed_dictionaries({}, optional={"sample_id": values, "reward": scalars, "response_text": texts, "prompt_tokens": st.lists(st.integers(0, 2**40), max_size=3)}),
    min_size=1, max_size=4,
)


def _call(fn, *args, **kwargs) -> bool:
    """True if the call was accepted (it gave rows), False if it refused them as a user mistake."""
    try:
        result = fn(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return result is not False


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(attrs=attributes, rows=sample_rows, scalars_=metrics, frozen=freeze_rows, set_attrs=attributes)
def test_every_row_is_stored_or_dropped_with_a_reason(attrs, rows, scalars_, frozen, set_attrs):
    from rltrace import replay

    run_dir = Path(tempfile.mkdtemp()) / "run"
    try:
        rltrace.init(run_dir)
        spans_given = 0
        try:
            with rltrace.phase("train", step=1, **attrs) as p:
                p.set(**set_attrs)
            spans_given = 1
        except (TypeError, ValueError):
            pass
        samples_given = len(rows) if _call(rltrace.log_samples, 1, rows) else 0
        metrics_given = len(scalars_) if _call(rltrace.log_metrics, 1, **scalars_) else 0
        frozen_given = len(frozen) if _call(replay.freeze, 1, frozen) else 0
        replay.flush()
        rltrace.shutdown()

        info = collect(str(run_dir))  # the run always reads
        dropped: dict[str, int] = {}
        for r in info["drop_reasons"]:
            assert r["reason"], r
            dropped[r["table"]] = dropped.get(r["table"], 0) + r["count"]
        con = store.open(run_dir)

        def stored(sql: str) -> int:
            return con.execute(sql).fetchall()[0][0]

        assert stored("SELECT count(*) FROM spans") + dropped.get("spans", 0) == spans_given
        assert info["spans_dropped"] == dropped.get("spans", 0)
        assert stored("SELECT count(*) FROM samples") + dropped.get("samples", 0) == samples_given
        assert stored("SELECT count(*) FROM metrics WHERE name NOT LIKE 'replay_%'") + dropped.get("metrics", 0) == metrics_given
        assert info["rows_dropped"] == dropped.get("samples", 0) + dropped.get("metrics", 0)
        assert stored("SELECT count(*) FROM batches") + dropped.get("batches", 0) == frozen_given
        if spans_given:  # rltrace's own columns survive any attributes
            assert con.execute("SELECT phase, step FROM spans").fetchall() == [("train", 1)]
    finally:
        rltrace.shutdown()
        shutil.rmtree(run_dir.parent, ignore_errors=True)
