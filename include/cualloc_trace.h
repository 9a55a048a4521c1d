/* cualloc_trace.h — the trace file format, version 1.2. This header is the specification: the
 * recorder (src/trace.c) writes what it says, the reader (tools/allocview/reader.c) reads what it
 * says, and any other C reader may include it. It declares constants only; no code.
 *
 * ---------------------------------------------------------------------------------------- goals
 * A trace survives the crash it explains. The recorder writes through a shared mapping of the
 * file, and every record is committed by writing the first byte of its length last; so after a
 * SIGKILL, the kernel's OOM killer or an abort, every record the process finished is in the file
 * and nothing half-written looks like a record. A full disk stops tracing with a message, never a
 * SIGBUS: each block is reserved with posix_fallocate before it is mapped.
 *
 * ---------------------------------------------------------------------------------------- layout
 * All integers are little-endian. The file is
 *
 *   [file header: CUA_TRACE_HEADER_SIZE bytes][block 0][block 1]...
 *
 * block i starting at header_size + i * block_size. The file header:
 *
 *   offset size field
 *        0    8 magic          "CUATRACE"
 *        8    2 major          CUA_TRACE_MAJOR; a reader refuses a larger major, naming both
 *       10    2 minor          CUA_TRACE_MINOR; a larger minor only adds record types (skipped)
 *       12    4 header_size    bytes before block 0 (4096, or the page size where larger; readers accept 64 .. 65536)
 *       16    4 block_size     bytes per block, a power of two (65536; readers accept 256 .. 2^24)
 *       20    4 flags          CUA_TRACE_FILE_RING: the event blocks are a ring (see below)
 *       24    8 max_blocks     the most blocks the file may hold; 0 = unbounded
 *       32    8 reserved       0
 *
 * ---------------------------------------------------------------------------------------- blocks
 * A block holds records of one kind: META blocks hold the definitions (process, configuration,
 * devices, modules, threads, streams, Python frames, stack nodes), EVENT blocks hold what happened
 * (allocations, frees, maps, marks, ...). The recorder appends to one block of each kind at a
 * time, so the two kinds interleave in the file. A block starts with a 32-byte header:
 *
 *   offset size field
 *        0    4 magic          CUA_TRACE_BLOCK_MAGIC ("CUAB"); 0 = block not (yet) written
 *        4    1 kind           CUA_TRACE_BLOCK_META or CUA_TRACE_BLOCK_EVENTS
 *        5    1 reserved       0
 *        6    2 check          cua_trace_block_check() of bytes 4..31 (check itself taken as 0)
 *        8    8 serial         0, 1, 2, ... per kind, in the order the recorder used the blocks
 *       16    8 seq_base       the sequence number "before" the block's first record
 *       24    8 base_time      ns; the time the block's first event's delta is taken from
 *
 * The magic is written last, so a block whose magic is 0 is one the recorder had reserved but not
 * started (skip it). Records follow the header, up to the end of the block; a record never spans
 * two blocks. A length of 0 (the zero fill of an unused tail) ends the block's records.
 *
 * Sequence numbers count every record of the file, both kinds, from 1. Each kind's records are in
 * sequence order, so a reader merges the two kinds by sequence number and sees every definition
 * before its first use. Within a block, each record's sequence number is the previous one's (the
 * block's seq_base for the first) plus its seq_delta, which is at least 1.
 *
 * Linear files (no RING flag) use blocks in file order: a reader can stream them, following each
 * kind forward through the file. With trace_max_mb set, the recorder stops at the limit, ending
 * the trace with an END record (reason CUA_TRACE_END_LIMIT).
 *
 * Ring files (CUA_TRACE_FILE_RING, trace_max_mb with trace_ring:1) hold at most max_blocks blocks.
 * META blocks are never overwritten (they may take at most half the blocks; past that, new stacks,
 * threads and streams are recorded as id 0, unknown). When the file is full, the recorder reuses
 * the EVENT block with the lowest serial, for events or, when definitions need a new block, as a
 * META block (with the next META serial): it clears the magic, zeroes the block, writes the new
 * header and commits the magic. A reader therefore reads all block headers, keeps the valid
 * blocks, and reads each kind in serial order (equivalently seq_base order; for META blocks file
 * order is not serial order once one has taken an EVENT block's place), the EVENT blocks starting
 * from the lowest serial present: the oldest surviving events. A serial gap at the start means older events were
 * overwritten; that is expected in a ring and is not an error.
 *
 * --------------------------------------------------------------------------------------- records
 *   record  = varint length, body[length]
 *   body    = u8 type, varint seq_delta, payload
 *
 * The length counts the body. The recorder writes the body, then the length's later bytes, then
 * the length's first byte (a release store): a record whose length is visible is complete. A
 * reader skips a record whose type it does not know (using the length); a record of a known type
 * whose payload is shorter than its layout, or whose fields overrun the length, is corrupt.
 * Payload bytes after the fields a reader knows are ignored (room for additions in a minor
 * version). Records a reader does not know never take part in the delta state below: a change
 * that would need them to is a new major version.
 *
 * Encodings:
 *   varint   unsigned LEB128: 7 bits per byte, least significant first, high bit = more. At most
 *            10 bytes; the 10th may only be 0 or 1 (a reader rejects anything longer or larger).
 *   svarint  a signed value zigzag-encoded (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...) then as varint.
 *   string   varint byte count, then the bytes (UTF-8 as the process had them, no NUL).
 *   u8       one byte.
 *
 * ------------------------------------------------------------------------- event delta encoding
 * Event records (types 32 and up) begin with the common prefix
 *
 *   u8 flags, varint dt, [varint dev], [varint thread]
 *
 * and are delta-encoded against the state of their block, which starts at every block's header as
 *   time = base_time, dev = 0, thread = 0, stream = 0, stack = 0, addr[every device] = 0
 * and is updated by every event record a reader knows:
 *   time   += dt (ns; the recorder's clock, see PROCESS.clock)
 *   dev     = the dev field, or unchanged when flags has CUA_TRACE_F_SAME_DEV
 *   thread  = the thread field, or unchanged with CUA_TRACE_F_SAME_THREAD
 *   stream  = the stream field where the layout has one, unless CUA_TRACE_F_SAME_STREAM
 *   stack   = the stack field where the layout has one, unless CUA_TRACE_F_SAME_STACK
 *   addr[dev] = the address, where the layout has an "addr" field; it is written as an svarint
 *             delta against addr[dev]. Addresses and sizes are in units of CUA_TRACE_UNIT (512 B)
 *             unless flags has CUA_TRACE_F_BYTES (then in bytes; the delta too).
 * Devices are 0 .. CUA_TRACE_MAX_DEVICES-1. Thread, stream and stack fields are ids defined by
 * THREAD, STREAM and STACK records; 0 means unknown / none. Flag bits not defined below must be 0
 * (a reader rejects the record: they would change its layout).
 *
 * ------------------------------------------------------------------------------ record layouts
 * Fields in [brackets] are present or absent as the flags say. "size" fields of events are in
 * units of 512 B (or bytes with F_BYTES); OOM and definition records use bytes.
 *
 * META records:
 *   PROCESS   varint pid, varint ppid, svarint rank (-1: none), varint start_realtime_ns (since the
 *             epoch), varint start_monotonic_ns, u8 clock (CUA_TRACE_CLOCK_*), string host,
 *             string command line (arguments separated by spaces), string recorder ("cualloc X.Y.Z")
 *   CONFIG    string configuration (every CUALLOC_CONF key, "key:value,...")
 *   DEVICE    varint dev, varint total_bytes (device memory), varint capacity_bytes (what the heap
 *             may reserve), varint granularity, u8 mode (CUA_TRACE_MODE_*), string name
 *   MODULE    varint base (the load bias: file virtual address + base = run-time address),
 *             varint start, varint end (run-time address range of its loaded segments),
 *             string path, string build_id (raw bytes of the GNU build-id note; may be empty).
 *             A later MODULE covering the same addresses replaces an earlier one (dlclose/dlopen).
 *   THREAD    varint id (1, 2, ...), varint os_tid, string name
 *   STREAM    varint id (1, 2, ...), varint handle (the CUstream / cudaStream_t value; 0 = legacy)
 *   PYFRAME   varint id (1, 2, ...), varint line, string function, string file
 *   STACK     varint id, varint parent (0: the root), u8 frame kind (CUA_TRACE_FRAME_*),
 *             varint value (NATIVE: a return address, i.e. the instruction after the call — a
 *             symbolizer looks up value - 1; PYTHON: a PYFRAME id).
 *             Stacks form a tree: a stack id names a node; its frames are the node (the innermost
 *             frame), its parent, and so on up to the root (the outermost frame). Python frames,
 *             when the allocating thread held the GIL, are the outer part of a stack: the native
 *             frames below the interpreter follow them, innermost last. Ids are 1, 2, ... in
 *             record order, and a node's parent is always defined before it.
 *
 * EVENT records (common prefix first, see above):
 *   ALLOC       [stream], svarint addr, varint size, [varint slack], [stack]
 *               an allocation: size is the allocated (rounded) size; the caller asked for
 *               size*unit - slack bytes (slack absent = 0, with F_EXACT). The stack is the call
 *               site (0: not captured).
 *   FREE        [stream], svarint addr, varint size
 *               a free was requested on `stream` (the free's stream, not the allocation's). With
 *               F_COMPLETED the memory was reusable at once and no FREE_DONE follows.
 *   FREE_DONE   [stream], svarint addr, varint size
 *               a stream-ordered free completed: the block at addr may be reused.
 *   MAP         svarint addr, varint size   physical memory was mapped (VMM chunks, or a segment
 *               was cuMemAlloc'd in classic mode): reserved memory grows by size.
 *   UNMAP       svarint addr, varint size   the reverse: reserved memory shrinks by size.
 *   TRIM        (nothing)   an explicit release of cached memory (cualloc_trim, empty_cache); the
 *               UNMAPs it caused follow. Replay repeats it.
 *   OOM         [stream], [stack], varint requested, varint rounded, varint capacity,
 *               varint allocated, varint reserved, varint device_free, varint largest_free_block
 *               (all bytes), then from format 1.1 varint vmm_failure: an allocation failed even
 *               after releasing cache; the heap's state then. device_free is the driver's
 *               free-memory reading at the failure (0 where it could not tell): with reserved it
 *               separates a full device from fragmentation. vmm_failure (CUA_TRACE_VMM_*) says why
 *               expandable segments failed a request that fit in what the heap held plus the
 *               device's free memory, or that freed memory was still waiting (either kind of
 *               segments), which the figures cannot tell; a record without it (format
 *               1.0, or a writer with nothing to say, such as an imported snapshot) reads as 0.
 *   MARK        string label   cualloc_mark(): names a step or phase (dev is meaningless).
 *   INIT_BLOCK  as ALLOC: a block that was already allocated when recording started (traces
 *               started mid-run, imported snapshots). Not an allocation event.
 *   INIT_MAP    as MAP: physical memory already mapped when recording started.
 *   END         varint reason (CUA_TRACE_END_*), varint dropped (events not recorded: a signal
 *               handler allocated inside the recorder), varint ndev, then per device:
 *               varint dev, varint nfields, nfields x varint — the process's own statistics in
 *               the order of enum cua_trace_stat (a reader ignores fields past those it knows).
 *               The last record of a complete trace; absent when the process died.
 *   LOST        varint table (CUA_TRACE_LOST_*), varint ago (ns), from format 1.2: the recorder
 *               was refused host memory for one of its tables `ago` ns before this record's time,
 *               so records from then on may lack what that table holds: an ALLOC or OOM its
 *               stack (0; a stack with a Python frame the recorder could not define or name goes
 *               without, whole), an event its stream (0), a native frame its module (no name).
 *               Written once per table and file, before the record that went without (ago 0),
 *               and in a ring again at the start of each new event block (the block with the
 *               first may be reused while the records after it survive). dev and thread are the
 *               state's: they mean nothing. The record takes no part in the delta state, so a
 *               reader that does not know it skips it and reads the same records. Without it, a
 *               missing stack or name is the program's (a thread in a signal handler, a frame in
 *               no module).
 */
