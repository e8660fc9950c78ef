#!/usr/bin/env python3
"""A payout worker in Python: payout-worker's flow (payout-demo/src/worker.cc) on the fencelock
module, with the same payout store (SQLite) and the same rail (payout-rail's line protocol), so
that Python and C++ workers pay from one store side by side (payout-demo --python-workers=N).

Each payout is paid under its lock, and every store change and rail request carries the lock's
fencing token: the store admits it at its own fence in the same transaction as the change (the
fence's rule, fence/src/fence.cc: a write is refused below the highest token admitted), and the
rail at its fence. Right before the submit, the one step that moves money, the worker asks the
client whether the lease left covers the submit's worst case (D4), and stops if not.

    payout_worker.py --name=w1 --lockd=127.0.0.1:7420 --rail=127.0.0.1:9000 --store=payouts.db
                     [--session-ttl=15s] [--lock-ttl=30s] [--margin=0.3] [--poll=20ms]

Flags are payout-worker's (its fault points and --history excepted); durations are spelled as
absl spells them ("1.5s", "300ms", "1m30s"). Exits 0 when no payout is left unpaid, 1 when
stopped with work left, 2 on a bad flag.
"""
import argparse
import re
import signal
import socket
import sqlite3
import sys
import time

import fencelock

STOP = False


def duration(text):
    """Seconds in an absl duration ("1.5s", "300ms", "1m30s")."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 1.5s or 300ms")
    unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * unit[u] for n, u in parts)


class Refused(Exception):
    """A store transition the store's fence or state refused; .reason is the abandon reason."""

    def __init__(self, message, reason="store_fenced_out"):
        super().__init__(message)
        self.reason = reason


class Store:
    """The payout store (payout-demo/include/payout-demo/store.h), as the C++ worker uses it."""

    def __init__(self, path):
        # isolation_level=None: transactions are begun and ended here, as store.cc does.
        self.db = sqlite3.connect(path, timeout=10, isolation_level=None)
        self.db.execute("PRAGMA synchronous=FULL")

    def _transaction(self, body):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            result = body()
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return result

    def get(self, payout):
        row = self.db.execute(
            "SELECT state, token, amount_cents, rail_txn FROM payouts WHERE id = ?",
            (payout,)).fetchone()
        if row is None:
            raise Refused(f"no payout {payout}", "store_error")
        return {"state": row[0], "token": row[1], "amount_cents": row[2], "rail_txn": row[3]}

    def _fenced(self, payout, token, claim_must_match):
        """Admits `token` at the payout's fence (a write) and returns the payout."""
        p = self.get(payout)
        key = f"payout/{payout}"
        row = self.db.execute(
            "SELECT highest, COALESCE(highest_write, highest) FROM fence WHERE key = ?",
            (key,)).fetchone()
        highest = row[0] if row else 0
        if token < highest:
            raise Refused(f"{key}: token {token} is fenced out by {highest}")
        if row is None or row[0] != token or row[1] != token:
            self.db.execute(
                "INSERT INTO fence (key, highest, highest_write) VALUES (?, ?, ?) "
                "ON CONFLICT(key) DO UPDATE SET highest = excluded.highest, "
                "highest_write = excluded.highest_write", (key, token, token))
        if claim_must_match and p["token"] != token:
            raise Refused(f"payout {payout} is claimed under token {p['token']}, not {token}")
        return p

    def unpaid(self, limit=1000):
        return [r[0] for r in self.db.execute(
            "SELECT id FROM payouts WHERE state != 'PAID' ORDER BY id LIMIT ?", (limit,))]

    def claim(self, payout, token, worker):
        def body():
            p = self._fenced(payout, token, claim_must_match=False)
            if p["state"] != "PAID":
                state = "SUBMITTED" if p["state"] == "SUBMITTED" else "CLAIMED"
                self.db.execute(
                    "UPDATE payouts SET state = ?, token = ?, worker = ?, claims = claims + 1 "
                    "WHERE id = ?", (state, token, worker, payout))
            return p
        return self._transaction(body)

    def mark_submitted(self, payout, token):
        def body():
            p = self._fenced(payout, token, claim_must_match=True)
            if p["state"] == "CLAIMED":
                self.db.execute("UPDATE payouts SET state = 'SUBMITTED' WHERE id = ?", (payout,))
            elif p["state"] != "SUBMITTED":
                raise Refused(f"payout {payout} is {p['state']}, not CLAIMED", "store_error")
        self._transaction(body)

    def mark_paid(self, payout, token, txn):
        def body():
            p = self._fenced(payout, token, claim_must_match=True)
            if p["state"] == "PAID":
                if p["rail_txn"] != txn:
                    raise Refused(f"payout {payout} is already PAID by {p['rail_txn']}", "store_error")
                return
            if p["state"] != "SUBMITTED":
                raise Refused(f"payout {payout} is {p['state']}, not SUBMITTED", "store_error")
            self.db.execute("UPDATE payouts SET state = 'PAID', rail_txn = ?, worker = '' "
                            "WHERE id = ?", (txn, payout))
        self._transaction(body)

    def abandon(self, payout, token, worker, reason, claimed):
        """Gives the payout up (CLAIMED back to PENDING; SUBMITTED stays) and records why."""
        if claimed:
            def body():
                p = self._fenced(payout, token, claim_must_match=True)
                if p["state"] != "PAID":
                    self.db.execute(
                        "UPDATE payouts SET state = CASE state WHEN 'CLAIMED' THEN 'PENDING' "
                        "ELSE state END, worker = '' WHERE id = ?", (payout,))
            try:
                self._transaction(body)
            except Refused:
                pass  # a later worker already took it over: its state is that worker's
        self.db.execute(
            "INSERT INTO abandons (payout, token, worker, reason, at_unix_ms) "
            "VALUES (?, ?, ?, ?, ?)", (payout, token, worker, reason, int(time.time() * 1000)))


