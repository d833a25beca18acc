import sys

from rltrace.cli import main

sys.exit(main())
