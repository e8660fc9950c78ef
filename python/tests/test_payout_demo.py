"""The payout demo with Python and C++ workers paying from one store through one rail (issue 41).

Run by CTest as python_payout_demo_test, with PAYOUT_DEMO naming the payout-demo binary (built
with the Python worker's paths). The faults strike the C++ workers w1 (frozen past its session
TTL) and w2 (killed); w3 and w4 are Python workers. Every payout must be paid exactly once, and
the Python workers must have paid some of them.
"""
import json
import os
import re
import subprocess
import tempfile
import unittest

DEMO = os.environ.get("PAYOUT_DEMO", "payout-demo")


class MixedDemoTest(unittest.TestCase):
    def test_python_and_cpp_workers_pay_every_payout_exactly_once(self):
        with tempfile.TemporaryDirectory(prefix="fencelock-mixed-") as tmp:
            state = os.path.join(tmp, "run")
            report = os.path.join(tmp, "report.json")
            run = subprocess.run(
                [DEMO, "--workers=4", "--python-workers=2", "--payouts=150",
                 "--state-dir=" + state, "--keep-state", "--report-json=" + report],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
            print(run.stdout)
            self.assertEqual(run.returncode, 0)
            self.assertIn("started 4 workers (the last 2 in Python)", run.stdout)
            self.assertIn("w1 frozen (SIGSTOP", run.stdout)
            self.assertIn("w2 killed (SIGKILL)", run.stdout)
            self.assertIn("RESULT: OK", run.stdout)
            with open(report) as f:
                result = json.load(f)
            self.assertEqual(result.get("paid_once"), 150)
            self.assertEqual(result.get("paid_twice", 0), 0)
            self.assertEqual(result.get("left", 0), 0)
            for name in ("w3", "w4"):
                with open(os.path.join(state, "logs", name + ".log")) as f:
                    log = f.read()
                self.assertIn(f"{name} started session", log)
                self.assertIn("(python)", log)
                paid = re.findall(rf"^{name} paid payout/\d+ token \d+", log, re.M)
                self.assertGreater(len(paid), 0, f"{name} paid nothing:\n{log}")

    def test_flags_that_cannot_mix_are_refused(self):
        for flags, says in ((["--workers=3", "--python-workers=2"], "at most --workers minus 2"),
                            (["--python-workers=5"], "--python-workers must be 0 to --workers"),
                            (["--workers=4", "--python-workers=1", "--ha"], "does not run with --ha")):
            run = subprocess.run([DEMO] + flags, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertEqual(run.returncode, 2, run.stdout)
            self.assertIn(says, run.stdout)


if __name__ == "__main__":
    unittest.main()
