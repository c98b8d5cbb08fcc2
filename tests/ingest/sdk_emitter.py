"""A product process that emits events through the SDK, for the journal tests: ``python -m tests.ingest.sdk_emitter``.

``emit N SEED``: emit N events (ids derived from SEED) and print "emitted" once ``emit`` returned for
all of them, then wait to be killed. ``flush``: open the same journal and deliver what it holds.
Configuration comes from the SDK's own settings (LIVELOOP_SDK_* in the environment).
"""

from __future__ import annotations

import sys
import time

from ingest.client import Client
from tests.ingest.sdk_events import session_events


def main(argv: list[str]) -> int:
    client = Client()
    if argv[0] == "emit":
        for event in session_events(int(argv[1]), seed=argv[2]):
            client.emit(event)
        print("emitted", flush=True)
        time.sleep(3600)  # the test kills us here, with everything still undelivered
        return 1
    delivered = client.close(timeout=120)
    print("delivered" if delivered else "undelivered", flush=True)
    return 0 if delivered else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
