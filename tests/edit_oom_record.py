#!/usr/bin/env python3
"""edit_oom_record.py IN OUT OFFSET [--strip-vmm] [--device-free N] -- OUT is IN with the OOM record
at file offset OFFSET (as `allocview dump --offsets` prints it) rewritten: --strip-vmm writes it as
format 1.0 did, without its last field vmm_failure (and marks the file 1.0); --device-free N
replaces its device_free (0: what a recorder writes when the driver could not tell). The rest of
the record's block moves to follow it, and the block's tail of zero bytes, which ends a block's
records, takes up the difference. For tests of how allocview diagnoses such records."""
import struct
import sys


def varint(data, pos):
    v = shift = 0
    while True:
        b = data[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return v, pos


def enc(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


args = sys.argv[1:]
src, dst, off = args[0], args[1], int(args[2])
strip = "--strip-vmm" in args
device_free = int(args[args.index("--device-free") + 1]) if "--device-free" in args else None
data = bytearray(open(src, "rb").read())
header_size, block_size = struct.unpack_from("<II", data, 12)
length, body = varint(data, off)
end = body + length
OOM, SAME_DEV, SAME_THREAD, SAME_STREAM, SAME_STACK = 38, 0x01, 0x02, 0x04, 0x40
pos = body
if data[pos] != OOM:
    sys.exit("edit_oom_record.py: the record at %d is not an OOM (type %d)" % (off, data[pos]))
pos += 1
_, pos = varint(data, pos)  # seq_delta
flags = data[pos]
pos += 1
_, pos = varint(data, pos)  # dt
for bit in (SAME_DEV, SAME_THREAD, SAME_STREAM, SAME_STACK):
    if not flags & bit:
        _, pos = varint(data, pos)
prefix = bytes(data[body:pos])
fields = []
while pos < end:
    v, pos = varint(data, pos)
    fields.append(v)
if len(fields) != 8:
    sys.exit("edit_oom_record.py: the record at %d has %d fields after its prefix, not an OOM of format 1.1's 8" % (off, len(fields)))
if device_free is not None:
    fields[5] = device_free
if strip:
    fields = fields[:7]
    struct.pack_into("<H", data, 10, 0)
new_body = prefix + b"".join(enc(v) for v in fields)
record = enc(len(new_body)) + new_body
block_end = header_size + ((off - header_size) // block_size + 1) * block_size
rest = bytes(data[end:block_end])
grow = len(record) - (end - off)
if grow > 0:
    if rest[len(rest) - grow:] != b"\0" * grow:
        sys.exit("edit_oom_record.py: no room left in the record's block")
    rest = rest[:len(rest) - grow]
else:
    rest += b"\0" * -grow
data[off:block_end] = record + rest
open(dst, "wb").write(data)
