"""A minimal trainingService section per platform, for what `nni-manager run --dry-run` would submit."""
from __future__ import annotations

import hashlib

SECRET = "s3cr3t-agentenv-" + hashlib.sha256(b"nni-agent").hexdigest()[:12]
PLATFORMS = {
    "remote": {"machineList": [{"host": "127.0.0.1", "user": "u", "password": "pw"}]},
    "slurm": {"partition": "p", "nniManagerIp": "127.0.0.9"},
    "kubernetes": {"namespace": "default", "nniManagerIp": "127.0.0.9",
                   "podSpec": {"containers": [{"name": "trial", "image": "python:3.11"}]}},
    "kubeflow": {"operator": "tf-operator", "apiVersion": "v1", "nniManagerIp": "127.0.0.9",
                 "worker": {"replicas": 1, "command": "python3 t.py", "cpuNumber": 1, "memorySize": "1gb",
                            "gpuNumber": 0, "dockerImage": "python:3.11"}},
    "frameworkcontroller": {"nniManagerIp": "127.0.0.9", "taskRoles": [{
        "name": "worker", "taskNumber": 1, "command": "python3 t.py", "cpuNumber": 1, "memorySize": "1gb",
        "gpuNumber": 0, "dockerImage": "python:3.11",
        "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceededTaskCount": 1}}]},
    "openpai": {"host": "http://127.0.0.1:1", "username": "u", "token": "t", "nniManagerIp": "127.0.0.9",
                "trialCpuNumber": 1, "trialMemorySize": "1gb", "dockerImage": "python:3.11",
                "storageConfigName": "s"},
    "dlts": {"dashboard": "http://127.0.0.1:1/", "email": "a@b.c", "password": "p", "team": "t",
             "image": "python:3.11", "nniManagerIp": "127.0.0.9"},
    "aml": {"subscriptionId": "s", "resourceGroup": "r", "workspaceName": "w", "computeTarget": "c",
            "dockerImage": "python:3.11", "nniManagerIp": "127.0.0.9"},
    "dlc": {"image": "python:3.11", "podCount": 1, "ecsSpec": "ecs.c6.large", "region": "cn-hangzhou",
            "workspaceId": "ws", "nasDataSourceId": "d", "accessKeyId": "ak", "accessKeySecret": SECRET + "-ak",
            "localStorageMountPoint": "/home/admin/workspace/", "containerStorageMountPoint": "/root/data/",
            "nniManagerIp": "127.0.0.9"},
    "adl": {"image": "python:3.11", "nniManagerIp": "127.0.0.9"},
}