#ifndef CUALLOC_TRACE_H
#define CUALLOC_TRACE_H

#include <stdint.h>

#define CUA_TRACE_MAGIC "CUATRACE"
#define CUA_TRACE_MAGIC_LEN 8
#define CUA_TRACE_MAJOR 1
#define CUA_TRACE_MINOR 2
#define CUA_TRACE_HEADER_SIZE 4096u          /* what the recorder writes on 4 KiB pages (else a page) */
#define CUA_TRACE_BLOCK_SIZE 65536u          /* what the recorder writes */
#define CUA_TRACE_BLOCK_HEADER 32u
#define CUA_TRACE_BLOCK_MAGIC 0x42415543u    /* "CUAB" as a little-endian u32 */
#define CUA_TRACE_FILE_RING 1u               /* file header flags */
#define CUA_TRACE_UNIT 512u                  /* unit of event addresses and sizes */
#define CUA_TRACE_MAX_DEVICES 256            /* device ordinals are below this */
#define CUA_TRACE_VARINT_MAX 10              /* bytes */

/* File header field offsets. */
#define CUA_TRACE_OFF_MAJOR 8
#define CUA_TRACE_OFF_MINOR 10
#define CUA_TRACE_OFF_HEADER_SIZE 12
#define CUA_TRACE_OFF_BLOCK_SIZE 16
#define CUA_TRACE_OFF_FLAGS 20
#define CUA_TRACE_OFF_MAX_BLOCKS 24

