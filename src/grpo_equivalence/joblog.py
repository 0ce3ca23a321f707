"""Output of a workflow job goes to its rule's log file, the Python and the C side alike."""

import contextlib
import os
import sys
import traceback


@contextlib.contextmanager
def to_log(path: str):
    """Redirects file descriptors 1 and 2 (what the trainer, tqdm and CUDA print) to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        except BaseException:
            traceback.print_exc()  # into the log too, where the user looks first
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