class Rail:
    """A connection to payout-rail: one request line, one reply line."""

    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self.address = (host, int(port))
        self.sock = None
        self.read_timeout = self._hello()

    def _exchange(self, line, timeout):
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.address, timeout=5)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.file = self.sock.makefile("rb")
            self.sock.settimeout(timeout)
            self.sock.sendall((line + "\n").encode())
            reply = self.file.readline(513).decode().split()
            if not reply:
                raise OSError("the rail closed the connection")
            return reply
        except OSError:
            self.close()  # its state is unknown: the next request reconnects
            raise

    def close(self):
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def _hello(self):
        reply = self._exchange("HELLO", 5)
        return int(reply[1].split("=", 1)[1]) / 1000

    def status(self, payout, token):
        return self._exchange(f"STATUS payout/{payout} {token}", self.read_timeout)

    def submit(self, payout, token, cents):
        return self._exchange(f"SUBMIT payout/{payout} {token} {cents}", self.read_timeout)


def log(name, event, payout, token, detail=""):
    """A line as payout-worker writes it, which the demo runner reads: NAME EVENT KEY token T."""
    print(f"{name} {event} payout/{payout} token {token}{' ' + detail if detail else ''}",
          flush=True)


def pay(client, store, rail, name, payout, lock, submit_cost):
    """Pays `payout` under `lock`; returns "" when it ended PAID, else why it was abandoned."""
    token = lock.token
    claimed = False
    try:
        before = store.claim(payout, token, name)
        claimed = True
        log(name, "claimed", payout, token, f"was {before['state']}")
        if before["state"] == "PAID":
            return ""
        lock.check_still_held()
        if before["state"] == "SUBMITTED":
            # An earlier holder may have reached the rail: ask before paying (fenced too).
            reply = rail.status(payout, token)
            if reply[0] == "FENCED":
                return abandon(store, name, payout, token, "rail_fenced_out", claimed)
            if reply[0] == "PAID":
                log(name, "found-paid", payout, token, f"txn {reply[1]}")
                return mark_paid(store, name, payout, token, int(reply[1]))
            if reply[0] != "UNPAID":
                return abandon(store, name, payout, token, "rail_error", claimed)
        else:
            store.mark_submitted(payout, token)
        # D4: the submit cannot be undone; it starts only if the lease covers its worst case.
        lock.begin_irreversible_step("rail_submit", worst_case=submit_cost)
        log(name, "submitting", payout, token)
        reply = rail.submit(payout, token, before["amount_cents"])
        if reply[0] in ("PAID", "DUPLICATE"):
            log(name, "submitted" if reply[0] == "PAID" else "duplicate", payout, token,
                f"txn {reply[1]}")
            return mark_paid(store, name, payout, token, int(reply[1]))
        reason = "rail_fenced_out" if reply[0] == "FENCED" else "rail_error"
        return abandon(store, name, payout, token, reason, claimed)
    except fencelock.LockLostError as lost:
        return abandon(store, name, payout, token, lost.reason, claimed)
    except Refused as refused:
        return abandon(store, name, payout, token, refused.reason, claimed)
    except sqlite3.Error as e:
        print(f"{name} store error on payout/{payout}: {e}", flush=True)
        return abandon(store, name, payout, token, "store_unavailable", claimed)
    except OSError:
        # Stays SUBMITTED if it was: the next holder asks the rail first.
        return abandon(store, name, payout, token, "rail_unavailable", claimed)


