"""`python -m nni_agent` is `nni-agent`."""
import sys

from nni_agent.cli import main

sys.exit(main())
