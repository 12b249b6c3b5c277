"""A thin etcd v3 client over etcd's own JSON gateway (``/v3/...`` on every client URL).

Why our own and not a library: the job needs six calls (range, put, delete, txn, lease grant /
keepalive / revoke, status), all of which etcd >= 3.4 serves as plain JSON over HTTP. The
maintained Python clients either pull in gRPC + protobuf stubs (``etcd3``: unmaintained, broken
with protobuf >= 4) or a stack of their own dependencies (``etcd3gw``: requests, futurist, pbr)
for what is here ~150 lines of the standard library that every node already has. The engine
is still etcd: consensus, leases and transactions are its, this file only speaks to it.

Failure semantics: each call tries the endpoints in turn, starting from the last one that
answered; a member that is down or cannot reach quorum (etcd answers "request timed out" or
the socket times out) is skipped. When no member answers within ``timeout`` per endpoint the
call raises :class:`EtcdUnavailable` -- a write is then *not known* to have happened, which is
why every write that matters is a transaction the caller can re-check (``coord.jobstate``).
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

__all__ = ["Etcd", "EtcdError", "EtcdUnavailable", "KV", "prefix_end"]


class EtcdError(Exception):
    """etcd answered with an error that is not about reachability."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered (down, partitioned, or without quorum)."""


@dataclass(frozen=True)
class KV:
    key: str
    value: str
    create_revision: int
    mod_revision: int
    lease: int


