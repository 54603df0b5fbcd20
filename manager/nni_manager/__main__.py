"""`python -m nni_manager` = the `nni-manager` command."""
import sys

from nni_manager.cli import main

sys.exit(main())
