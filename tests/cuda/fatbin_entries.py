#!/usr/bin/env python3
"""Lists what a CUDA fat binary holds: one line per entry, "ptx 90" or "elf 80".

The input is the .nv_fatbin section of an object (objcopy -O binary
--only-section=.nv_fatbin x.o x.fatbin). Format (as cuobjdump reads it): a header
(magic 0xBA55ED50, version, header size, payload size), then entries, each with a
header of its own: kind (1 PTX, 2 ELF), header size, payload size, ..., and at byte 28
the architecture (80 for sm_80 / compute_80).
"""
import struct
import sys

MAGIC = 0xBA55ED50
KINDS = {1: "ptx", 2: "elf"}

data = open(sys.argv[1], "rb").read()
pos = 0
while pos + 16 <= len(data):
    magic, _version, header_size, payload = struct.unpack_from("<IHHQ", data, pos)
    if magic != MAGIC:
        break
    entry, end = pos + header_size, pos + header_size + payload
    while entry < end:
        kind, _, entry_header, size = struct.unpack_from("<HHIQ", data, entry)
        arch = struct.unpack_from("<I", data, entry + 28)[0]
        print(KINDS.get(kind, str(kind)), arch)
        entry += entry_header + size
    pos = end
