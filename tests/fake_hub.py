"""Offline stand-ins for the Hugging Face Hub that exercise the *real* ``huggingface_hub`` client code paths.

* :func:`populate_hf_cache` writes a ``save_pretrained`` folder into the standard hub cache layout, so that
  ``HF_HUB_OFFLINE=1`` + ``HF_HUB_CACHE=<cache_dir>`` (or ``HF_HOME=<home>`` with ``cache_dir=<home>/hub``) resolves
  ``from_pretrained("org/name")`` / ``hf_hub_download`` from it.
* :class:`FakeHub` is a tiny threaded HTTP server on 127.0.0.1 implementing just the Hub routes used by
  ``push_to_hub`` / ``upload_file`` / ``create_commit`` (create repo, validate-yaml, preupload, commit) and by
  downloads (model info, ``resolve`` GET/HEAD, tree listing for ``snapshot_download``). Every file is answered as
  ``uploadMode: "regular"``, so the client inlines content base64 in the commit ndjson: no LFS, no Xet. Requests it
  does not know (and ``create_pr``) go to ``hub.unhandled`` (answered 404). Only model repos ``org/name``, branch
  ``main`` and commit shas. ``ModelCard.push_to_hub`` works with huggingface_hub 2.x only: 1.x validates the card
  against a hard-coded https://huggingface.co (use ``upload_file`` for README.md there).
* :func:`run_python` runs a snippet in a fresh interpreter. ``huggingface_hub.constants`` reads HF_ENDPOINT,
  HF_HUB_OFFLINE, HF_HOME... at import time and several objects capture them (module-level ``HfApi`` instances,
  ``HF_URL_HOSTS``), so monkeypatching them in-process is not reliable: use a subprocess.

Commit shas are content-addressed (sha1 over paths and git blob shas), blobs are named by their git blob sha1 both in
the populated cache and in the FakeHub ETag, so a file populated in the cache is not re-downloaded from the FakeHub.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[1]
DEAD_ENDPOINT = "http://127.0.0.1:9"  # default HF_ENDPOINT of run_python: any forgotten Hub call fails fast, offline
_SHA40 = re.compile(r"[0-9a-f]{40}")


def git_blob_sha(data: bytes) -> str:
    """The git blob sha1 of ``data`` (what the Hub uses as ETag / oid of non-LFS files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _commit_sha(blob_shas: dict[str, str]) -> str:
    h = hashlib.sha1(b"fake-hub-commit\0")
    for path in sorted(blob_shas):
        h.update(f"{path}\0{blob_shas[path]}\n".encode())
    return h.hexdigest()


def populate_hf_cache(
    cache_dir: Path, repo_id: str, folder: Path, revision_sha: str | None = None, *, revision: str = "main"
) -> str:
    """Copy the files of ``folder`` into ``cache_dir`` (an HF *hub* cache, i.e. HF_HUB_CACHE or ``$HF_HOME/hub``):
    ``models--org--name/blobs/<git sha1>``, ``snapshots/<commit>/<relpath>`` (relative symlinks, copies where symlinks
    are unsupported) and ``refs/<revision>`` containing the commit sha. Returns the commit sha (``revision_sha`` or a
    deterministic one derived from the content)."""
    cache_dir, folder = Path(cache_dir), Path(folder)
    storage = cache_dir / "--".join(["models", *repo_id.split("/")])  # models--org--name, like huggingface_hub
    skip = (".git", ".cache")  # git metadata, huggingface_hub's local_dir metadata
    files = [p for p in sorted(folder.rglob("*")) if p.is_file() and p.relative_to(folder).parts[0] not in skip]
    blob_shas: dict[str, str] = {}
    for src in files:
        rel, sha = src.relative_to(folder).as_posix(), git_blob_sha(src.read_bytes())
        blob_shas[rel] = sha
        blob = storage / "blobs" / sha
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, blob)
    revision_sha = revision_sha or _commit_sha(blob_shas)
    if not _SHA40.fullmatch(revision_sha):
        raise ValueError(f"revision_sha must be 40 lowercase hex characters, got {revision_sha!r}")
    for rel, sha in blob_shas.items():
        blob, pointer = storage / "blobs" / sha, storage / "snapshots" / revision_sha / rel
        pointer.parent.mkdir(parents=True, exist_ok=True)
        if pointer.exists() or pointer.is_symlink():
            pointer.unlink()
        try:
            os.symlink(os.path.relpath(blob, pointer.parent), pointer)
        except OSError:
            shutil.copyfile(blob, pointer)
    ref = storage / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(revision_sha)  # no trailing newline, like huggingface_hub
    return revision_sha


