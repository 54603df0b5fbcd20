"""The manager core: NNI's TrainingService over agents, split by job.

nni_api.py    TrainingService: NNI's API, lifecycle; the backend context and hub handler
trials.py     the trial table and the one place that changes a trial's status
agents.py     agents (tokens, what each is waiting for) and environments (agent groups)
capacity.py   elastic platforms: which environments to ask for and give back
hub_setup.py  where the hub listens and with which TLS material
"""
from nni_manager.service.nni_api import TrainingService, create_training_service, new_id

__all__ = ["TrainingService", "create_training_service", "new_id"]
