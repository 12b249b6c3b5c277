"""A worker for tests/detect/test_stacks_live.py: blocks in a known function forever.

``healthy``: ``train_step`` waits on stdin (standing in for a collective that waits for the
straggler). ``stuck``: ``stuck_in_collective`` sleeps in a loop. Each prints ``ready <pid>``
from inside its function, so once the test has read that line every later stack dump sees the
worker in that function. argv: mode, fault_dir.
"""

import sys
import time

from unbroken.detect.stacks import install_faulthandler


def train_step():
    print(f"ready {__import__('os').getpid()}", flush=True)
    return sys.stdin.buffer.readline()


def stuck_in_collective():
    print(f"ready {__import__('os').getpid()}", flush=True)
    while True:
        time.sleep(0.05)


if __name__ == "__main__":
    mode, fault_dir = sys.argv[1], sys.argv[2]
    install_faulthandler(fault_dir)
    if mode == "stuck":
        stuck_in_collective()
    else:
        train_step()
