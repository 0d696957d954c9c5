"""A small OCI distribution client: push layouts, pull bases by digest.

Credentials are the user's usual ones: the Docker config (`$DOCKER_CONFIG/config.json`,
else `~/.docker/config.json`), its `auths` entries and its credential helpers
(`credHelpers`, `credsStore`). Registries answer with a Basic or a Bearer
challenge (distribution spec, and Docker's token protocol); both are followed.
A registry on loopback is spoken to over plain HTTP, as registry clients do;
every other over HTTPS.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ambient_images.oci import MEDIA_INDEX, MEDIA_MANIFEST, Layout, sha256_digest

_ACCEPT = ", ".join(
    (
        MEDIA_INDEX,
        MEDIA_MANIFEST,
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    )
)


class RegistryError(Exception):
    """A registry refused or failed a request; the message says which and why."""


@dataclass(frozen=True)
class Reference:
    """`host[:port]/repository[:tag][@digest]`."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        """Read a reference; the host part is required (no implicit docker.io)."""
        rest, _, digest = text.partition("@")
        host, slash, path = rest.partition("/")
        if not slash or not path or not ("." in host or ":" in host or host == "localhost"):
            raise ValueError(f"{text!r}: a reference needs a registry host (host[:port]/name)")
        tag = None
        if ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
        return cls(host, path, tag, digest or None)

    def __str__(self) -> str:
        out = f"{self.host}/{self.repository}"
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def docker_config() -> dict[str, object]:
    """The user's Docker config, or an empty one."""
    folder = os.environ.get("DOCKER_CONFIG") or str(Path.home() / ".docker")
    path = Path(folder) / "config.json"
    if not path.is_file():
        return {}
    data: dict[str, object] = json.loads(path.read_text())
    return data