/* Block header field offsets. */
#define CUA_TRACE_BOFF_KIND 4
#define CUA_TRACE_BOFF_CHECK 6
#define CUA_TRACE_BOFF_SERIAL 8
#define CUA_TRACE_BOFF_SEQ_BASE 16
#define CUA_TRACE_BOFF_BASE_TIME 24

enum cua_trace_block_kind { CUA_TRACE_BLOCK_META = 1, CUA_TRACE_BLOCK_EVENTS = 2 };

/* Record types. 1..31 are definitions (META blocks), 32.. are events (EVENT blocks). */
enum cua_trace_record {
    CUA_TRACE_PROCESS = 1,
    CUA_TRACE_CONFIG = 2,
    CUA_TRACE_DEVICE = 3,
    CUA_TRACE_MODULE = 4,
    CUA_TRACE_THREAD = 5,
    CUA_TRACE_STREAM = 6,
    CUA_TRACE_PYFRAME = 7,
    CUA_TRACE_STACK = 8,
    CUA_TRACE_ALLOC = 32,
    CUA_TRACE_FREE = 33,
    CUA_TRACE_FREE_DONE = 34,
    CUA_TRACE_MAP = 35,
    CUA_TRACE_UNMAP = 36,
    CUA_TRACE_TRIM = 37,
    CUA_TRACE_OOM = 38,
    CUA_TRACE_MARK = 39,
    CUA_TRACE_INIT_BLOCK = 40,
    CUA_TRACE_INIT_MAP = 41,
    CUA_TRACE_END = 42,
    CUA_TRACE_LOST = 43,
};
#define CUA_TRACE_FIRST_EVENT 32

