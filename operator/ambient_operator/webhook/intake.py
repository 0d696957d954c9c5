"""Reading what arrives at the webhook's port, whoever sent it.

The API server sends `application/json` AdmissionReviews of objects it has
already decoded into typed structs, so every field it sends has its Go type
(a list is a list, a label value a string). Anything else comes from some
other client that can reach the port, and is answered without a traceback:

- No uid can be read (a body that is too big, not JSON, nested too deep, not
  an AdmissionReview, or without `request.uid`): HTTP 4xx with a Kubernetes
  Status body. The API server treats that as a failed call, and with the
  webhook's failurePolicy Ignore the pod goes through unchanged.
- A review with a uid whose request or pod has fields of the wrong type:
  allowed, no patch, and a warning saying why. The webhook never blocks a pod.

Each problem is counted in `ambient_operator_webhook_bad_reviews_total` and
logged at most once per reason per interval (`LogLimiter`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from ambient_operator.api.conditions import BadReviewReason
from ambient_operator.kube.resources import shown

# The API server refuses request bodies over 3 MiB (MaxRequestBodyBytes in
# k8s.io/apiserver), and a CREATE review carries the object once in a small
# envelope; the rest is room for defaulting and earlier webhooks' additions.
MAX_BODY_BYTES = 4 * 1024 * 1024
# A pod's review nests about 20 deep (managedFields mirror the object); the
# bound keeps parsing, copying and dumping far from Python's recursion limit.
MAX_DEPTH = 100
LOG_INTERVAL_SECONDS = 10.0
# The only version the webhook configuration asks for (admissionReviewVersions).
REVIEW_API_VERSION = "admission.k8s.io/v1"
REVIEW_KIND = "AdmissionReview"

_STATUS_REASONS = {
    400: "BadRequest",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    500: "InternalError",
}


class Refused(Exception):  # noqa: N818 - a refusal is an answer, not an error
    """The body cannot be answered as a review: an HTTP status, a reason and why."""

    def __init__(self, status: int, reason: BadReviewReason, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    def status_body(self) -> dict[str, Any]:
        """The answer: a Status object, as the API server's clients read errors."""
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Failure",
            "code": self.status,
            "reason": _STATUS_REASONS.get(self.status, "BadRequest"),
            "message": str(self),
        }


# -- the body -------------------------------------------------------------------------------

_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = tuple(1 if b in b"[{" else -1 for b in range(256))


def nesting(body: bytes) -> int:
    """How deep arrays and objects nest in a JSON text (brackets inside strings ignored).

    Computed before parsing: the parser recurses once per level and gives up
    only at Python's recursion limit, with a RecursionError. Every step runs
    in C and is linear in the body, whatever it holds (about 60 us for a
    9 KB pod, half of what a regular expression over the strings took).
    """
    # With escaped backslashes gone first, every `\"` left is an escaped quote;
    # then each remaining quote opens or closes a string.
    plain = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(plain.split(b'"')[::2])
    brackets = outside.translate(None, _NOT_BRACKETS)
    return max(accumulate(map(_STEPS.__getitem__, brackets)), default=0)


def read_json(body: bytes) -> dict[str, Any]:
    """The JSON object of a body already bounded in size; Refused when there is none."""
    if nesting(body) > MAX_DEPTH:
        raise Refused(
            400, BadReviewReason.TOO_DEEP, f"the JSON nests deeper than {MAX_DEPTH} levels"
        )
    try:
        value = json.loads(body)
    except RecursionError:
        raise Refused(
            400, BadReviewReason.TOO_DEEP, f"the JSON nests deeper than {MAX_DEPTH} levels"
        ) from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise Refused(
            400, BadReviewReason.NOT_JSON, f"the body is not JSON ({_short(exc)})"
        ) from None
    if not isinstance(value, dict):
        raise Refused(
            400,
            BadReviewReason.NOT_ADMISSION_REVIEW,
            f"the body is {_kind(value)}, not an AdmissionReview",
        )
    return value


