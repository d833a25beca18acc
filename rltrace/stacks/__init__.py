"""When a run hangs: every process's Python stacks, without ptrace, and the blocking edge named.

Each traced process runs a small stack thread (`capture`) that dumps all its threads' stacks,
with the open spans of each, into the run's `stacks` table when its innermost open work passes
the hang limit (`RLTRACE_STACKS_AFTER`, else `RLTRACE_HANG_TIMEOUT`, else 300 s) and whenever
`rltrace stacks RUN` (or `rltrace watch` on a hang) writes a request into the run. `edges` reads
the latest stacks, the open spans and which processes live, and says who waits on whom and on
what. `RLTRACE_STACKS=0` turns the thread off. See docs/hangs.md.
"""

from rltrace.stacks.capture import StackThread, ask, start
from rltrace.stacks.blocking import Edge, edges, latest
from rltrace.stacks.known import Blocked, classify

__all__ = ["StackThread", "start", "ask", "Edge", "edges", "latest", "Blocked", "classify"]
