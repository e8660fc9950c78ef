"""The fencelock Python module against a real lockd (issue 41).

Run by CTest as python_client_test, with PYTHONPATH naming the built module and
FENCELOCK_LOCKD the lockd binary. Each test class starts its own lockd on a port the kernel
picks, in a fresh directory, and stops it (a lockd that does not exit cleanly fails the run).
"""
import datetime
import math
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import fencelock

LOCKD = os.environ.get("FENCELOCK_LOCKD", "lockd")


class Lockd:
    """A lockd on a fresh state directory and a free loopback port."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="fencelock-python-")
        state = os.path.join(self.dir.name, "state")
        port_file = os.path.join(self.dir.name, "port")
        subprocess.run([LOCKD, "init", "--data-dir=" + state], check=True,
                       stdout=subprocess.DEVNULL)
        self.log = open(os.path.join(self.dir.name, "lockd.log"), "w")
        self.process = subprocess.Popen(
            [LOCKD, "serve", "--data-dir=" + state, "--port=0", "--port-file=" + port_file,
             "--metrics-port=-1",
             "--admission-lock=" + os.path.join(self.dir.name, "admission.lock")],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not (os.path.exists(port_file) and open(port_file).read().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("lockd did not start: " + self.read_log())
            time.sleep(0.05)
        self.address = "127.0.0.1:" + open(port_file).read().strip()

    def read_log(self):
        self.log.flush()
        return open(self.log.name).read()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=10)
        self.log.close()
        log = open(self.log.name).read()
        self.dir.cleanup()
        if code != 0:
            raise RuntimeError("lockd exited with %d: %s" % (code, log))


class LockdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.lockd = Lockd()

    @classmethod
    def tearDownClass(cls):
        cls.lockd.stop()

    def client(self, **options):
        options.setdefault("name", self.id().rsplit(".", 1)[-1])
        client = fencelock.Client(server=self.lockd.address, **options)
        self.addCleanup(client.close)
        return client


class ExceptionTypesTest(unittest.TestCase):
    def test_the_hierarchy_callers_catch_by(self):
        self.assertTrue(issubclass(fencelock.StepRefusedError, fencelock.LockLostError))
        self.assertTrue(issubclass(fencelock.AcquireTimeoutError, fencelock.Error))
        self.assertTrue(issubclass(fencelock.AcquireTimeoutError, TimeoutError))
        self.assertFalse(issubclass(fencelock.LockLostError, fencelock.Error))


class LockTest(LockdTest):
    def test_acquire_release_and_rising_tokens(self):
        a, b = self.client(), self.client()
        first = a.acquire("rising", wait=5)
        self.assertIsInstance(first.token, int)
        self.assertGreater(first.token, 0)
        self.assertEqual(first.name, "rising")
        self.assertFalse(first.shared)
        with self.assertRaises(fencelock.AcquireTimeoutError) as waited:
            b.acquire("rising", wait=0.2)
        self.assertEqual(waited.exception.code, "DEADLINE_EXCEEDED")
        self.assertIsNone(b.try_acquire("rising"))
        first.release()
        second = b.acquire("rising", wait=datetime.timedelta(seconds=5))
        self.assertGreater(second.token, first.token)
        b.release(second)

    def test_a_with_block_holds_the_lock_and_releases_it(self):
        a, b = self.client(), self.client()
        with a.lock("scoped", wait=5) as lock:
            lock.check_still_held()
            self.assertIsNone(b.try_acquire("scoped"))
        taken = b.try_acquire("scoped")
        self.assertIsNotNone(taken)
        self.assertGreater(taken.token, lock.token)
        taken.release()

    def test_a_with_block_that_raises_still_releases(self):
        a, b = self.client(), self.client()
        with self.assertRaises(KeyError):
            with a.lock("raising", wait=5):
                raise KeyError("the block's own error")
        self.assertIsNotNone(b.try_acquire("raising"))

    def test_shared_holders_coexist(self):
        a, b, c = self.client(), self.client(), self.client()
        r1 = a.acquire("readers", wait=5, shared=True)
        r2 = b.acquire("readers", wait=5, shared=True)
        self.assertTrue(r1.shared and r2.shared)
        self.assertIsNone(c.try_acquire("readers"))
        r1.release()
        r2.release()
        self.assertIsNotNone(c.try_acquire("readers"))

    def test_the_step_check_refuses_what_the_lease_cannot_cover(self):
        client = self.client(session_ttl=10, lock_ttl=10, margin=0.3)
        lock = client.acquire("steps", wait=5)
        left = lock.remaining()
        self.assertGreater(left, 0)
        self.assertLessEqual(left, 10 * 0.7)
        lock.begin_irreversible_step("short", worst_case=0.5)
        with self.assertRaises(fencelock.StepRefusedError) as refused:
            lock.begin_irreversible_step("a_day", worst_case=datetime.timedelta(days=1))
        e = refused.exception
        self.assertIsInstance(e, fencelock.LockLostError)
        self.assertEqual((e.lock, e.token, e.step, e.reason),
                         ("steps", lock.token, "a_day", "insufficient_lease"))
        self.assertEqual(e.cost, 86400)
        self.assertLess(e.remaining, e.cost)
        self.assertIn('lock_steps_abandoned_total{reason="insufficient_lease",step="a_day"} 1',
                      client.metrics_text())
        lock.check_still_held(confirm_with_server=True)
        lock.release()
        with self.assertRaises(fencelock.LockLostError) as lost:
            lock.check_still_held()
        self.assertEqual(lost.exception.reason, "released")

    def test_the_guides_example_pays_once_under_its_lock(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                        "examples"))
        import guide
        client = self.client(session_ttl=10, lock_ttl=10)
        paid = []
        guide.pay_once(client, 7, lambda payout, token: paid.append((payout, token)))
        self.assertEqual(len(paid), 1)
        self.assertEqual(paid[0][0], 7)
        after = self.client().try_acquire("payout/7")  # the with block released it
        self.assertGreater(after.token, paid[0][1])
        after.release()

    def test_close_ends_the_session_and_its_locks(self):
        a, b = self.client(), self.client()
        lock = a.acquire("closed", wait=5)
        a.close()
        with self.assertRaises(fencelock.Error) as closed:
            lock.remaining()
        self.assertEqual(closed.exception.code, "CANCELLED")
        self.assertIsNotNone(b.acquire("closed", wait=5))

    def test_blocking_calls_release_the_gil(self):
        a, b = self.client(), self.client()
        held = a.acquire("gil", wait=5)
        outcome = []

        def wait_for_it():
            try:
                b.acquire("gil", wait=3)
                outcome.append("granted")
            except fencelock.AcquireTimeoutError:
                outcome.append("timed out")

        waiter = threading.Thread(target=wait_for_it)
        waiter.start()
        time.sleep(0.2)  # the waiter is now inside acquire
        spins = 0
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            spins += 1
        # This thread ran Python while the other one waited in acquire: had acquire kept the
        # GIL, this loop could only have run after it returned.
        self.assertTrue(waiter.is_alive())
        self.assertGreater(spins, 0)
        held.release()
        waiter.join()
        self.assertEqual(outcome, ["granted"])


class InterruptTest(LockdTest):
    """Issue 59: Ctrl-C during an acquire's wait, and a grant that crosses it."""

    def interrupt_after(self, seconds):
        timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        self.addCleanup(timer.cancel)

    def test_ctrl_c_ends_a_wait_and_leaves_the_queue(self):
        holder, waiter, third = self.client(), self.client(), self.client()
        held = holder.acquire("interrupted", wait=5)
        self.interrupt_after(0.5)
        start = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            waiter.acquire("interrupted", wait=30)
        # Raised while the wait had most of its 30 s to go (it used to end only with the wait).
        self.assertLess(time.monotonic() - start, 10)
        held.release()
        after = third.acquire("interrupted", wait=5)  # the waiter left the queue: not granted
        self.assertEqual(after.token, held.token + 1)

    def test_a_grant_that_crosses_ctrl_c_is_released_at_once(self):
        holder, waiter, third = self.client(), self.client(), self.client()
        held = holder.acquire("crossed", wait=5)

        def on_interrupt(signum, frame):
            held.release()  # lockd grants the waiter now...
            time.sleep(0.5)  # ...and the grant is in before the handler ends the wait
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, on_interrupt)
        self.addCleanup(signal.signal, signal.SIGINT, previous)
        self.interrupt_after(0.3)
        with self.assertRaises(KeyboardInterrupt):
            waiter.acquire("crossed", wait=30, ttl=3)
        # The caller never got the grant, so it was given back: free now, not held by the
        # waiter's session for as long as it lives.
        after = third.try_acquire("crossed")
        self.assertIsNotNone(after)
        self.assertEqual(after.token, held.token + 2)  # the waiter's grant came in between


