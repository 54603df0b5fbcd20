"""Backends bootstrap agents somewhere and clean up; they never handle trials.

One module per platform behind the small interface in `base.py`. Backends never import
each other; `registry.py` maps an NNI `platform` name to a backend class lazily, so a
manager that only runs locally never imports paramiko or kubernetes.
"""
