"""An emulated AML workspace whose default datastore is a fresh Azurite container (account key):
the code-asset tests' setup (tests/aml/test_aml_code_asset.py, tests/security/test_shipped_code.py)."""
from __future__ import annotations

import uuid
from typing import Any

from tests.support.storage.fixtures import AZURITE_ACCOUNT, AZURITE_KEY


def new_container(endpoint: str) -> str:
    """A new blob container in Azurite, named as AML names its default one."""
    from azure.storage.blob import BlobServiceClient

    name = f"azureml-blobstore-{uuid.uuid4()}"
    BlobServiceClient(endpoint, credential={"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY}
                      ).create_container(name)
    return name


def code_asset_aml(aml_factory: Any, azurite: str, monkeypatch: Any, container: str = "", **emulator: Any) -> Any:
    """An emulated workspace whose default datastore is Azurite (account key), its variables set
    (logged in as its 'default' principal); `emulator`: more of start_aml's options (principals)."""
    from tests.support.aml.fixtures import AZURE_IDENTITY_VARS

    container = container or new_container(azurite)
    aml = aml_factory(datastore={"name": "workspaceblobstore", "accountName": AZURITE_ACCOUNT,
                                 "containerName": container, "blobEndpoint": azurite, "secretsType": "AccountKey",
                                 "key": AZURITE_KEY, "sasToken": ""}, **emulator)
    for var in AZURE_IDENTITY_VARS:
        monkeypatch.delenv(var, raising=False)
    for k, v in aml.env().items():
        monkeypatch.setenv(k, v)
    return aml
