"""A stand-in for the Azure CLI's `az account get-access-token`, run by azure-identity's
AzureCliCredential (and so by DefaultAzureCredential) from PATH.

The "login" lives where the real CLI keeps it, in $AZURE_CONFIG_DIR (default ~/.azure): the
file emulator_profile.json names tenant, subscription, principal and the emulator's token
signing key. Output and error texts are the real CLI's, which azure-identity parses: the JSON
fields accessToken/expiresOn/expires_on/subscription/tenant/tokenType, and "az login" in
stderr for a missing login. It never touches the network.

Like the real CLI it is slow: each token takes the profile's `delay` (default 1 s, what
`az account get-access-token` costs in Python start-up and MSAL cache reads), so a client that
fetches a token per request pays for it; each call appends one line (the resource, never the
token) to the profile's `log_file`, so tests count invocations instead of timing them.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

from tests.support.aml.emulator.tokens import mint

PROFILE = "emulator_profile.json"


def _fail(message: str, code: int = 1) -> None:
    sys.stderr.write(message + "\n")
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--version"]:
        print("azure-cli                         2.67.0 (aml-emulator stand-in)")
        return
    if argv[:2] != ["account", "get-access-token"]:
        _fail(f"ERROR: 'az {' '.join(argv[:2])}' is not supported by the emulator's az stand-in.", 2)
    p = argparse.ArgumentParser(prog="az account get-access-token", add_help=False)
    p.add_argument("--output", "-o", default="json")
    p.add_argument("--resource")
    p.add_argument("--scope", nargs="*")
    p.add_argument("--tenant", "-t")
    p.add_argument("--subscription")
    args = p.parse_args(argv[2:])
    config_dir = Path(os.environ.get("AZURE_CONFIG_DIR") or Path.home() / ".azure")
    try:
        profile = json.loads((config_dir / PROFILE).read_text())
    except OSError:
        _fail("ERROR: Please run 'az login' to setup account.")
    if args.tenant and args.tenant != profile["tenant"]:
        _fail(f"ERROR: AADSTS90002: Tenant '{args.tenant}' not found. Check to make sure you have the correct "
              "tenant ID and are signing into the correct cloud.")
    resource = args.resource or (args.scope[0].removesuffix("/.default") if args.scope else
                                 "https://management.core.windows.net/")
    if profile.get("log_file"):
        with open(profile["log_file"], "a") as f:
            f.write(f"get-access-token {resource}\n")
    time.sleep(float(profile.get("delay", 1.0)))
    key = Path(profile["key_file"]).read_bytes()
    token, exp = mint(key, audience=resource, tenant=profile["tenant"], oid=profile["oid"],
                      upn=profile.get("upn"), lifetime=float(profile.get("lifetime", 3600)))
    local = dt.datetime.fromtimestamp(exp)           # the CLI prints a naive local time
    print(json.dumps({"accessToken": token, "expiresOn": local.strftime("%Y-%m-%d %H:%M:%S.%f"),
                      "expires_on": exp, "subscription": args.subscription or profile["subscription"],
                      "tenant": profile["tenant"], "tokenType": "Bearer"}, indent=2))


if __name__ == "__main__":
    main()
