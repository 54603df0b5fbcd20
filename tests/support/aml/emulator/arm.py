"""Azure Resource Manager's front door: bearer-token checks (401), RBAC (403), the error
envelope and its texts, request ids. Error codes and messages are ARM's public ones
(learn.microsoft.com "Troubleshoot common Azure deployment errors", ARM throttling docs).
"""
from __future__ import annotations

import datetime as dt
import fnmatch
import json
import time
import uuid
from http import HTTPStatus

from aiohttp import web

from .tokens import verify

LOGIN = 'Bearer authorization_uri="https://login.windows.net/", error="invalid_token", error_description="{}"'

# Built-in roles, actions as in their definitions (the AzureML ones abridged to what matters here).
ROLES: dict[str, tuple[list[str], list[str]]] = {
    "Owner": (["*"], []),
    "Contributor": (["*"], ["Microsoft.Authorization/*/Delete", "Microsoft.Authorization/*/Write"]),
    "Reader": (["*/read"], []),
    "AzureML Data Scientist": (
        ["Microsoft.MachineLearningServices/workspaces/*/read", "Microsoft.MachineLearningServices/workspaces/*/action",
         "Microsoft.MachineLearningServices/workspaces/*/delete", "Microsoft.MachineLearningServices/workspaces/*/write"],
        ["Microsoft.MachineLearningServices/workspaces/delete", "Microsoft.MachineLearningServices/workspaces/write",
         "Microsoft.MachineLearningServices/workspaces/computes/*/write",
         "Microsoft.MachineLearningServices/workspaces/computes/*/delete",
         "Microsoft.MachineLearningServices/workspaces/computes/listKeys/action",
         "Microsoft.MachineLearningServices/workspaces/listKeys/action"]),
    "AzureML Compute Operator": (["Microsoft.MachineLearningServices/workspaces/computes/*"], []),
}


class ArmError(Exception):
    def __init__(self, status: int, code: str, message: str, headers: dict | None = None, **extra):
        super().__init__(message)
        self.status, self.code, self.message, self.headers, self.extra = status, code, message, headers or {}, extra

    def response(self, request_id: str) -> web.Response:
        body = {"error": {"code": self.code, "message": self.message, **self.extra}}
        return web.Response(status=self.status, text=json.dumps(body), content_type="application/json",
                            charset="utf-8", headers={**self.headers, "x-ms-request-id": request_id})


def user_error(status: int, message: str) -> ArmError:
    """The Azure ML service's own errors (code UserError, as the CLI/SDK show them)."""
    return ArmError(status, "UserError", message, details=[], additionalInfo=[])


def fault_error(status: int, subscription: str, actor: str, retry_after: int | None, message: str | None) -> ArmError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
    if status == 429:
        n = retry_after if retry_after is not None else 5
        return ArmError(429, "SubscriptionRequestsThrottled", message or (
            f"Number of 'read' requests for subscription '{subscription}' actor '{actor}' exceeded. Please try again "
            f"after '{n}' seconds after additional tokens are available. Refer to https://aka.ms/arm-throttling"),
            headers)
    codes = {500: ("InternalServerError", "Encountered internal server error. Diagnostic information: timestamp "
                   f"'{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}', subscription id '{subscription}', tracking id "
                   f"'{uuid.uuid4()}', request correlation id '{uuid.uuid4()}'."),
             502: ("BadGateway", "The gateway received an invalid response from the resource provider."),
             503: ("ServiceUnavailable", "The server (leased) is currently unable to handle the request due to a "
                   "temporary overloading or maintenance."),
             504: ("GatewayTimeout", "The gateway did not receive a response from 'Microsoft.MachineLearningServices' "
                   "within the specified time period.")}
    code, text = codes.get(status, (HTTPStatus(status).phrase.replace(" ", ""), HTTPStatus(status).phrase))
    return ArmError(status, code, message or text, headers)