def request_of(review: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """(request, uid) of a review; Refused when it is not one or names no uid.

    apiVersion and kind may be left out (the answer is v1 then); present,
    they must say a v1 AdmissionReview.
    """
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if api_version is not None and api_version != REVIEW_API_VERSION:
        raise Refused(
            400,
            BadReviewReason.NOT_ADMISSION_REVIEW,
            f"apiVersion {_value(api_version)} is not {REVIEW_API_VERSION}",
        )
    if kind is not None and kind != REVIEW_KIND:
        raise Refused(
            400, BadReviewReason.NOT_ADMISSION_REVIEW, f"kind {_value(kind)} is not {REVIEW_KIND}"
        )
    request = review.get("request")
    if request is None:
        raise Refused(400, BadReviewReason.NO_UID, "the review has no request")
    if not isinstance(request, Mapping):
        raise Refused(
            400, BadReviewReason.NO_UID, f"request is {_kind(request)}, not an object with a uid"
        )
    uid = request.get("uid")
    if uid is None or uid == "":
        raise Refused(400, BadReviewReason.NO_UID, "request.uid is missing")
    if not isinstance(uid, str):
        raise Refused(400, BadReviewReason.NO_UID, f"request.uid is {_kind(uid)}, not a string")
    return request, uid


def _short(exc: Exception) -> str:
    return str(exc)[:80]


def _value(value: Any) -> str:
    return shown(value) if isinstance(value, str) else _kind(value)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# -- the shapes the decision reads ---------------------------------------------------------


@dataclass(frozen=True)
class _MapOf:
    """An object whose every value has this type (labels, annotations, quantities)."""

    value: type


# A shape: a scalar type (`dict` for any object), {key: shape} for an object
# whose listed keys have those shapes, [shape] for an array, or _MapOf. Only
# what the decision and the patch read is described; other fields pass.
Shape = type | dict[str, Any] | list[Any] | _MapOf

_CONTAINER: dict[str, Shape] = {
    "name": str,
    "resources": {"limits": _MapOf(str), "requests": _MapOf(str)},
    "securityContext": {"windowsOptions": dict},
}
_REQUIREMENTS: list[Shape] = [{"key": str, "operator": str, "values": [str]}]
POD_SHAPE: dict[str, Shape] = {
    "metadata": {
        "name": str,
        "namespace": str,
        "labels": _MapOf(str),
        "annotations": _MapOf(str),
    },
    "spec": {
        "hostNetwork": bool,
        "nodeName": str,
        "runtimeClassName": str,
        "nodeSelector": _MapOf(str),
        "os": {"name": str},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": _REQUIREMENTS, "matchFields": _REQUIREMENTS}
                    ]
                }
            }
        },
        "tolerations": [{"key": str, "operator": str, "value": str, "effect": str}],
        "containers": [_CONTAINER],
        "initContainers": [_CONTAINER],
        "volumes": [{"name": str}],
        "securityContext": dict,
    },
}
REQUEST_SHAPE: dict[str, Shape] = {
    "operation": str,
    "resource": {"resource": str},
    "subResource": str,
    "namespace": str,
    "object": dict,
}
_REQUIRED = ("operation", "resource")
_NAMES = {bool: "a boolean", str: "a string", dict: "an object"}


def _problem(value: Any, shape: Shape, path: str, nullable: bool = True) -> str | None:
    # Go decodes null into a zero value, so the API server sends null only
    # for absent fields, never as an array item or a map value.
    if value is None:
        return None if nullable else f"{path} is null"
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{path} is {_kind(value)}, not an object"
        for key, sub in shape.items():
            problem = _problem(value.get(key), sub, f"{path}.{key}" if path else key)
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{path} is {_kind(value)}, not an array"
        for index, item in enumerate(value):
            problem = _problem(item, shape[0], f"{path}[{index}]", nullable=False)
            if problem:
                return problem
        return None
    if isinstance(shape, _MapOf):
        if not isinstance(value, dict):
            return f"{path} is {_kind(value)}, not an object"
        for key, item in value.items():
            if not isinstance(item, shape.value):
                return f"{path}[{shown(key)}] is {_kind(item)}, not {_NAMES[shape.value]}"
        return None
    # bool is an int, and no JSON number is a bool: exact types.
    if type(value) is not shape:
        return f"{path} is {_kind(value)}, not {_NAMES[shape]}"
    return None


def pod_problem(pod: Mapping[str, Any]) -> str | None:
    """Why the decision cannot read this pod (a field of the wrong type), if it cannot."""
    return _problem(pod, POD_SHAPE, "")


def request_problem(request: Mapping[str, Any]) -> str | None:
    """Why this AdmissionRequest is not one the API server would send, if it is not."""
    for key in _REQUIRED:
        if request.get(key) is None:
            return f"request.{key} is missing"
    return _problem(request, REQUEST_SHAPE, "request")


# -- saying so, quietly --------------------------------------------------------------------


class LogLimiter:
    """One log line per key per interval; the lines held back are counted in the next.

    Keys are reasons, a fixed set, so the memory stays small. Lines held back
    at the end of a burst are only counted once the key is logged again; the
    metric counts every one at once.
    """

    def __init__(
        self,
        interval: float = LOG_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        # The server thread logs, and so can a test calling `review` directly.
        self._lock = threading.Lock()

    def admit(self, key: str) -> int | None:
        """None when this line is held back, else how many were held back since the last."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)

    def warning(
        self, logger: logging.Logger, key: str, message: str, *, exc_info: bool = False
    ) -> None:
        """Log `message` at WARNING unless a line for `key` went out within the interval."""
        held = self.admit(key)
        if held is None:
            return
        more = f" ({held} more like it since the last such line)" if held else ""
        logger.warning("%s%s", message, more, exc_info=exc_info)