#: etcd's answers that say "not now, ask again" (no quorum, an election under way)
_TRANSIENT = ("timed out", "no leader", "leader changed", "unavailable", "stopped",
              "too many requests")


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: str) -> str:
    return base64.b64decode(s).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with ``prefix`` (etcd's convention)."""
    b = bytearray(prefix.encode())
    b[-1] += 1
    return b.decode()


def _kv(d: dict) -> KV:
    return KV(_unb64(d["key"]), _unb64(d.get("value", "")), int(d.get("create_revision", 0)),
              int(d.get("mod_revision", 0)), int(d.get("lease", 0)))


class Etcd:
    """``Etcd(["host:port", ...], timeout=1.0)``: a client of one etcd cluster."""

    def __init__(self, endpoints: list[str], timeout: float = 1.0) -> None:
        self.endpoints, self.timeout = list(endpoints), timeout
        self._first = 0  # the endpoint that answered last: tried first next time

    # ------------------------------------------------------------------ transport
    def _post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        last = "no endpoint"
        n = len(self.endpoints)
        for i in range(n):
            k = (self._first + i) % n
            url = f"http://{self.endpoints[k]}/v3/{path}"
            req = urllib.request.Request(url, data=data,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as r:
                    out = json.loads(r.read() or b"{}")
            except urllib.error.HTTPError as e:  # etcd's gRPC error as JSON
                try:
                    msg = json.loads(e.read() or b"{}").get("error", str(e))
                except ValueError:
                    msg = str(e)
                if any(t in msg.lower() for t in _TRANSIENT):
                    last = f"{self.endpoints[k]}: {msg}"  # no quorum here, or an election
                    continue
                raise EtcdError(f"{self.endpoints[k]}: {msg}") from None
            except (OSError, ValueError) as e:  # refused, reset, timed out, garbage
                last = f"{self.endpoints[k]}: {e}"
                continue
            if "error" in out:  # a stream's error frame (lease keepalive)
                raise EtcdError(f"{self.endpoints[k]}: {out['error']}")
            self._first = k
            return out
        raise EtcdUnavailable(f"no etcd member answered ({last})")

    # ------------------------------------------------------------------ kv
    def get(self, key: str) -> KV | None:
        return self.get_at(key)[0]

    def get_at(self, key: str) -> tuple[KV | None, int]:
        """``key``'s value and the cluster's revision of the read (a :meth:`watch` from the
        next revision misses nothing)."""
        kvs, rev = self._range({"key": _b64(key)})
        return (kvs[0] if kvs else None), rev

    def _range(self, body: dict) -> tuple[list[KV], int]:
        out = self._post("kv/range", body)
        return ([_kv(d) for d in out.get("kvs", [])],
                int(out.get("header", {}).get("revision", 0)))

    def get_prefix(self, prefix: str) -> list[KV]:
        return self.get_prefix_at(prefix)[0]

    def get_prefix_at(self, prefix: str) -> tuple[list[KV], int]:
        """Every key under ``prefix`` and the revision of the read."""
        return self._range({"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})

    def put(self, key: str, value: str, lease: int = 0) -> None:
        self._post("kv/put", {"key": _b64(key), "value": _b64(value),
                              **({"lease": str(lease)} if lease else {})})

    def delete_prefix(self, prefix: str) -> None:
        self._post("kv/deleterange", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))})

    def txn(self, compare: list[dict], success: list[dict], failure: list[dict] = ()) -> tuple[
            bool, list[dict], int]:
        """One atomic transaction: ``(succeeded, responses, revision after it)``. Build the
        parts with :func:`cmp_create`, :func:`cmp_mod`, :func:`cmp_value`, :func:`op_put`,
        :func:`op_get`."""
        out = self._post("kv/txn", {"compare": compare, "success": list(success),
                                    "failure": list(failure)})
        return (bool(out.get("succeeded", False)), out.get("responses", []),
                int(out.get("header", {}).get("revision", 0)))

    # ------------------------------------------------------------------ leases
    def grant(self, ttl: int) -> int:
        return int(self._post("lease/grant", {"TTL": int(ttl)})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease`` once: its TTL left (0: it has expired and cannot be renewed)."""
        res = self._post("lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(res.get("TTL", 0))

    def revoke(self, lease: int) -> None:
        try:
            self._post("lease/revoke", {"ID": str(lease)})
        except EtcdError as e:  # already gone: the aim is met
            if "not found" not in str(e):
                raise

    def status(self) -> dict:
        return self._post("maintenance/status", {})

    # ------------------------------------------------------------------ watch
    def watch(self, key: str, start_revision: int, timeout: float,
              prefix: bool = False) -> list[dict] | None:
        """The first batch of changes to ``key`` (every key under it with ``prefix``) at or
        after ``start_revision`` (etcd's watch:
        one streamed HTTP request that etcd answers the moment the key changes), as
        ``[{"type": "PUT" | "DELETE", "kv": KV | None}]``; ``None`` when nothing changed
        within ``timeout`` s or no member could be watched (the caller reads and watches
        again). Why not a poll: N members polling a key at 50 ms kept a 2-core etcd busy,
        and at 250 ms the poll was most of a takeover's latency after the lease."""
        deadline = time.monotonic() + timeout
        body = json.dumps({"create_request": {
            "key": _b64(key), "start_revision": str(int(start_revision)),
            **({"range_end": _b64(prefix_end(key))} if prefix else {})}})
        n = len(self.endpoints)
        for i in range(n):
            k = (self._first + i) % n
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            host, _, port = self.endpoints[k].rpartition(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=min(left, self.timeout))
            try:
                conn.request("POST", "/v3/watch", body, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                if resp.status != 200:
                    continue
                buf, dec = "", json.JSONDecoder()
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    conn.sock.settimeout(left)
                    chunk = resp.read1(65536)
                    if not chunk:
                        break  # the member closed the stream (stopping): try the next one
                    buf += chunk.decode()
                    while buf.strip():
                        try:
                            frame, end = dec.raw_decode(buf.lstrip())
                        except ValueError:
                            break  # a frame still coming
                        buf = buf.lstrip()[end:]
                        if "error" in frame:
                            raise EtcdError(f"{self.endpoints[k]}: {frame['error']}")
                        res = frame.get("result", {})
                        if res.get("canceled"):
                            raise EtcdError(f"{self.endpoints[k]}: watch canceled "
                                            f"({res.get('cancel_reason', '')})")
                        evs = res.get("events") or []
                        if evs:
                            self._first = k
                            return [{"type": e.get("type", "PUT"),
                                     "kv": _kv(e["kv"]) if "kv" in e else None}
                                    for e in evs]
            except (socket.timeout, TimeoutError):
                if deadline - time.monotonic() <= 0:
                    return None
            except (OSError, ValueError, http.client.HTTPException):
                continue  # down or partitioned: another member may still serve the watch
            finally:
                conn.close()
        return None


# ---------------------------------------------------------------------- txn parts
def cmp_create(key: str, revision: int) -> dict:
    """``create_revision(key) == revision`` (0: the key does not exist)."""
    return {"key": _b64(key), "result": "EQUAL", "target": "CREATE",
            "create_revision": str(revision)}


def cmp_mod(key: str, revision: int) -> dict:
    """``mod_revision(key) == revision``: nobody wrote ``key`` since it was read."""
    return {"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": str(revision)}


def cmp_value(key: str, value: str) -> dict:
    return {"key": _b64(key), "result": "EQUAL", "target": "VALUE", "value": _b64(value)}


def op_put(key: str, value: str, lease: int = 0) -> dict:
    return {"request_put": {"key": _b64(key), "value": _b64(value),
                            **({"lease": str(lease)} if lease else {})}}


def op_get(key: str) -> dict:
    return {"request_range": {"key": _b64(key)}}


def range_kvs(response: dict) -> list[KV]:
    """The key-values of one ``op_get`` response inside a txn's responses."""
    return [_kv(d) for d in response.get("response_range", {}).get("kvs", [])]
