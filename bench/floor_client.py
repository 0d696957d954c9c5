"""The growth bench's floor: a client that only lists and watches.

    .venv/bin/python bench/floor_client.py --kubeconfig FILE --log FILE COLLECTION...

Each COLLECTION is an API path with its query string, as the operator
listed it (bench/growth.py takes them from the API server's audit log, so
the floor reads exactly what the operator reads). For each, in a thread of
its own: list it page by page (the operator's page size, from its query),
keep every item, parsed, by namespace and name, then watch from the list's
resourceVersion and apply each event to what it keeps; listed again when
the watch expires. Nothing else: no logic, no writes. It is what any
informer-based controller in Python pays before it does anything.

Writes to the log, one line each, on the system's monotonic clock (the
same in every process of this machine): `synced <t>` once every
collection is listed and every watch open, then `event <t> <type> <kind>
<namespace>/<name>` for each watch event after that. Runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

from kubernetes import client
from kubernetes import config as k8s_config

PAGE = 500
# Query parameters of a list that belong to one request, not to the collection.
PER_REQUEST = frozenset(
    {"watch", "resourceVersion", "resourceVersionMatch", "continue", "timeoutSeconds"}
)
WATCH_SECONDS = 300


def collection(uri: str) -> str:
    """A list's request URI without its per-request parameters: what is listed."""
    parts = urlsplit(uri)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in PER_REQUEST]
    return parts.path + (f"?{urlencode(sorted(query))}" if query else "")


class Floor:
    """Lists and watches each collection; keeps every item."""

    def __init__(self, api: client.ApiClient, collections: list[str], log: Path) -> None:
        self.api = api
        self.collections = collections
        self.kept: dict[str, dict[tuple[str, str], dict[str, Any]]] = {c: {} for c in collections}
        self.listed = threading.Barrier(len(collections) + 1)
        self.synced = False
        self.out = log.open("a", buffering=1, encoding="utf-8")
        self.lock = threading.Lock()

    def _get(self, uri: str, **query: Any) -> Any:
        path, _, base = uri.partition("?")
        params = dict(parse_qsl(base))
        params.update({k: str(v) for k, v in query.items()})
        url = f"{self.api.configuration.host}{path}?{urlencode(params)}"
        return self.api.rest_client.pool_manager.request(
            "GET", url, preload_content=False, timeout=None
        )

    def _list(self, uri: str) -> str:
        kept: dict[tuple[str, str], dict[str, Any]] = {}
        token = ""
        while True:
            paging = {} if "limit=" in uri else {"limit": PAGE}
            resp = self._get(uri, **paging, **({"continue": token} if token else {}))
            body = json.loads(resp.data)
            for item in body.get("items") or []:
                meta = item.get("metadata") or {}
                kept[(meta.get("namespace", ""), meta.get("name", ""))] = item
            token = (body.get("metadata") or {}).get("continue") or ""
            if not token:
                self.kept[uri] = kept
                return str(body["metadata"]["resourceVersion"])

    def _say(self, line: str) -> None:
        with self.lock:
            self.out.write(line + "\n")

    def run_one(self, uri: str) -> None:
        """List, then watch for ever (a thread per collection)."""
        version = self._list(uri)
        first = True
        while True:
            resp = self._get(
                uri,
                watch="true",
                limit=0,
                resourceVersion=version,
                allowWatchBookmarks="true",
                timeoutSeconds=WATCH_SECONDS,
            )
            if first:
                first = False
                self.listed.wait()
            buffer = b""
            expired = False
            for chunk in resp.stream(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        expired = True
                        break
                    meta = obj.get("metadata") or {}
                    version = meta.get("resourceVersion", version)
                    if kind == "BOOKMARK":
                        continue
                    key = (meta.get("namespace", ""), meta.get("name", ""))
                    if kind == "DELETED":
                        self.kept[uri].pop(key, None)
                    else:
                        self.kept[uri][key] = obj
                    if self.synced:
                        self._say(
                            f"event {time.monotonic():.6f} {kind} {obj.get('kind', '?')} "
                            f"{key[0]}/{key[1]}"
                        )
                if expired:
                    break
            if expired:
                version = self._list(uri)

    def run(self) -> None:
        """Start every collection's thread; say when all are listed and watched."""
        for uri in self.collections:
            threading.Thread(target=self.run_one, args=(uri,), daemon=True).start()
        self.listed.wait()
        self.synced = True
        self._say(f"synced {time.monotonic():.6f}")
        threading.Event().wait()


def main() -> int:
    """Run until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("collections", nargs="+")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    cfg = client.Configuration()
    k8s_config.load_kube_config(config_file=args.kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = len(args.collections) + 2
    Floor(client.ApiClient(cfg), args.collections, args.log).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