/* Event flags (the common prefix's first byte). */
#define CUA_TRACE_F_SAME_DEV 0x01u
#define CUA_TRACE_F_SAME_THREAD 0x02u
#define CUA_TRACE_F_SAME_STREAM 0x04u
#define CUA_TRACE_F_BYTES 0x08u      /* addresses and sizes in bytes, not CUA_TRACE_UNIT */
#define CUA_TRACE_F_COMPLETED 0x10u  /* FREE: reusable at once, no FREE_DONE follows */
#define CUA_TRACE_F_EXACT 0x20u      /* ALLOC, INIT_BLOCK: requested == size, slack absent */
#define CUA_TRACE_F_SAME_STACK 0x40u /* ALLOC, INIT_BLOCK, OOM: stack absent, unchanged */
#define CUA_TRACE_F_ALL 0x7fu

enum cua_trace_clock {
    CUA_TRACE_CLOCK_MONOTONIC = 0, /* CLOCK_MONOTONIC nanoseconds */
    CUA_TRACE_CLOCK_COUNTER = 1,   /* deterministic (sim device): 1000 ns per event record */
};

enum cua_trace_mode { CUA_TRACE_MODE_CLASSIC = 0, CUA_TRACE_MODE_VMM = 1 };

/* OOM vmm_failure: 0 none (classic segments, or not a failure of that kind) or not recorded; the
 * new chunks fit under the cap, but no free range of the reserved address space took them; the new
 * chunks would pass the cap (live blocks keep the rest of what is reserved in partly used chunks),
 * whatever the address space; the device refused them. WAITING, with either kind of segments (a
 * value added within format 1.1): memory freed on streams the heap could not synchronize (a CUDA
 * graph capture in progress, or a stream the driver would not synchronize) would have served the
 * request. DRIVER_ERROR, with either kind (added within format 1.2): not a shortage at all — the
 * driver failed the heap's last attempt to create or map memory with an error other than out of
 * memory (a context a kernel's fault left unusable fails every call); device_free then reads 0. A
 * reader takes a value it does not know for "not recorded". */
