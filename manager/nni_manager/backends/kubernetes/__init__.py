"""Kubernetes platforms: plain pods (ours), Kubeflow TFJob / PyTorchJob, FrameworkController.

common.py   the base of the platforms: pod events -> trial messages, re-attach, cleanup, dry run
objects.py  the objects built without a cluster: an environment's Secret and pods, the agent wheel
            ConfigMap, the image pull Secret, the probe pod
hub_relay.py  the hub relay's objects made, re-created when evicted, deleted at stop (tunnel.py: streams)
client.py   the official asyncio client: credentials (renewed), retries of transient errors, one-line errors
access.py   every verb the experiment needs, asked at start (SelfSubjectAccessReview)
starting.py why an environment has no running pod yet (object conditions, the watched Warning events)
main_objects.py  an environment's main object (Pod or custom object) through one set of calls
tracking.py pod events -> trial messages; why environments wait, from what the watches saw (jobs.py: the start deadline)
watch.py    list once, then watch with bookmarks (resumed; re-listed on 410): the experiment's pods, the
            namespace's events; a pod's state in the cluster's words
nodes.py    a request no present node holds: said while its pod waits (autoscalers add nodes)
probe.py    the image probe pod (deps.py): waits through a long pull or a node being made, up to the start deadline
config.py   the platforms' config fields (NNI's, v1 spellings too)
framework_template.py   FrameworkController's v1 `configPath`: a Framework YAML as every trial's template
boot.py     the container command that unpacks the manager's agent wheel and starts it
pods.py, kubeflow.py, frameworkcontroller.py   one main object per environment each
"""
