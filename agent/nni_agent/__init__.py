"""nni-agent: the trial keeper that runs on each worker.

Besides the agent itself, this package carries a tiny dependency-free trial API with
NNI's names, for trial code that does not install `nni`::

    from nni_agent import get_next_parameter, report_intermediate_result, report_final_result
"""

__version__ = "0.1.0"

from nni_agent import trial_api  # noqa: E402  (re-export after __version__)
from nni_agent.trial_api import *  # noqa: E402,F401,F403

__all__ = ["__version__"]
__all__ += trial_api.__all__
