import sys

import fencelock

client = fencelock.Client(server=sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7420")
with client.lock("payout/42", wait=5) as lock:  # released at the end of the block
    lock.check_still_held()  # raises fencelock.LockLostError once it may be gone
    lock.begin_irreversible_step("pay", worst_case=2)  # or fencelock.StepRefusedError
    print("paying payout/42 with token", lock.token)  # the payee checks it
client.close()
