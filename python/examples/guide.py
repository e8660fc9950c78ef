"""The Python code docs/client.md shows, word for word (doc_snippets_test checks it), run by
python/tests/test_fencelock.py against a real lockd."""
import fencelock


def pay_once(client, payout_id, submit):
    """Pays payout_id under its lock: the step check right before the irreversible call."""
    with client.lock(f"payout/{payout_id}", wait=5) as lock:
        lock.check_still_held()  # raises fencelock.LockLostError once the lease may be gone
        lock.begin_irreversible_step("rail_submit", worst_case=2.5)  # or StepRefusedError
        submit(payout_id, token=lock.token)  # the rail's fence refuses an older token
