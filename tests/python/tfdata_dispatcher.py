#!/usr/bin/env python3
"""TensorFlow 2.21's own tf.data service dispatcher, for the benchmark's
comparison (`coordstore-bench tfdata`).

  tfdata_dispatcher.py --port P [--work-dir DIR]
      a DispatchServer on P (with DIR: fault_tolerant_mode, journaled in
      DIR); prints `DATASET <hex>` (a serialized DatasetDef of range(2**40),
      for registering), `STARTED <seconds>` (construction, journal replay
      included) and READY, then serves until stdin closes.
"""

from __future__ import annotations

import argparse
import sys


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--work-dir")
    args = ap.parse_args()
    import tensorflow as tf

    import time

    dsvc = tf.data.experimental.service
    started = time.monotonic()
    config = dsvc.DispatcherConfig(
        port=args.port,
        fault_tolerant_mode=bool(args.work_dir),
        work_dir=args.work_dir,
    )
    server = dsvc.DispatchServer(config)
    # The dispatcher serves once its constructor returns (a fault-tolerant
    # one has replayed its journal by then).
    print(f"STARTED {time.monotonic() - started:.4f}", flush=True)
    # range(2**40): splits enough for any DYNAMIC measurement.
    graph = tf.data.Dataset.range(2**40)._as_serialized_graph().numpy()
    dataset_def = b"\x0a" + varint(len(graph)) + graph
    print(f"DATASET {dataset_def.hex()}", flush=True)
    print("READY", flush=True)
    sys.stdin.read()
    del server


if __name__ == "__main__":
    main()
