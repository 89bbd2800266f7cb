"""The YARN ResourceManager's REST API, as the yarn backend uses it: ``RmClient`` (create, get,
stop and destroy a service, an application's report) with simple auth (``user.name``), and
``check_rm``, the fail-fast check that the Service API is there; and the reaper's cleanup
command, ``python -m launchkit.backends.yarnrest stop RM_URL SERVICE --user USER``. Errors are
``YarnError``; ``urllib`` only, no Java."""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from launchkit.backends.yarnspec import APPS_PATH, HTTP_TIMEOUT, SERVICES_PATH, YarnOptions
from launchkit.errors import BackendError


class YarnError(OSError):
    """The RM answered with an error, or could not be reached (``status`` 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # 3xx surface as HTTPError: followed by hand, keeping the method and body


class RmClient:
    """The few calls the backend makes, with simple auth (``user.name``). A standby RM's
    redirect to the active one is followed with the same method and body."""

    def __init__(self, base_url: str, user: str, timeout: float = HTTP_TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    def service_url(self, name: str | None = None) -> str:
        path = SERVICES_PATH + (f"/{urllib.parse.quote(name, safe='')}" if name else "")
        return self._with_user(self.base_url + path)

    def _with_user(self, url: str) -> str:
        if "user.name=" in url:
            return url
        return url + ("&" if "?" in url else "?") + urllib.parse.urlencode({"user.name": self.user})

    def request(self, method: str, url: str, body: Any = None) -> tuple[int, Any]:
        """(status, parsed JSON or None). Raises YarnError when the RM cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        for _ in range(4):
            req = urllib.request.Request(url, data=data, method=method)
            req.add_header("Accept", "application/json")
            if data is not None:
                req.add_header("Content-Type", "application/json")
            try:
                with self._opener.open(req, timeout=self.timeout) as resp:
                    return resp.status, _json(resp.read())
            except urllib.error.HTTPError as err:
                location = err.headers.get("Location") if err.headers else None
                if err.code in (301, 302, 303, 307, 308) and location:
                    url = self._with_user(urllib.parse.urljoin(url, location))
                    continue
                with contextlib.suppress(OSError):
                    return err.code, _json(err.read())
                return err.code, None
            except (OSError, ValueError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise YarnError(f"cannot reach the ResourceManager at {self.base_url}: {reason}") from None
        raise YarnError(f"{method} {url}: too many redirects")

    def create(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        status, body = self.request("POST", self.service_url(), spec)
        if status not in (200, 201, 202):
            hint = ""
            if status in (401, 403):
                hint = " (this backend authenticates with user.name only; it does not speak Kerberos/SPNEGO)"
            raise YarnError(
                f"the ResourceManager refused the service (HTTP {status}): {_diag(body)}{hint}", status
            )
        return body if isinstance(body, dict) else {}

    def get(self, name: str) -> dict[str, Any] | None:
        """The service as YARN shows it; None once it does not exist (404)."""
        status, body = self.request("GET", self.service_url(name))
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise YarnError(f"GET service {name}: HTTP {status}: {_diag(body)}", status)
        return body

    def stop(self, name: str) -> str:
        """PUT state STOPPED; the RM's message. 'already stopped' and 'not found' are no error."""
        status, body = self.request("PUT", self.service_url(name), {"state": "STOPPED"})
        if status in (200, 204) or (status in (400, 404) and _gone(body)):
            return _diag(body)
        raise YarnError(f"stop service {name}: HTTP {status}: {_diag(body)}", status)

    def destroy(self, name: str) -> str:
        """DELETE (stops it first if it runs); a service already gone is no error."""
        status, body = self.request("DELETE", self.service_url(name))
        if status in (200, 204, 404) or (status == 400 and _gone(body)):
            return _diag(body)
        raise YarnError(f"delete service {name}: HTTP {status}: {_diag(body)}", status)

    def app(self, app_id: str) -> dict[str, Any] | None:
        """The RM's report of the application (``/ws/v1/cluster/apps/ID``), or None."""
        url = self._with_user(f"{self.base_url}{APPS_PATH}/{urllib.parse.quote(app_id, safe='')}")
        status, body = self.request("GET", url)
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("app"), dict):
            return None
        app: dict[str, Any] = body["app"]
        return app


def _json(data: bytes) -> Any:
    if not data.strip():
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"diagnostics": data.decode(errors="replace").strip()[:500]}


def _diag(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("diagnostics") or body.get("message") or json.dumps(body))[:500]
    return "" if body is None else str(body)[:500]


def _gone(body: Any) -> bool:
    text = _diag(body).lower()
    return any(w in text for w in ("already stopped", "not found", "doesn't exist", "does not exist"))


def check_rm(client: RmClient) -> str:
    """``GET /app/v1/services/version``: the RM's Hadoop version, or BackendError (exit 1)."""
    url = client.service_url("version")
    try:
        status, body = client.request("GET", url)
    except YarnError as exc:
        raise BackendError("yarn", f"{exc}; nothing started") from None
    if status in (401, 403):
        raise BackendError(
            "yarn",
            f"the ResourceManager at {client.base_url} refused user {client.user!r} (HTTP {status}): "
            "this backend authenticates with user.name only (no Kerberos/SPNEGO)",
        )
    if status != 200:
        raise BackendError(
            "yarn",
            f"the ResourceManager at {client.base_url} has no YARN Service API (GET {SERVICES_PATH}/version: "
            f"HTTP {status}); it needs Hadoop 3.2+ with yarn.webapp.api-service.enable=true",
        )
    return str(body.get("hadoop_version") or "") if isinstance(body, dict) else ""


def stop_argv(rm_url: str, service: str, user: str) -> list[str]:
    """What the reaper runs (no shell) to end the service if the launcher dies."""
    return [sys.executable, "-m", "launchkit.backends.yarnrest", "stop", rm_url, service, "--user", user]


# -- python -m launchkit.backends.yarnrest stop URL SERVICE [--user USER] ----------------------------
def main(argv: list[str]) -> int:
    """The reaper's cleanup: stop the service, then delete it (a service already gone is fine)."""
    args = list(argv)
    user = None
    if "--user" in args:
        at = args.index("--user")
        user = args[at + 1] if at + 1 < len(args) else None
        del args[at : at + 2]
    if len(args) != 3 or args[0] != "stop":
        sys.stderr.write("usage: python -m launchkit.backends.yarnrest stop RM_URL SERVICE [--user USER]\n")
        return 2
    client = RmClient(args[1], user or YarnOptions().user_name, timeout=8.0)
    ok = True
    for step in (client.stop, client.destroy):
        try:
            step(args[2])
        except YarnError as exc:
            sys.stderr.write(f"{exc}\n")
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
