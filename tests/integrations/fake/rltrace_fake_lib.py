"""A library that knows nothing of rltrace; the fake instrumentor patches `work`."""


def work(n: int) -> int:
    if n < 0:
        raise RuntimeError("negative work")
    return 2 * n