def _allowed(roles: list[str], action: str) -> bool:
    for role in roles:
        actions, not_actions = ROLES.get(role, ([], []))
        if any(fnmatch.fnmatchcase(action.lower(), a.lower()) for a in actions) and not any(
                fnmatch.fnmatchcase(action.lower(), n.lower()) for n in not_actions):
            return True
    return False


class Gate:
    """Authentication and authorization for one emulated subscription."""

    def __init__(self, key: bytes, tenant: str, subscription: str, principals: dict[str, dict],
                 audiences: list[str]):
        self.key, self.tenant, self.subscription = key, tenant, subscription
        self.principals, self.audiences = principals, audiences
        self.revoked_at = 0.0  # tokens issued before this (epoch s) are refused: a revocation

    def authenticate(self, request: web.Request) -> dict:
        """The token's claims, or the 401 ARM answers."""
        header = request.headers.get("Authorization")
        if header is None:
            raise ArmError(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.",
                           {"WWW-Authenticate": LOGIN.format(
                               "The authentication failed because of missing 'Authorization' header.")})
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise ArmError(401, "AuthenticationFailedInvalidHeader",
                           "Authentication failed. The 'Authorization' header is provided in an invalid format.",
                           {"WWW-Authenticate": LOGIN.format(
                               "The authentication failed because of invalid 'Authorization' header.")})
        claims = verify(self.key, token.strip())
        if claims is None:
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.",
                           {"WWW-Authenticate": LOGIN.format("The access token is invalid.")})
        now = time.time()
        if claims.get("iat", 0) + 5 <= int(self.revoked_at):  # mint() back-dates iat by 5 s
            raise ArmError(401, "InvalidAuthenticationToken", "The access token is invalid.",
                           {"WWW-Authenticate": LOGIN.format("The access token is invalid.")})
        if claims.get("exp", 0) <= now:
            exp = dt.datetime.fromtimestamp(claims.get("exp", 0), dt.timezone.utc)
            cur = dt.datetime.now(dt.timezone.utc)
            fmt = "%-m/%-d/%Y %-I:%M:%S %p"
            raise ArmError(401, "ExpiredAuthenticationToken",
                           f"The access token expiry UTC time '{exp.strftime(fmt)}' is earlier than current UTC time "
                           f"'{cur.strftime(fmt)}'.",
                           {"WWW-Authenticate": LOGIN.format("The access token has expired.")})
        if claims.get("aud") not in self.audiences:
            allowed = ",".join(f"'{a}'" for a in self.audiences)
            raise ArmError(401, "InvalidAuthenticationTokenAudience",
                           f"The access token has been obtained for wrong audience or resource '{claims.get('aud')}'. "
                           f"It should exactly match with one of the allowed audiences {allowed}.",
                           {"WWW-Authenticate": LOGIN.format("The access token has been obtained for wrong audience.")})
        if claims.get("tid") != self.tenant:
            raise ArmError(401, "InvalidAuthenticationTokenTenant",
                           f"The access token is from the wrong issuer '{claims.get('iss')}'. It must match the tenant "
                           f"'https://sts.windows.net/{self.tenant}/' associated with this subscription. Please use the "
                           f"authority (URL) 'https://login.windows.net/{self.tenant}' to get the token. Note, if the "
                           "subscription is transferred to another tenant there is no impact to the services, but "
                           "information about new tenant could take time to propagate (up to an hour). If you just "
                           "transferred your subscription and see this error message, please try back later.",
                           {"WWW-Authenticate": LOGIN.format("The access token is from the wrong issuer.")})
        return claims

    def authorize(self, claims: dict, action: str, scope: str) -> None:
        """403 AuthorizationFailed naming the action and scope, as ARM does."""
        roles = self.principals.get(claims.get("oid", ""), {}).get("roles", [])
        if action == "*any*" and roles:
            return
        if not _allowed(roles, action):
            who = claims.get("upn") or claims.get("appid")
            raise ArmError(403, "AuthorizationFailed",
                           f"The client '{who}' with object id '{claims.get('oid')}' does not have authorization to "
                           f"perform action '{action}' over scope '{scope}' or the scope is invalid. If access was "
                           "recently granted, please refresh your credentials.")