def mark_paid(store, name, payout, token, txn):
    store.mark_paid(payout, token, txn)
    log(name, "paid", payout, token, f"txn {txn}")
    return ""


def abandon(store, name, payout, token, reason, claimed):
    try:
        store.abandon(payout, token, name, reason, claimed)
    except sqlite3.Error as e:  # the next holder finds the payout as it is
        print(f"{name} could not record the abandon of payout/{payout}: {e}", flush=True)
    log(name, "abandoned", payout, token, reason)
    return reason


def main():
    flags = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    flags.add_argument("--name", required=True)
    flags.add_argument("--lockd", default="127.0.0.1:7420")
    flags.add_argument("--rail", required=True)
    flags.add_argument("--store", required=True)
    flags.add_argument("--session-ttl", type=duration, default=15.0)
    flags.add_argument("--lock-ttl", type=duration, default=30.0)
    flags.add_argument("--margin", type=float, default=0.3)
    flags.add_argument("--poll", type=duration, default=0.02)
    flags.add_argument("--connect-timeout", type=duration, default=30.0)
    for tls in ("--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"):
        flags.add_argument(tls, default="")
    args = flags.parse_args()

    def stop(signum, frame):
        global STOP
        STOP = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    rail = Rail(args.rail)
    submit_cost = rail.read_timeout + 2  # StepCost::RailSubmit: the read timeout plus 2 s
    store = Store(args.store)
    deadline = time.monotonic() + args.connect_timeout
    while True:
        try:
            client = fencelock.Client(
                server=args.lockd, session_ttl=args.session_ttl, lock_ttl=args.lock_ttl,
                margin=args.margin, name=args.name, steps={"rail_submit": submit_cost},
                tls_ca=args.tls_ca, tls_cert=args.tls_cert, tls_key=args.tls_key,
                tls_server_name=args.tls_server_name)
            break
        except fencelock.Error as e:
            if e.code != "UNAVAILABLE" or time.monotonic() > deadline:
                print(f"{args.name}: {e}", file=sys.stderr, flush=True)
                return 2 if e.code == "INVALID_ARGUMENT" else 1
            time.sleep(0.2)
    print(f"{args.name} started session {client.session_id}, rail read timeout "
          f"{rail.read_timeout}s, submit needs {submit_cost}s of lease (python)", flush=True)
    offset = hash(args.name)
    while not STOP:
        try:
            unpaid = store.unpaid()
        except sqlite3.Error as e:
            print(f"{args.name} store error: {e}", flush=True)
            time.sleep(0.1)
            continue
        if not unpaid:
            print(f"{args.name} done: no payout left unpaid", flush=True)
            return 0
        worked = False
        for i in range(len(unpaid)):
            if STOP:
                break
            payout = unpaid[(offset + i) % len(unpaid)]
            try:
                if store.get(payout)["state"] == "PAID":
                    continue  # paid by another worker meanwhile; the claim would check anyway
            except sqlite3.Error:
                pass
            try:
                lock = client.try_acquire(f"payout/{payout}", ttl=args.lock_ttl)
            except fencelock.Error as e:
                print(f"{args.name} lockd error: {e}", flush=True)
                time.sleep(0.1)
                break
            if lock is None:
                continue  # another worker holds it
            log(args.name, "acquired", payout, lock.token)
            pay(client, store, rail, args.name, payout, lock, submit_cost)
            try:
                lock.release()
                log(args.name, "released", payout, lock.token)
            except fencelock.Error as e:  # a lock already lost is given back without a request
                log(args.name, "released", payout, lock.token, e.code)
            worked = True
        offset += 1
        if not worked:
            time.sleep(args.poll)
    print(f"{args.name} stopped", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
