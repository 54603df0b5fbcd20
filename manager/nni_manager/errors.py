"""Errors of NNI's TrainingService API, one type to catch (`TrainingServiceError`).

NNI's manager answers a bad request (an unknown trial, a missing file) with an Error whose
message the REST server passes on; here each case is its own subclass so callers can tell
them apart, and each also derives from the builtin a Python caller would expect (an
unknown trial is a `KeyError`, a missing file a `FileNotFoundError`), so code written
before these types existed keeps working.
"""
from __future__ import annotations


class TrainingServiceError(Exception):
    """A request to the training service that cannot be served; the message says why and
    what to do."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else self.__class__.__name__


class TrialNotFoundError(TrainingServiceError, KeyError):
    """No trial with that id in this experiment."""


class TrialFileNotFoundError(TrainingServiceError, FileNotFoundError):
    """The trial's directory has no such file (or the trial never got a directory)."""


class TrialFileNotAllowedError(TrainingServiceError, PermissionError):
    """The name leaves the trial's directory (absolute, `..`, a symlink pointing outside)."""


class TrialFileTooLargeError(TrainingServiceError):
    """The file (or directory) is larger than the limit asked for."""


class AgentUnavailableError(TrainingServiceError, ConnectionError):
    """The agent that ran the trial is not connected (gone, lost, or never started), or it is
    too old to answer this request."""


class TrialExistsError(TrainingServiceError, ValueError):
    """A trial with that id was submitted already."""


class ClusterMetadataNotFoundError(TrainingServiceError, KeyError):
    """No cluster metadata under that key (NNI's getClusterMetadata)."""