enum cua_trace_vmm_failure {
    CUA_TRACE_VMM_NONE = 0,
    CUA_TRACE_VMM_ADDRESS_SPACE = 1,
    CUA_TRACE_VMM_CHUNKS = 2,
    CUA_TRACE_VMM_REFUSED = 3,
    CUA_TRACE_VMM_WAITING = 4,
    CUA_TRACE_VMM_DRIVER_ERROR = 5,
};

/* LOST table: what the recorder could not keep. A reader names a value it does not know "table N". */
enum cua_trace_lost_table {
    CUA_TRACE_LOST_STACKS = 1,   /* stack nodes: allocations and OOMs go without a stack */
    CUA_TRACE_LOST_STREAMS = 2,  /* stream definitions: events go without a stream */
    CUA_TRACE_LOST_PYFRAMES = 3, /* Python frame definitions: a stack with such a frame goes without (0) */
    CUA_TRACE_LOST_PYNAMES = 4,  /* Python function and file names: as PYFRAMES */
    CUA_TRACE_LOST_MODULES = 5,  /* loaded modules: native frames cannot be named */
};

enum cua_trace_frame_kind { CUA_TRACE_FRAME_NATIVE = 0, CUA_TRACE_FRAME_PYTHON = 1 };

enum cua_trace_end_reason {
    CUA_TRACE_END_STOP = 0,  /* cualloc_trace_stop() or process exit */
    CUA_TRACE_END_LIMIT = 1, /* trace_max_mb reached (linear file): later events not recorded */
    CUA_TRACE_END_ERROR = 2, /* the file could not grow or be mapped (disk full, file size limit, address space) */
};

/* END record statistics, in this order (the fields of cualloc_stats). */
enum cua_trace_stat {
    CUA_TRACE_STAT_REQUESTED, CUA_TRACE_STAT_REQUESTED_PEAK,
    CUA_TRACE_STAT_ALLOCATED, CUA_TRACE_STAT_ALLOCATED_PEAK,
    CUA_TRACE_STAT_ACTIVE, CUA_TRACE_STAT_ACTIVE_PEAK,
    CUA_TRACE_STAT_RESERVED, CUA_TRACE_STAT_RESERVED_PEAK,
    CUA_TRACE_STAT_INACTIVE_SPLIT, CUA_TRACE_STAT_INACTIVE_SPLIT_PEAK,
    CUA_TRACE_STAT_LARGEST_FREE_BLOCK, CUA_TRACE_STAT_CAPACITY,
    CUA_TRACE_STAT_NUM_ALLOCS, CUA_TRACE_STAT_NUM_FREES, CUA_TRACE_STAT_NUM_MAPS,
    CUA_TRACE_STAT_NUM_UNMAPS, CUA_TRACE_STAT_NUM_ALLOC_RETRIES, CUA_TRACE_STAT_NUM_OOMS,
    CUA_TRACE_STAT_NUM_SYNCS, CUA_TRACE_STAT_NUM_TRIMS,
    CUA_TRACE_STAT_COUNT
};

/* The format's integers are little-endian: the `bytes` low bytes of v at p, and back. */
static inline void cua_trace_put_le(unsigned char *p, uint64_t v, unsigned bytes)
{
    for (unsigned i = 0; i < bytes; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t cua_trace_get_le(const unsigned char *p, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The block header check: a 16-bit Fletcher sum over header bytes 4..31 with bytes 6 and 7 taken
 * as 0. `h` points at the block's first byte. */
static inline uint16_t cua_trace_block_check(const unsigned char *h)
{
    uint32_t a = 1, b = 0;
    for (unsigned i = 4; i < CUA_TRACE_BLOCK_HEADER; i++) {
        uint32_t v = (i == 6 || i == 7) ? 0u : h[i];
        a = (a + v) % 255u;
        b = (b + a) % 255u;
    }
    return (uint16_t)((b << 8) | a);
}

#endif
