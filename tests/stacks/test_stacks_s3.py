"""`rltrace stacks` on a run in a bucket (moto's S3 server on loopback): the request is an object,
each process polls it from its stack thread and its answer goes up with its other parts."""

from __future__ import annotations

from rltrace.cli import main
from tests.stacks.test_hangs import _start, _until, procs  # noqa: F401
from tests.store.test_objstore import s3_run, s3_server  # noqa: F401


def test_a_process_writing_to_a_bucket_answers(s3_run, capsys, procs):  # noqa: F811
    uri, env, _ = s3_run
    proc = _start(uri, "queue", **{k: v for k, v in env.items() if k.startswith(("AWS_", "RLTRACE_"))})
    procs.append(proc)
    _until(proc, "HUNG")
    assert main(["stacks", uri, "--wait", "20"]) == 0
    out = capsys.readouterr().out
    assert "Asked 1 live process(es) for their stacks; 1 answered" in out, out
    assert " in queue.Queue.get in consume (rollout, step 0); no producer is alive" in out
