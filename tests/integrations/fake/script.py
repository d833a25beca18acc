"""A program that never imports rltrace: it uses the fake library, in itself and in a child."""

import os
import subprocess
import sys

assert "rltrace.api" not in sys.modules, "start-up must not load rltrace's API before it is needed"
import rltrace_fake_lib  # noqa: E402

print("work", rltrace_fake_lib.work(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
if os.environ.get("FAKE_CHILD"):
    subprocess.run([sys.executable, "-c", "import rltrace_fake_lib; rltrace_fake_lib.work(1)"], check=True)
sys.exit(int(os.environ.get("FAKE_EXIT", "0")))
