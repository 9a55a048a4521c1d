#!/usr/bin/env python3
"""strip_vmm_failure.py IN OUT OFFSET... -- OUT is IN with the OOM records at the given file
offsets (as `allocview dump --offsets` prints them) written as format 1.0 wrote them: without their
last field, vmm_failure (one byte: its values are below 128). The rest of each record's block moves
up one byte and the block ends in one more zero byte, which ends a block's records anyway. For the
test that allocview diagnoses an older trace as far as its figures allow."""
import struct
import sys

src, dst, offsets = sys.argv[1], sys.argv[2], [int(x) for x in sys.argv[3:]]
data = bytearray(open(src, "rb").read())
header_size = struct.unpack_from("<I", data, 12)[0]
block_size = struct.unpack_from("<I", data, 16)[0]
for off in sorted(offsets, reverse=True):
    length = data[off]
    if length == 0 or length >= 0x80:
        sys.exit("strip_vmm_failure.py: no one-byte record length at offset %d" % off)
    if data[off + length] >= 0x80:
        sys.exit("strip_vmm_failure.py: the record at %d does not end in a one-byte field" % off)
    block_end = header_size + ((off - header_size) // block_size + 1) * block_size
    rest = data[off + 1 + length:block_end]
    data[off:block_end] = bytes([length - 1]) + data[off + 1:off + length] + rest + b"\0"
struct.pack_into("<H", data, 10, 0)  # minor version 0: the records are 1.0's now
open(dst, "wb").write(data)
