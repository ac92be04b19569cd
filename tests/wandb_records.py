"""Read an offline W&B run file (run-ID.wandb) without a network: wandb's protobuf records in a
LevelDB-style log (a 7-byte ':W&B' header, then 32 KiB blocks of chunks: crc32, length, type, data)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK, CHUNK_HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path):
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    pos, pending = 7, b""
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:  # the block's tail is padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        chunk = data[pos + CHUNK_HEADER:pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def read_offline_run(run_dir: Path) -> dict:
    """{"run": the run record, "config": {key: value}, "history": [{metric: value} per log call],
    "artifacts": the artifact records}."""
    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    out = {"run": None, "config": {}, "history": [], "artifacts": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            out["run"] = record.run
            out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "artifact":
            out["artifacts"].append(record.artifact)
        elif kind == "history":
            out["history"].append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                                   for i in record.history.item})
    return out
