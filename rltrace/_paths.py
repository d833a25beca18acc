"""Input paths as users give them: files named, or found by searching folders recursively."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable


def expand(paths: Iterable, keep: Callable[[Path], bool], error: type[Exception], none_found: str) -> list[Path]:
    """Files named in `paths`, plus the files under each folder for which `keep` holds (sorted).

    A path that does not exist, or nothing found at all, raises `error` with a one-line message
    (`none_found` names what was looked for, e.g. "no .pt files").
    """
    paths = list(paths)
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(x for x in p.rglob("*") if x.is_file() and keep(x))
        elif p.is_file():
            found.append(p)
        else:
            raise error(missing(p))
    if not found:
        raise error(f"{none_found} in {', '.join(map(str, paths))}")
    return found


def missing(path: Path) -> str:
    """Why `path` is not a file rltrace can read, in one line: it does not exist, or it is a FIFO,
    a socket or a device (reading one would block or never end)."""
    import stat

    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return f"{path}: no such file or directory"
    for test, kind in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return f"{path} is {kind}, not a regular file: write what it carries to a file and pass that"
    return f"{path}: not a regular file or directory"