class _HubError(Exception):
    def __init__(self, status: int, code: str | None, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.headers = status, {**({"X-Error-Code": code} if code else {}), **(headers or {})}


_REPO = r"(?P<repo>[^/]+/[^/]+)"


class FakeHub:
    """In-memory Hub on 127.0.0.1. ``hub.repos[repo_id][path] = bytes`` is the head of ``main`` (tests may read and
    edit it directly); ``hub.requests`` logs ``"METHOD /path?query"`` of every request, ``hub.unhandled`` those that no
    route matched (answered 404). Serves only inside ``with FakeHub() as hub:``."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.requests: list[str] = []
        self.unhandled: list[str] = []
        self.endpoint: str | None = None
        self._snapshots: dict[tuple[str, str], dict[str, bytes]] = {}  # (repo_id, commit sha) -> files
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._routes = [
            ("POST", re.compile(r"/api/repos/create"), self._create_repo),
            ("POST", re.compile(r"/api/validate-yaml"), lambda body, query: self._json({"errors": [], "warnings": []})),
            ("GET", re.compile(rf"/api/models/{_REPO}(?:/revision/(?P<rev>[^/]+))?"), self._info),
            ("POST", re.compile(rf"/api/models/{_REPO}/preupload/(?P<rev>[^/]+)"), self._preupload),
            ("POST", re.compile(rf"/api/models/{_REPO}/commit/(?P<rev>[^/]+)"), self._commit),
            ("GET", re.compile(rf"/api/models/{_REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?"), self._tree),
            ("GET HEAD", re.compile(rf"/{_REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)"), self._resolve),
        ]

    def __enter__(self) -> "FakeHub":
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads, self._server.block_on_close = False, True  # server_close() joins handlers
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._server is not None and self._thread is not None, "FakeHub is not running"
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None

    def _files(self, repo: str, rev: str) -> tuple[dict[str, bytes], str]:
        """Files and commit sha of ``repo`` at ``rev`` ("main" or a commit sha seen before); records the snapshot."""
        if repo not in self.repos:
            raise _HubError(404, "RepoNotFound", f"Repository {repo} not found")
        rev = unquote(rev)
        if rev == "main":
            files = self.repos[repo]
            sha = _commit_sha({p: git_blob_sha(b) for p, b in files.items()})
            self._snapshots.setdefault((repo, sha), dict(files))
            return files, sha
        if (repo, rev) in self._snapshots:
            return self._snapshots[(repo, rev)], rev
        raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    def _json(self, obj, status: int = 200) -> tuple[int, dict, bytes]:
        return status, {"Content-Type": "application/json"}, json.dumps(obj).encode()

    def _create_repo(self, body: bytes, query: dict):
        payload = json.loads(body)
        if payload.get("type", "model") != "model":
            raise _HubError(400, None, "FakeHub only supports model repos")
        repo = f"{payload['organization']}/{payload['name']}" if payload.get("organization") else payload["name"]
        url = f"{self.endpoint}/{repo}"
        if repo in self.repos:
            return self._json({"error": "You already created this model repo", "url": url}, 409)
        self.repos[repo] = {}
        return self._json({"url": url, "name": repo, "id": repo})

    def _info(self, body: bytes, query: dict, repo: str, rev: str | None = None):
        files, sha = self._files(repo, rev or "main")
        siblings = [{"rfilename": p, "size": len(b), "blobId": git_blob_sha(b)} for p, b in sorted(files.items())]
        return self._json({
            "id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": sha, "private": False, "gated": False,
            "disabled": False, "lastModified": "2024-01-01T00:00:00.000Z", "tags": [], "siblings": siblings,
        })  # fmt: skip

    def _preupload(self, body: bytes, query: dict, repo: str, rev: str):
        files, _ = self._files(repo, rev)
        out = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
             "oid": git_blob_sha(files[f["path"]]) if f["path"] in files else None}
            for f in json.loads(body)["files"]
        ]  # fmt: skip
        return self._json({"files": out})

    def _commit(self, body: bytes, query: dict, repo: str, rev: str):
        if unquote(rev) != "main":  # checked first: a commit sha is not a branch
            self._files(repo, "main")
            raise _HubError(404, "RevisionNotFound", f"FakeHub only commits to main, not {unquote(rev)}")
        current, sha = self._files(repo, rev)
        files = dict(current)
        for item in map(json.loads, filter(bytes.strip, body.splitlines())):
            key, value = item["key"], item["value"]
            if key == "header":
                if value.get("parentCommit") not in (None, sha):
                    raise _HubError(412, None, "A commit has happened since. Please refresh and try again.")
            elif key == "file":
                data = value["content"]
                files[value["path"]] = base64.b64decode(data) if value.get("encoding") == "base64" else data.encode()
            elif key == "deletedFile":
                if files.pop(value["path"], None) is None:
                    raise _HubError(404, "EntryNotFound", "A file with this name doesn't exist")
            elif key == "deletedFolder":
                prefix = value["path"].rstrip("/") + "/"
                files = {p: b for p, b in files.items() if not p.startswith(prefix)}
            else:  # lfsFile: never produced since preupload answers "regular"
                raise _HubError(400, None, f"FakeHub does not support commit key {key!r}")
        current.clear()
        current.update(files)
        _, new_sha = self._files(repo, "main")
        return self._json({"commitUrl": f"{self.endpoint}/{repo}/commit/{new_sha}", "commitOid": new_sha,
                           "pullRequestUrl": None, "success": True})  # fmt: skip

    def _tree(self, body: bytes, query: dict, repo: str, rev: str, path: str = ""):
        """Tree listing (snapshot_download, list_repo_tree): one page, directory oids are fake."""
        files, _ = self._files(repo, rev)
        base = unquote(path).strip("/") + "/" if unquote(path).strip("/") else ""
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        entries: dict[str, dict] = {}
        for p, data in sorted(files.items()):
            parts = p[len(base) :].split("/") if p.startswith(base) else []
            for i in range(1, len(parts) if recursive else min(2, len(parts))):
                d = base + "/".join(parts[:i])
                entries.setdefault(d, {"type": "directory", "oid": git_blob_sha(d.encode()), "path": d})
            if parts and (recursive or len(parts) == 1):
                entries[p] = {"type": "file", "oid": git_blob_sha(data), "size": len(data), "path": p}
        if base and not entries:
            raise _HubError(404, "EntryNotFound", f"{base} does not exist on {rev}")
        return self._json(list(entries.values()))

    def _resolve(self, body: bytes, query: dict, repo: str, rev: str, path: str):
        files, sha = self._files(repo, rev)
        path = unquote(path)
        if path not in files:
            raise _HubError(404, "EntryNotFound", f"{path} does not exist on {rev}", {"X-Repo-Commit": sha})
        data = files[path]
        headers = {"Content-Type": "application/octet-stream", "ETag": f'"{git_blob_sha(data)}"', "X-Repo-Commit": sha}
        return 200, headers, data

    def _handle(self, method: str, raw_path: str, body: bytes) -> tuple[int, dict, bytes]:
        url = urlsplit(raw_path)
        query = parse_qs(url.query)
        with self._lock:
            self.requests.append(f"{method} {raw_path}")
            for methods, pattern, func in self._routes if "create_pr" not in query else []:  # no pull requests
                match = pattern.fullmatch(url.path)
                if method in methods.split() and match:
                    try:
                        return func(body, query, **{k: v for k, v in match.groupdict().items() if v is not None})
                    except _HubError as e:
                        status, headers, payload = self._json({"error": str(e)}, e.status)
                        return status, {**headers, **e.headers}, payload
            self.unhandled.append(f"{method} {raw_path}")
            return self._json({"error": f"FakeHub: no route for {method} {url.path}"}, 404)


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    timeout = 10  # socket timeout: a silent client cannot keep a handler thread alive forever
    protocol_version = "HTTP/1.0"  # one request per connection: nothing lingers once the context exits

    def log_message(self, *args) -> None:  # silence the per-request stderr logging
        return None

    def _dispatch(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))  # the client never sends chunked bodies
        status, headers, payload = self.hub._handle(self.command, self.path, body)
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _dispatch


def run_python(code: str, env: dict, *, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``code`` with ``sys.executable -c`` in a fresh interpreter, with the repo root on PYTHONPATH.

    The child's environment is the parent's minus every ``HF_*`` / ``HUGGINGFACE_*`` / ``TRANSFORMERS_*`` variable
    (e.g. the ``HF_HUB_OFFLINE=1`` set by conftest), plus safe defaults, then ``env``. Defaults: HF_ENDPOINT and
    HTTP(S)_PROXY/ALL_PROXY point at a closed local port and NO_PROXY=127.0.0.1,localhost, so any request to a host
    other than 127.0.0.1 (e.g. a hard-coded https://huggingface.co) fails at once, without even a DNS lookup;
    telemetry, progress bars and update checks are off. Pass HF_HOME or HF_HUB_CACHE in ``env`` to keep the child away
    from ``~/.cache/huggingface``. With ``check``, a non-zero exit raises an AssertionError with the child's output."""
    full = {k: v for k, v in os.environ.items() if not k.upper().startswith(("HF_", "HUGGINGFACE", "TRANSFORMERS_"))}
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    full.update(
        HF_ENDPOINT=DEAD_ENDPOINT, HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1",
        HF_HUB_DISABLE_UPDATE_CHECK="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        **dict.fromkeys(proxies, DEAD_ENDPOINT),
    )  # fmt: skip
    full.update({k: str(v) for k, v in env.items()})
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit code {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc
