"""The workspace's default datastore and its code assets, as AML's v2 REST API serves them.

A datastore is an Azure Blob container of a storage account the emulator is given (Azurite in
tests: `blobEndpoint` is where the emulator itself reaches it); `listSecrets` returns its account
key or SAS token in the real shape. An identity-based datastore (`secretsType: None`: AML's
`credentials: {credentialsType: None}`, what `systemDatastoresAuthMode: identity` creates) keeps no
credential: listSecrets has nothing to give, and callers reach the account with their own Azure AD
token, which storage_front.py checks for a Storage Blob Data role as Azure Storage does. A code version names a blob folder (`codeUri`, the account's
canonical `https://{account}.blob.{endpoint}/{container}/{path}`); a job that references it by
`codeId` gets that folder's blobs downloaded into its working directory before its command runs,
as AML's runtime does.
"""
from __future__ import annotations

import re
from pathlib import Path

from .arm import user_error

CODE_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9\-_.]{0,254}$")
UPDATABLE = {"description", "tags", "properties", "isArchived"}


class Datastore:
    """One AzureBlob datastore (the workspace's default, `workspaceblobstore`)."""

    def __init__(self, cfg: dict):
        self.name: str = cfg.get("name", "workspaceblobstore")
        self.account: str = cfg["accountName"]
        self.container: str = cfg["containerName"]
        self.endpoint: str = cfg.get("endpoint", "core.windows.net")
        self.protocol: str = cfg.get("protocol", "https")
        self.secrets_type: str = cfg.get("secretsType", "AccountKey")  # or Sas, or None (identity-based)
        self.key: str = cfg.get("key", "")  # identity-based: the key the emulated runtime itself uses
        self.sas: str = cfg.get("sasToken", "")
        self.blob_endpoint: str = cfg["blobEndpoint"]  # where the emulator reaches the account (Azurite)
        self.blob_ca_file: str | None = cfg.get("blobCaFile")  # Azurite's CA when it serves HTTPS

    @property
    def identity_based(self) -> bool:
        return self.secrets_type == "None"

    @property
    def canonical(self) -> str:
        """The container's URL as Azure names it (what codeUri holds)."""
        return f"{self.protocol}://{self.account}.blob.{self.endpoint}/{self.container}"

    def resource(self, base: str, system_data: dict) -> dict:
        creds = {"credentialsType": self.secrets_type if self.secrets_type in ("AccountKey", "None") else "Sas"}
        return {"id": f"{base}/datastores/{self.name}", "name": self.name,
                "type": "Microsoft.MachineLearningServices/workspaces/datastores",
                "properties": {"datastoreType": "AzureBlob", "accountName": self.account,
                               "containerName": self.container, "endpoint": self.endpoint,
                               "protocol": self.protocol, "credentials": creds, "isDefault": True,
                               "serviceDataAccessAuthIdentity": "WorkspaceSystemAssignedIdentity",
                               "description": "", "tags": {}, "properties": {}},
                "systemData": system_data}

    def secrets(self) -> dict:
        if self.identity_based:  # NoneDatastoreCredentials hold no secret (message: the emulator's wording)
            raise user_error(400, f"Datastore {self.name} uses credentials of type None: it has no secrets.")
        if self.secrets_type == "AccountKey":
            return {"secretsType": "AccountKey", "key": self.key}
        return {"secretsType": "Sas", "sasToken": self.sas}

    def prefix_of(self, code_uri: str) -> str | None:
        """The blob folder a codeUri names in this datastore's container, or None."""
        base = self.canonical.lower() + "/"
        if not code_uri.lower().startswith(base):
            return None
        return code_uri[len(base):].strip("/")

    def download(self, prefix: str, dest: Path) -> int:
        """The folder's blobs into dest (relative paths kept); the number of files."""
        from azure.storage.blob import ContainerClient

        cred = ({"account_name": self.account, "account_key": self.key} if self.secrets_type in ("AccountKey", "None")
                else self.sas)
        n = 0
        verify = {"connection_verify": self.blob_ca_file} if self.blob_ca_file else {}
        with ContainerClient(self.blob_endpoint, self.container, credential=cred, **verify) as cc:
            for blob in cc.list_blobs(name_starts_with=prefix + "/"):
                rel = blob.name[len(prefix) + 1:]
                target = (dest / rel).resolve()
                if dest.resolve() not in target.parents:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as f:
                    cc.download_blob(blob.name).readinto(f)
                n += 1
        return n


def validate_code_version(name: str, body: dict) -> dict:
    if not CODE_NAME_RE.match(name):
        raise user_error(400, f"Invalid asset name '{name}'.")
    props = body.get("properties") if isinstance(body, dict) else None
    if not isinstance(props, dict):
        raise user_error(400, "The request body must contain 'properties'.")
    uri = props.get("codeUri")
    if not isinstance(uri, str) or not uri:
        raise user_error(400, "The CodeUri field is required.")
    return props
