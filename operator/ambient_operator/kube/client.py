"""A small synchronous REST client over urllib3.

Only what the operator needs: get, list, server-side apply, merge patch,
create, delete. Controllers call it through `asyncio.to_thread`. Who we are
to the API server comes from `kube/credentials.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode

import urllib3

from ambient_operator.api import constants as c
from ambient_operator.api import metrics
from ambient_operator.kube.credentials import Credentials
from ambient_operator.kube.resources import InvalidNameError, Kind, kind_of

_WRITES = {"POST", "PUT", "PATCH", "DELETE"}


# Names our requests in the API server's audit log and its metrics.
_VERSION = c.operator_version()
USER_AGENT = f"ambient-operator/{_VERSION}" if _VERSION else "ambient-operator"


class KubeError(Exception):
    """An API call failed; `status` is the HTTP code (0 when no answer came).

    A name or namespace that no object can carry is refused before any
    request, as 422 Invalid: what the API server answers for one.
    """

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @classmethod
    def from_body(cls, status: int, reason: str, text: str) -> KubeError:
        """Read the Status object the API server sent, when there is one."""
        message = text
        try:
            body = json.loads(text or "{}")
            reason = body.get("reason") or reason
            message = body.get("message") or message
        except (ValueError, AttributeError):
            pass
        return cls(status, str(reason), message)

    @classmethod
    def invalid(cls, exc: InvalidNameError) -> KubeError:
        """For a name refused before any request."""
        return cls(422, "Invalid", f"{exc} (refused before any request)")


def _path(kind: Kind, name: str, namespace: str | None, subresource: str = "") -> str:
    try:
        return kind.path(name, namespace) + subresource
    except InvalidNameError as exc:
        raise KubeError.invalid(exc) from None


def _collection(kind: Kind, namespace: str | None) -> str:
    try:
        return kind.collection(namespace)
    except InvalidNameError as exc:
        raise KubeError.invalid(exc) from None


# API calls come from the waypoints' 16 workers, asyncio's default executor and
# the webhook's thread at once: a connection returned to a full pool is closed,
# and the next call pays a TLS handshake ("Connection pool is full" in the log
# at 200 waypoints with 16).
POOL_SIZE = 32
STREAM_POOL_SIZE = 32
# Items per list response: one page is what is parsed at once.
LIST_PAGE_SIZE = 250


class Kube:
    """REST calls with our field manager, typed results and counted requests."""

    def __init__(
        self,
        credentials: Credentials,
        field_manager: str = c.FIELD_MANAGER,
        timeout: float = 30.0,
    ) -> None:
        self.credentials = credentials
        self.field_manager = field_manager
        self.timeout = timeout
        tls = credentials.ssl_context()
        self._pool = urllib3.PoolManager(maxsize=POOL_SIZE, ssl_context=tls, retries=False)
        # A watch holds its connection for minutes: one per watched kind, kept
        # apart so that they never take the requests' connections.
        self._streams = urllib3.PoolManager(
            maxsize=STREAM_POOL_SIZE, ssl_context=tls, retries=False
        )

    def close(self) -> None:
        """Close the pooled connections."""
        self._pool.clear()
        self._streams.clear()

    def _send(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, str]],
        *,
        label: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: urllib3.Timeout | None = None,
        stream: bool = False,
    ) -> urllib3.BaseHTTPResponse:
        """Send one request and return its response, read unless `stream`.

        `label` is the method as counted in the requests metric. A 401 is
        sent once more with credentials read again: a rotated service-account
        token or an expired exec credential is not an error.
        """
        url = self.credentials.server + path
        params = list(query)
        if params:
            url += "?" + urlencode(params)
        payload = None if body is None else json.dumps(body).encode()
        for attempt in (1, 2):
            headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
            if payload is not None:
                headers["Content-Type"] = content_type
            token = self.credentials.bearer()
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                response = (self._streams if stream else self._pool).request(
                    method,
                    url,
                    body=payload,
                    headers=headers,
                    timeout=timeout or urllib3.Timeout(total=self.timeout),
                    preload_content=not stream,
                )
            except (OSError, urllib3.exceptions.HTTPError) as exc:
                metrics.API_REQUESTS.labels(method=label, code="0").inc()
                raise KubeError(0, "ConnectionError", str(exc)) from None
            if response.status != 401 or attempt == 2 or not token:
                return response
            response.drain_conn()
            self.credentials.refresh()
        raise AssertionError("unreachable")

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Iterable[tuple[str, str]] = (),
        content_type: str = "application/json",
    ) -> Any:
        """One API call; raises KubeError on any non-2xx answer."""
        response = self._send(
            method, path, query, label=method, body=body, content_type=content_type
        )
        status = int(response.status)
        metrics.API_REQUESTS.labels(method=method, code=f"{status // 100}xx").inc()
        data = response.data or b""
        if status >= 400:
            raise KubeError.from_body(status, response.reason or "", data.decode(errors="replace"))
        if method in _WRITES:
            metrics.API_WRITES.labels(method=method).inc()
        # From the bytes: a decoded copy of a 3 MB page would be alive beside them.
        return json.loads(data) if data else None

    def open_stream(
        self, path: str, query: Iterable[tuple[str, str]], read_timeout: float
    ) -> urllib3.BaseHTTPResponse:
        """A GET whose body is read as it arrives (a watch); the caller closes it."""
        raw = self._send(
            "GET",
            path,
            query,
            label="WATCH",
            timeout=urllib3.Timeout(connect=10.0, read=read_timeout),
            stream=True,
        )
        status = int(raw.status)
        metrics.API_REQUESTS.labels(method="WATCH", code=f"{status // 100}xx").inc()
        if status >= 400:
            text = raw.read().decode(errors="replace")
            raw.release_conn()
            raise KubeError.from_body(status, raw.reason or "", text)
        return raw

    def serves(self, kind: Kind) -> bool:
        """Whether the API server serves `kind` (its CRD is installed), by discovery."""
        base = f"/apis/{kind.api_version}" if kind.group else f"/api/{kind.api_version}"
        try:
            found = self.request("GET", base)
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return any(r.get("name") == kind.plural for r in found.get("resources") or [])

    def may(self, verb: str, resource: str, group: str = "") -> bool:
        """Whether RBAC lets this identity `verb` `resource` in every namespace.

        A SelfSubjectAccessReview: it changes nothing, and every authenticated
        identity may ask it (Kubernetes' system:basic-user role).
        """
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": verb, "resource": resource, "group": group}},
        }
        found = self.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review
        )
        return bool((found.get("status") or {}).get("allowed"))

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist.

        A name or namespace no object can carry (often read from an annotation)
        is None without a request: the API server could only answer 404.
        """
        try:
            path = kind.path(name, namespace)
        except InvalidNameError:
            return None
        try:
            obj: dict[str, Any] = self.request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    def list(
        self, kind: Kind, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """Every object of a kind (in one namespace, or everywhere)."""
        query = [("labelSelector", label_selector)] if label_selector else []
        result = self.request("GET", _collection(kind, namespace), query=query)
        return _typed(kind, result.get("items", []))

    def pages(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = LIST_PAGE_SIZE,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """The list responses of a kind, `page_size` items each (the last carries its version).

        Their items carry their type fields, as `list`'s do.
        """
        token = ""
        while True:
            query = [("limit", str(page_size))]
            if label_selector:
                query.append(("labelSelector", label_selector))
            if field_selector:
                query.append(("fieldSelector", field_selector))
            if token:
                query.append(("continue", token))
            page: dict[str, Any] = self.request("GET", _collection(kind, namespace), query=query)
            _typed(kind, page.get("items", []))
            # Read before the caller has the page: it may clear it to free its items.
            token = (page.get("metadata") or {}).get("continue") or ""
            yield page
            del page
            if not token:
                return

    def iter_list(
        self,
        kind: Kind,
        namespace: str | None = None,
        label_selector: str | None = None,
        page_size: int = LIST_PAGE_SIZE,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Like `list`, a page at a time: memory stays flat however many objects exist."""
        for page in self.pages(kind, namespace, label_selector, page_size, field_selector):
            yield from page.get("items", [])

    def apply(
        self, obj: Mapping[str, Any], *, force: bool = True, field_manager: str | None = None
    ) -> dict[str, Any]:
        """Server-side apply under our field manager (or `field_manager`, for a hand-over)."""
        kind = kind_of(dict(obj))
        meta = obj["metadata"]
        query = [("fieldManager", field_manager or self.field_manager)]
        if force:
            query.append(("force", "true"))
        result: dict[str, Any] = self.request(
            "PATCH",
            _path(kind, meta["name"], meta.get("namespace")),
            body=dict(obj),
            query=query,
            content_type="application/apply-patch+yaml",
        )
        return result

    def apply_status(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the status subresource."""
        kind = kind_of(dict(obj))
        meta = obj["metadata"]
        result: dict[str, Any] = self.request(
            "PATCH",
            _path(kind, meta["name"], meta.get("namespace"), "/status"),
            body=dict(obj),
            query=[("fieldManager", self.field_manager), ("force", "true")],
            content_type="application/apply-patch+yaml",
        )
        return result

    def merge_patch(
        self,
        kind: Kind,
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
        *,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A JSON merge patch, optionally of a subresource."""
        path = _path(kind, name, namespace, f"/{subresource}" if subresource else "")
        result: dict[str, Any] = self.request(
            "PATCH",
            path,
            body=dict(patch),
            query=[("fieldManager", self.field_manager)],
            content_type="application/merge-patch+json",
        )
        return result

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """POST a new object."""
        kind = kind_of(dict(obj))
        namespace = obj["metadata"].get("namespace")
        result: dict[str, Any] = self.request(
            "POST",
            _collection(kind, namespace),
            body=dict(obj),
            query=[("fieldManager", self.field_manager)],
        )
        return result

    def delete(
        self, kind: Kind, name: str, namespace: str | None = None, *, uid: str | None = None
    ) -> bool:
        """Delete (background propagation); False when it was already gone.

        With `uid`, only that incarnation is deleted, never a namesake that
        someone created meanwhile.
        """
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", _path(kind, name, namespace), body=body)
        except KubeError as exc:
            if exc.status in (404, 409):
                return False
            raise
        return True


def _typed(kind: Kind, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # Lists leave out the type fields of their items; callers key on them.
    for item in items:
        item.setdefault("apiVersion", kind.api_version)
        item.setdefault("kind", kind.kind)
    return items
