"""A small local HTTP server that speaks the Hugging Face Hub's endpoints `huggingface_hub` uses
to download a model (repo info, file tree, resolve with HEAD, GET and Range), for tests run
with HF_ENDPOINT pointing at it. Repos are folders; revisions are commits of their own."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import attrs


@attrs.define
class Commit:
    sha: str
    files: dict[str, bytes]


@attrs.define
class Repo:
    """One repo: commits by sha, refs (branch or tag -> sha), and how it answers."""

    commits: dict[str, Commit] = attrs.field(factory=dict)
    refs: dict[str, str] = attrs.field(factory=dict)
    gated: bool = False  # 401 GatedRepo without the token below
    token: str | None = None

    def add(self, folder: Path, ref: str = "main") -> str:
        files = {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}
        digest = hashlib.sha1()
        for name, data in files.items():
            digest.update(name.encode() + hashlib.sha1(data).digest())
        sha = digest.hexdigest()
        self.commits[sha] = Commit(sha, files)
        self.refs[ref] = sha
        return sha

    def commit(self, rev: str) -> Commit | None:
        return self.commits.get(self.refs.get(rev, rev))


@attrs.define
class Hub:
    """The server's state: repos by id, requests seen, and faults to inject."""

    repos: dict[str, Repo] = attrs.field(factory=dict)
    log: list[tuple[str, str, str | None]] = attrs.field(factory=list)  # method, path, Range
    cut_after: dict[str, int] = attrs.field(factory=dict)  # file name -> bytes, then drop (once)
    refuse_resumes: dict[str, int] = attrs.field(factory=dict)  # file name -> Range requests
    url: str = ""


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            hub.log.append((self.command, path, self.headers.get("Range")))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"]:
                self._api(parts[2:])
            elif len(parts) >= 5 and parts[2] == "resolve":
                self._resolve("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body)
            else:
                self._error(404, "EntryNotFound")

        def _repo(self, repo_id: str) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound")
                return None
            if repo.gated and self.headers.get("Authorization") != f"Bearer {repo.token}":
                self._error(401, "GatedRepo")
                return None
            return repo

        def _api(self, rest: list[str]) -> None:
            repo_id, what = "/".join(rest[:2]), rest[2:]
            repo = self._repo(repo_id)
            if repo is None:
                return
            rev = what[1] if len(what) > 1 else "main"
            commit = repo.commit(rev)
            if commit is None:
                self._error(404, "RevisionNotFound")
            elif what[:1] == ["revision"]:
                siblings = [{"rfilename": n} for n in commit.files]
                self._json({"id": repo_id, "sha": commit.sha, "siblings": siblings})
            elif what[:1] == ["tree"]:
                self._json(
                    [
                        {"type": "file", "path": n, "size": len(d), "oid": _oid(d)}
                        for n, d in commit.files.items()
                    ]
                )
            else:
                self._error(404, "EntryNotFound")

        def _resolve(self, repo_id: str, rev: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id)
            if repo is None:
                return
            commit = repo.commit(rev)
            if commit is None:
                self._error(404, "RevisionNotFound")
                return
            data = commit.files.get(name)
            if data is None:
                self._error(404, "EntryNotFound")
                return
            start = 0
            rng = self.headers.get("Range")
            if rng and rng.startswith("bytes="):
                start = int(rng[6:].split("-")[0])
            if start and body and hub.refuse_resumes.get(name, 0) > 0:
                hub.refuse_resumes[name] -= 1  # the network stays down: drop, answer nothing
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.send_response(206 if start else 200)
            self.send_header("ETag", f'"{_oid(data)}"')
            self.send_header("X-Repo-Commit", commit.sha)
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if not body:
                return
            cut = hub.cut_after.pop(name, None) if start == 0 else None
            if cut is not None:  # send part of it, then drop the connection
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
                return
            self.wfile.write(data[start:])

        def _json(self, obj: Any) -> None:
            raw = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        def _error(self, code: int, error_code: str) -> None:
            raw = json.dumps({"error": error_code}).encode()
            self.send_response(code)
            self.send_header("X-Error-Code", error_code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

    return Handler


def _oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # git's blob id


def serve(hub: Hub) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start serving `hub` on a free loopback port (hub.url is set); stop with shutdown()."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits for the loop's next poll: 0.05 s, not the default 0.5 s, per test
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    return server, thread
