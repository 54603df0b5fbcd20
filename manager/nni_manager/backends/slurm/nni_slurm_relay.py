"""Runs ON THE LOGIN NODE (stdlib only, Python >= 3.8), started detached by the slurm backend.

argv: <bind host> <port, 0: any> <target file> <port file> <idle exit seconds> <max connections> <limit file>
      <token sha256>
Listens on <bind host>:<port> for the agents on compute nodes and pipes each connection's bytes,
unchanged, to the address in <target file> ("127.0.0.1:<port>": the SSH remote forward back to
the manager's hub, re-read for every connection, so a reconnected manager only rewrites it). TLS
stays end to end between agent and hub: this process never sees a clear byte. Writes the port it
got to <port file>. Exits when <target file> is removed (the experiment ended), or after <idle
exit> seconds in which the manager's forward never answered (a manager that never came back).
At most <max connections> connections are held at once, two threads each, so anyone who can reach
the port cannot make it start threads without end. A connection is piped only once it has proved
that it is one of the experiment's agents: it opens with an HTTP CONNECT (gRPC writes it, this
relay being the agent's proxy) whose Proxy-Authorization carries the experiment's relay token, of
which this program knows only the sha256 (<token sha256>, no secret), compared in constant time;
the relay then answers "200" and pipes. Anything else (no proof, a wrong one, garbage, more than
HEAD_MAX bytes) is closed at once; one that has not proved itself within FIRST_BYTES_S is closed,
and when all places are taken the oldest unproven connection gives its place to a newcomer (only
when every place pipes a proven connection is the newcomer closed): connections from someone
without the experiment's secret never keep an agent out (nni_manager/hub/relay_token.py).
The number in <limit file>, read at every connection, replaces <max connections>: the manager
rewrites it when trialConcurrency changes (the WebUI) and when a restarted manager finds this relay running.
"""
import base64
import binascii
import hashlib
import hmac
import os
import socket
import sys
import threading
import time

bind, port, target_file, port_file, idle_exit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
MAX_CONNECTIONS, LIMIT_FILE, TOKEN_SHA256 = int(sys.argv[6]), sys.argv[7], sys.argv[8]
PROBE_S = 30.0
FIRST_BYTES_S = 10.0
HEAD_MAX = 4096  # an agent's CONNECT is about 150 bytes
CONNECT = b"CONNECT "
state = {"open": 0, "accepted": 0, "refused": 0, "last_ok": time.monotonic(), "probed": 0.0}
silent = []  # type: list[socket.socket]  # not proven yet, oldest first (under `lock`)
lock = threading.Lock()


def log(words):
    sys.stdout.write(time.strftime("%Y-%m-%d %H:%M:%S ") + words + "\n")
    sys.stdout.flush()


def target():
    with open(target_file) as f:
        host, _, p = f.read().strip().rpartition(":")
    return host, int(p)


def most():
    """The connections piped at once: <limit file>'s number, else <max connections>."""
    if LIMIT_FILE:
        try:
            with open(LIMIT_FILE) as f:
                n = int(f.read().strip())
            if n > 0:
                return n
        except (OSError, ValueError):
            pass
    return MAX_CONNECTIONS


def copy(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def proven(head):
    """Whether an HTTP CONNECT head carries the relay token (Proxy-Authorization: Basic nni:<token>);
    the same check as the Kubernetes hub relay's (nni_manager/backends/kubernetes/relay.py)."""
    lines = head.split(b"\r\n")
    if len(head) > HEAD_MAX or not lines[0].startswith(CONNECT):
        return False
    presented = b""
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"proxy-authorization":
            scheme, _, encoded = value.strip().partition(b" ")
            if scheme.lower() == b"basic":
                try:
                    presented = base64.b64decode(encoded.strip(), validate=True).partition(b":")[2]
                except (binascii.Error, ValueError):
                    return False
    digest = hashlib.sha256(presented).hexdigest().encode()
    return bool(presented) and hmac.compare_digest(digest, TOKEN_SHA256.encode())


def read_head(conn):
    """(head, what came after it): the HTTP head up to its blank line; (b"", b"") when none came in
    FIRST_BYTES_S, the connection ended or gave way, or more than HEAD_MAX bytes came without one."""
    deadline = time.monotonic() + FIRST_BYTES_S
    data = b""
    while b"\r\n\r\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) > HEAD_MAX or not (data.startswith(CONNECT) or CONNECT.startswith(data)):
            return b"", b""
        conn.settimeout(left)
        try:
            chunk = conn.recv(HEAD_MAX)
        except OSError:  # silent too long, or made to give way
            return b"", b""
        if not chunk:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def serve(conn, peer):
    try:
        head, rest = read_head(conn)
        with lock:
            if conn in silent:
                silent.remove(conn)
        if not head or not proven(head):
            conn.close()  # no proof: dropped at once, having cost nothing shared
            return
        conn.settimeout(None)
        pipe(conn, peer, rest)
    finally:
        with lock:
            state["accepted"] -= 1


def pipe(conn, peer, first):
    try:
        where = target()
        up = socket.create_connection(where, timeout=10)
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        if first:
            up.sendall(first)
    except (OSError, ValueError) as e:
        log("%s:%s: cannot reach the manager's forward: %s" % (peer[0], peer[1], e))
        conn.close()
        return
    up.settimeout(None)
    for s in (conn, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    log("%s:%s: piped to %s:%s" % (peer[0], peer[1], where[0], where[1]))
    with lock:
        state["open"] += 1
        state["last_ok"] = time.monotonic()
    back = threading.Thread(target=copy, args=(up, conn), daemon=True)
    back.start()
    copy(conn, up)
    back.join()
    conn.close()
    up.close()
    with lock:
        state["open"] -= 1
        state["last_ok"] = time.monotonic()


def manager_answers():
    """Whether the forward to the manager is there (sshd listens on it while the manager's session lives)."""
    try:
        socket.create_connection(target(), timeout=5).close()
        return True
    except (OSError, ValueError):
        return False


def main():
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((bind, port))
    server.listen(128)
    server.settimeout(2.0)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.getsockname()[1])
    os.replace(tmp, port_file)
    log("relay on %s:%d" % (bind, server.getsockname()[1]))
    while True:
        try:
            conn, peer = server.accept()
        except socket.timeout:
            if not os.path.exists(target_file):
                log("target file removed: the experiment ended")
                return
            now = time.monotonic()
            with lock:
                busy = state["open"] > 0
            if busy or now - state["probed"] < PROBE_S:
                continue
            state["probed"] = now
            if manager_answers():
                state["last_ok"] = now
            elif now - state["last_ok"] > idle_exit:
                log("the manager's forward did not answer for %.0f s: exiting" % idle_exit)
                return
            continue
        limit = most()
        with lock:
            full = state["accepted"] >= limit
            victim = silent.pop(0) if full and silent else None
            if not full or victim is not None:
                state["accepted"] += 1
                silent.append(conn)
                full = False
        if victim is not None:  # its recv ends, its thread closes it and frees its place
            try:
                victim.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if full:
            conn.close()
            state["refused"] += 1
            if state["refused"] in (1, 10, 100) or state["refused"] % 1000 == 0:
                log("%d connection(s) refused so far: %d are open, the most this relay pipes" %
                    (state["refused"], limit))
            continue
        threading.Thread(target=serve, args=(conn, peer[:2]), daemon=True).start()


if __name__ == "__main__":
    main()