class BadInputTest(LockdTest):
    def test_bad_arguments_are_refused_with_a_clear_error(self):
        client = self.client()
        with self.assertRaises(TypeError):
            client.acquire("x", wait="soon")
        for wait in (-1, math.nan, math.inf):
            with self.assertRaises(ValueError):
                client.acquire("x", wait=wait)
        with self.assertRaises(fencelock.Error) as bad:
            client.acquire("", wait=1)
        self.assertEqual(bad.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(fencelock.Error) as margin:
            fencelock.Client(server=self.lockd.address, margin=1.5)
        self.assertEqual(margin.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(fencelock.Error) as address:
            fencelock.Client(server="no port here")
        self.assertEqual(address.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(TypeError):
            fencelock.Client(self.lockd.address)  # keyword arguments only
        with self.assertRaises(TypeError) as margin_type:
            fencelock.Client(server=self.lockd.address, margin="0.3")
        self.assertIn("margin must be a number", str(margin_type.exception))

    def test_a_ttl_under_a_millisecond_is_refused_as_one_under_the_minimum(self):
        # Issue 59: 0.5 ms went on the wire as 0, lockd's "use the default" (30 s, 15 s).
        client = self.client()
        refused = {}
        for ttl in (0.005, 0.0005):
            with self.assertRaises(fencelock.Error) as bad:
                client.acquire("tiny-ttl", wait=1, ttl=ttl)
            refused[ttl] = bad.exception
        self.assertEqual(refused[0.0005].code, refused[0.005].code)
        self.assertIn("outside", str(refused[0.0005]))
        for ttl in (0.005, 1e-6):
            with self.assertRaises(fencelock.Error) as bad:
                fencelock.Client(server=self.lockd.address, session_ttl=ttl)
            self.assertEqual(bad.exception.code, refused[0.005].code)
            self.assertIn("outside", str(bad.exception))

    def test_a_lockd_out_of_reach_is_unavailable(self):
        with socket_bound_nowhere() as address:
            with self.assertRaises(fencelock.Error) as unreachable:
                fencelock.Client(server=address, connect_timeout=1)
        self.assertEqual(unreachable.exception.code, "UNAVAILABLE")


class socket_bound_nowhere:
    """An address on which nothing listens: a port the kernel gave and that was then closed."""

    def __enter__(self):
        import socket
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % s.getsockname()[1]
        s.close()
        return self.address

    def __exit__(self, *unused):
        return False


PAUSED_WORKER = textwrap.dedent("""
    import sys
    import fencelock
    client = fencelock.Client(server=sys.argv[1], session_ttl=1.5, lock_ttl=1.5, margin=0.3,
                              name="paused-worker")
    lock = client.acquire("paused", wait=5)
    print(lock.token, flush=True)
    sys.stdin.readline()  # the test stops this process here, past its lease, then resumes it
    try:
        lock.begin_irreversible_step("rail_submit", worst_case=0.1)
        print("acted", flush=True)
    except fencelock.LockLostError as lost:
        print("refused", type(lost).__name__, lost.reason, flush=True)
""")


class PauseRuleTest(LockdTest):
    def test_a_worker_paused_past_its_lease_does_not_act_when_it_resumes(self):
        worker = subprocess.Popen([sys.executable, "-c", PAUSED_WORKER, self.lockd.address],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=os.environ)
        self.addCleanup(worker.kill)
        paused_token = int(worker.stdout.readline())
        worker.send_signal(signal.SIGSTOP)
        # Another worker is granted the lock once lockd's lease on it has run out, with a
        # higher token.
        successor = self.client().acquire("paused", wait=10)
        self.assertGreater(successor.token, paused_token)
        worker.send_signal(signal.SIGCONT)
        worker.stdin.write("go\n")
        worker.stdin.flush()
        said = worker.stdout.readline().split()
        self.assertEqual(said, ["refused", "LockLostError", "deadline_passed"])
        self.assertEqual(worker.wait(timeout=10), 0)
        successor.release()


if __name__ == "__main__":
    unittest.main()