def credentials(host: str) -> tuple[str, str] | None:
    """(user, secret) for a registry host from the Docker config, if it has any."""
    config = docker_config()
    helpers = config.get("credHelpers") or {}
    helper = (helpers.get(host) if isinstance(helpers, dict) else None) or config.get("credsStore")
    if isinstance(helper, str) and helper:
        done = subprocess.run(
            [f"docker-credential-{helper}", "get"],
            input=host,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            found = json.loads(done.stdout)
            return str(found["Username"]), str(found["Secret"])
    auths = config.get("auths") or {}
    if isinstance(auths, dict):
        for key in (host, f"https://{host}", f"http://{host}"):
            entry = auths.get(key)
            if isinstance(entry, dict) and entry.get("auth"):
                user, _, secret = base64.b64decode(str(entry["auth"])).decode().partition(":")
                return user, secret
    return None


@dataclass
class Client:
    """Speaks the distribution API to one registry host for one repository at a time."""

    host: str
    insecure: bool = False
    _auth: dict[str, str] = field(default_factory=dict)  # scope -> Authorization header

    def __post_init__(self) -> None:
        self.insecure = self.insecure or is_loopback(self.host)

    @property
    def base(self) -> str:
        """`http(s)://host`."""
        return f"{'http' if self.insecure else 'https'}://{self.host}"

    def _authorize(self, challenge: str, scope: str) -> str:
        scheme, _, params = challenge.partition(" ")
        creds = credentials(self.host)
        if scheme.lower() == "basic":
            if creds is None:
                raise RegistryError(
                    f"{self.host} asks for a password and the Docker config has none"
                )
            return "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        query = {"scope": scope}
        if "service" in fields:
            query["service"] = fields["service"]
        request = urllib.request.Request(f"{fields['realm']}?{urllib.parse.urlencode(query)}")
        if creds is not None:
            token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.loads(response.read())
        return "Bearer " + str(body.get("token") or body["access_token"])

    def request(
        self,
        method: str,
        url: str,
        *,
        scope: str,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request, answering an auth challenge once; returns status, headers and body."""
        for attempt in (0, 1):
            request = urllib.request.Request(url, data=data, method=method)
            for name, value in (headers or {}).items():
                request.add_header(name, value)
            if scope in self._auth:
                request.add_header("Authorization", self._auth[scope])
            try:
                with urllib.request.urlopen(request, timeout=300) as response:
                    return response.status, dict(response.headers), response.read()
            except urllib.error.HTTPError as err:
                if err.code == 401 and attempt == 0 and "WWW-Authenticate" in err.headers:
                    self._auth[scope] = self._authorize(err.headers["WWW-Authenticate"], scope)
                    continue
                if err.code == 404 and method == "HEAD":
                    return 404, dict(err.headers), b""
                body = err.read().decode(errors="replace")[:500]
                raise RegistryError(f"{method} {url}: {err.code} {err.reason}: {body}") from err
        raise RegistryError(f"{method} {url}: still unauthorized after authenticating")

    def _url(self, repository: str, kind: str, ref: str) -> str:
        return f"{self.base}/v2/{repository}/{kind}/{ref}"

    def push_blob(self, repository: str, digest: str, data: bytes) -> None:
        """Upload a blob unless the repository has it (monolithic upload)."""
        scope = f"repository:{repository}:pull,push"
        status, _, _ = self.request("HEAD", self._url(repository, "blobs", digest), scope=scope)
        if status == 200:
            return
        _, headers, _ = self.request(
            "POST", f"{self.base}/v2/{repository}/blobs/uploads/", scope=scope, data=b""
        )
        location = urllib.parse.urljoin(self.base, headers["Location"])
        sep = "&" if "?" in location else "?"
        self.request(
            "PUT",
            f"{location}{sep}digest={urllib.parse.quote(digest)}",
            scope=scope,
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )

    def push_manifest(self, repository: str, ref: str, data: bytes, media_type: str) -> str:
        """Upload a manifest or index under a tag or digest; returns its digest."""
        scope = f"repository:{repository}:pull,push"
        _, headers, _ = self.request(
            "PUT",
            self._url(repository, "manifests", ref),
            scope=scope,
            data=data,
            headers={"Content-Type": media_type},
        )
        given = headers.get("Docker-Content-Digest", "")
        if given and given != sha256_digest(data):
            raise RegistryError(
                f"{self.host}/{repository}:{ref}: the registry says {given} for a manifest "
                f"whose digest is {sha256_digest(data)}"
            )
        return sha256_digest(data)

    def get_manifest(self, repository: str, ref: str) -> tuple[str, bytes]:
        """A manifest or index by tag or digest: (media type, bytes)."""
        scope = f"repository:{repository}:pull"
        _, headers, body = self.request(
            "GET", self._url(repository, "manifests", ref), scope=scope, headers={"Accept": _ACCEPT}
        )
        return headers.get("Content-Type", "").split(";")[0], body

    def get_blob(self, repository: str, digest: str) -> bytes:
        """A blob's bytes, checked against its digest."""
        scope = f"repository:{repository}:pull"
        _, _, body = self.request("GET", self._url(repository, "blobs", digest), scope=scope)
        if sha256_digest(body) != digest:
            raise RegistryError(f"{self.host}/{repository}: blob {digest} arrived with other bytes")
        return body


def push_layout(layout_dir: Path, target: Reference) -> str:
    """Push the image (or index) an OCI layout names to `target`; returns its digest.

    Blobs first, then each child manifest by digest, then the top manifest
    under the target's tag: a tag never points at something incomplete.
    """
    layout = Layout.__new__(Layout)
    layout.root, layout.blobs = layout_dir, layout_dir / "blobs" / "sha256"
    index = json.loads((layout_dir / "index.json").read_bytes())
    (top,) = index["manifests"]
    client = Client(target.host)
    repo = target.repository

    def push(descriptor: dict[str, object]) -> None:
        digest = str(descriptor["digest"])
        data = layout.read(digest)
        document = json.loads(data)
        if descriptor["mediaType"] == MEDIA_INDEX:
            for child in document["manifests"]:
                push(child)
        else:
            for blob in [document["config"], *document["layers"]]:
                client.push_blob(repo, blob["digest"], layout.read(blob["digest"]))
        client.push_manifest(repo, digest, data, str(descriptor["mediaType"]))

    push(top)
    data = layout.read(top["digest"])
    return client.push_manifest(repo, target.tag or top["digest"], data, top["mediaType"])


def pull_image(ref: Reference, dest: Path, *, platform: Mapping[str, str]) -> Path:
    """Pull one image by digest into an OCI layout at `dest` (from an index, the platform's entry).

    A base is taken only by digest, so what a build sits on cannot move under it.
    """
    if not ref.digest:
        raise ValueError(f"{ref}: a base image is pulled by digest only")
    client = Client(ref.host)
    media_type, data = client.get_manifest(ref.repository, ref.digest)
    if sha256_digest(data) != ref.digest:
        raise RegistryError(f"{ref}: the manifest arrived with digest {sha256_digest(data)}")
    document = json.loads(data)
    if "manifests" in document:
        wanted = [
            m
            for m in document["manifests"]
            if all(m.get("platform", {}).get(k) == v for k, v in platform.items())
        ]
        if len(wanted) != 1:
            raise RegistryError(f"{ref}: {len(wanted)} entries for platform {dict(platform)}")
        media_type, data = client.get_manifest(ref.repository, wanted[0]["digest"])
        document = json.loads(data)
    layout = Layout(dest)
    for blob in [document["config"], *document["layers"]]:
        layout.put(client.get_blob(ref.repository, blob["digest"]), blob["mediaType"])
    manifest = layout.put(data, media_type or MEDIA_MANIFEST)
    layout.finish([manifest])
    return dest


def is_loopback(host: str) -> bool:
    """Whether a registry host is this machine."""
    return host.split(":", maxsplit=1)[0] in ("localhost", "127.0.0.1") or host.startswith("[::1]")
