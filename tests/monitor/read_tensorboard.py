#!/usr/bin/env python3
"""Reads TensorBoard event files as TensorBoard does, with readers that are not trident's:
the TFRecord framing with its masked CRC-32C checked by the crc32c package, each record
decoded by the protobuf library on TensorBoard's schema (tensorboard_events.proto,
compiled here by protoc). Prints one JSON object per event:
  {"file", "wall_time", "step", "file_version" | "session_log" | "scalars" | "texts"}
and exits 1 on any malformed record.

  read_tensorboard.py FOLDER
"""
import glob
import importlib
import json
import os
import struct
import subprocess
import sys
import tempfile

import crc32c


def masked(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            raise ValueError(f"{path}: a record header cut at byte {at}")
        length, length_crc = struct.unpack_from("<QI", data, at)
        if masked(data[at:at + 8]) != length_crc:
            raise ValueError(f"{path}: the length's CRC at byte {at} is wrong")
        body = data[at + 12:at + 12 + length]
        (body_crc,) = struct.unpack_from("<I", data, at + 12 + length)
        if masked(body) != body_crc:
            raise ValueError(f"{path}: the data CRC of the record at byte {at} is wrong")
        yield body
        at += 12 + length + 4


def main():
    folder = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["protoc", f"--proto_path={here}", f"--python_out={out}", "tensorboard_events.proto"], check=True)
        sys.path.insert(0, out)
        schema = importlib.import_module("tensorboard_events_pb2")
        for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
            for body in records(path):
                event = schema.Event()
                event.ParseFromString(body)
                item = {"file": os.path.basename(path), "wall_time": event.wall_time, "step": event.step}
                what = event.WhichOneof("what")
                if what == "file_version":
                    item["file_version"] = event.file_version
                elif what == "session_log":
                    item["session_log"] = schema.SessionLog.SessionStatus.Name(event.session_log.status)
                elif what == "summary":
                    scalars, texts = {}, {}
                    for value in event.summary.value:
                        kind = value.WhichOneof("value")
                        if kind == "simple_value":
                            scalars[value.tag] = value.simple_value
                        elif kind == "tensor" and value.tensor.dtype == schema.DT_STRING:
                            texts[value.tag] = {"text": value.tensor.string_val[0].decode(),
                                                "plugin": value.metadata.plugin_data.plugin_name}
                    if scalars:
                        item["scalars"] = scalars
                    if texts:
                        item["texts"] = texts
                print(json.dumps(item))


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:
        print(f"read_tensorboard.py: {e}", file=sys.stderr)
        sys.exit(1)
