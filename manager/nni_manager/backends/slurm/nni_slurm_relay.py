"""Runs ON THE LOGIN NODE (stdlib only, Python >= 3.8), started detached by the slurm backend.

argv: <bind host> <port, 0: any> <target file> <port file> <idle exit seconds> [<max connections> [<limit file>]]
Listens on <bind host>:<port> for the agents on compute nodes and pipes each connection's bytes,
unchanged, to the address in <target file> ("127.0.0.1:<port>": the SSH remote forward back to
the manager's hub, re-read for every connection, so a reconnected manager only rewrites it). TLS
stays end to end between agent and hub: this process never sees a clear byte. Writes the port it
got to <port file>. Exits when <target file> is removed (the experiment ended), or after <idle
exit> seconds in which the manager's forward never answered (a manager that never came back).
At most <max connections> (default 256) connections are held at once, two threads each, so anyone
who can reach the port cannot make it start threads without end. A connection is piped only once
it has spoken (an agent opens with its TLS ClientHello at once): one silent for FIRST_BYTES_S is
closed, and when all places are taken the oldest silent connection gives its place to a newcomer
(only when every place pipes a connection that spoke is the newcomer closed): idle connections
from someone without the experiment's secret never keep an agent out.
The number in <limit file>, read at every connection, replaces <max connections>: the manager
rewrites it when trialConcurrency changes (the WebUI) and when a restarted manager finds this relay running.
"""
import os
import socket
import sys
import threading
import time

bind, port, target_file, port_file, idle_exit = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5])
MAX_CONNECTIONS = int(sys.argv[6]) if len(sys.argv) > 6 else 256
LIMIT_FILE = sys.argv[7] if len(sys.argv) > 7 else None
PROBE_S = 30.0
FIRST_BYTES_S = 10.0
state = {"open": 0, "accepted": 0, "refused": 0, "last_ok": time.monotonic(), "probed": 0.0}
silent = []  # type: list[socket.socket]  # not spoken yet, oldest first (under `lock`)
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


def serve(conn, peer):
    try:
        conn.settimeout(FIRST_BYTES_S)
        try:
            first = conn.recv(65536)
        except OSError:  # silent too long, or made to give way
            first = b""
        with lock:
            if conn in silent:
                silent.remove(conn)
        if not first:
            conn.close()
            return
        conn.settimeout(None)
        pipe(conn, peer, first)
    finally:
        with lock:
            state["accepted"] -= 1


def pipe(conn, peer, first):
    try:
        where = target()
        up = socket.create_connection(where, timeout=10)
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
