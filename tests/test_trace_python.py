"""test_trace_python.py LIBCUALLOC ALLOCVIEW — Python frames in a trace, with a real interpreter.

The recorder finds CPython's C API at run time (no build-time Python) and records the allocating
thread's Python frames (function, file, line) as the outer part of the allocation's stack.
ctypes.PyDLL calls keep the GIL, ctypes.CDLL calls release it (as PyTorch's operators do before
they allocate): through the public API (cualloc_malloc, what PyTorch's pluggable allocator calls)
both must carry this file's frames with the right lines, the second because the recorder takes the
GIL back for the capture; through an LD_PRELOAD entry point (cudaMalloc) without the GIL, none,
since the recorder never waits for the GIL there. The trace is read back with `allocview dump`.
"""
import ctypes
import os
import re
import subprocess
import sys
import tempfile

lib_path, allocview = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(prefix="cualloc-test-trace-python-")
trace = os.path.join(tmp, "py.trace")
os.environ["CUALLOC_CONF"] = "driver:sim,sim_memory_mb:256,trace_stack_depth:8"

with_gil = ctypes.PyDLL(lib_path)
without_gil = ctypes.CDLL(lib_path)
for lib in (with_gil, without_gil):
    lib.cualloc_malloc.restype = ctypes.c_void_p
    lib.cualloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cualloc_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cualloc_trace_start.argtypes = [ctypes.c_char_p]
    lib.cualloc_mark.argtypes = [ctypes.c_char_p]
without_gil.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
without_gil.cudaFree.argtypes = [ctypes.c_void_p]

SOURCE = open(__file__).read().splitlines()


def line_of(marker):
    return next(i + 1 for i, text in enumerate(SOURCE) if text.rstrip().endswith(marker))


def allocate_here(n):
    return with_gil.cualloc_malloc(n, 0, None)  # SITE-A


class Model:
    def forward(self):
        return allocate_here(4096)  # SITE-B


assert with_gil.cualloc_trace_start(trace.encode()) == 0, "cualloc_trace_start failed"
with_gil.cualloc_mark(b"python step")
p = Model().forward()  # SITE-C
# The GIL is let go for this call; the recorder takes it back.
q = without_gil.cualloc_malloc(8192, 0, None)  # SITE-D
r = ctypes.c_void_p()
assert without_gil.cudaMalloc(ctypes.byref(r), 16384) == 0, "cudaMalloc failed"
with_gil.cualloc_free(p, None)
with_gil.cualloc_free(q, None)
assert without_gil.cudaFree(r) == 0
with_gil.cualloc_trace_stop()

def read_trace(path):
    """`allocview dump` of the trace: its text, Python frames, stack nodes, stream handles, and
    allocations as (stream id, size, stack id)."""
    dump = subprocess.run([allocview, "dump", path], capture_output=True, text=True, check=True).stdout
    pyframes, stacks, handles, allocs = {}, {}, {}, []
    for line in dump.splitlines():
        m = re.match(r'#\d+ pyframe (\d+) line=(\d+) function="([^"]*)" file="([^"]*)"', line)
        if m:
            pyframes[int(m.group(1))] = (m.group(3), os.path.basename(m.group(4)), int(m.group(2)))
        m = re.match(r"#\d+ stack (\d+) parent=(\d+) (native|python) (\S+)", line)
        if m:
            stacks[int(m.group(1))] = (int(m.group(2)), m.group(3), m.group(4))
        m = re.match(r"#\d+ stream (\d+) handle=(\S+)", line)
        if m:
            handles[int(m.group(1))] = int(m.group(2), 16)
        m = re.match(r"#\d+ alloc .* stream=(\d+) .* size=(\d+) .* stack=(\d+)", line)
        if m:
            allocs.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    return dump, pyframes, stacks, handles, allocs


dump, pyframes, stacks, handles, allocs = read_trace(trace)


def python_frames(stack_id):
    """The stack's Python frames, innermost first."""
    out = []
    while stack_id:
        parent, kind, value = stacks[stack_id]
        if kind == "python":
            out.append(pyframes[int(value)])
        stack_id = parent
    return out


assert len(allocs) == 3, dump
me = os.path.basename(__file__)
got = python_frames(allocs[0][2])
want = [("allocate_here", me, line_of("# SITE-A")), ("Model.forward", me, line_of("# SITE-B")),
        ("<module>", me, line_of("# SITE-C"))]
assert got[:3] == want, "Python frames with the GIL: got %r, want %r" % (got, want)
native = 0
sid = allocs[0][2]
while sid:
    native += stacks[sid][1] == "native"
    sid = stacks[sid][0]
assert native > 0, "native frames come with the Python ones"
got_d = python_frames(allocs[1][2])
assert got_d[:1] == [("<module>", me, line_of("# SITE-D"))], "the GIL taken back for cualloc_malloc: got %r" % got_d
assert python_frames(allocs[2][2]) == [], "cudaMalloc never waits for the GIL: %r" % python_frames(allocs[2][2])
assert '"python step"' in dump
# allocview names the site by its Python lines: the ctypes call and libffi's trampoline between
# them and the allocation are left out, like the interpreter's own frames.
folded = subprocess.run([allocview, "folded", trace], capture_output=True, text=True, check=True).stdout
with_python = [l for l in folded.splitlines() if "allocate_here" in l]
assert len(with_python) == 1, folded
frames = with_python[0].rsplit(" ", 1)[0].split(";")
assert frames[-3:] == ["<module> (%s:%d)" % (__file__, line_of("# SITE-C")),
                       "Model.forward (%s:%d)" % (__file__, line_of("# SITE-B")),
                       "allocate_here (%s:%d)" % (__file__, line_of("# SITE-A"))], frames
assert not any("ffi" in f or "_ctypes" in f or "PyEval" in f for f in frames), frames
os.remove(trace)
print("test_trace_python: Python frames recorded: %s" % ", ".join("%s (%s:%d)" % f for f in got))

# Many call sites and streams: the recorder's tables of streams (256 slots at first), Python frames
# (1024) and stack nodes (4096) grow while recording, at half full. 3000 allocations, each from its
# own line of a generated file and on one of 300 stream handles, must each read back with its own
# line and its own stream.
SITES, STREAMS = 3000, 300
site = {"lib": with_gil}
code = compile("\n".join("p = lib.cualloc_malloc(%d, 0, %d); lib.cualloc_free(p, %d)"
                         % (512 * (1 + i % 7), 0x10000 + 16 * (i % STREAMS), 0x10000 + 16 * (i % STREAMS))
                         for i in range(SITES)), "generated_sites.py", "exec")
assert with_gil.cualloc_trace_start(trace.encode()) == 0, "cualloc_trace_start failed (second trace)"
exec(code, site)
with_gil.cualloc_trace_stop()
dump, pyframes, stacks, handles, allocs = read_trace(trace)
assert len(allocs) == SITES, "%d allocations read back, want %d" % (len(allocs), SITES)
assert len(pyframes) > 512 and len(stacks) > 2048, "the tables did not grow: %d Python frames, %d stack nodes" % (
    len(pyframes), len(stacks))
assert len(set(handles.values())) == len(handles) >= STREAMS, "%d stream records" % len(handles)
for i, (stream_id, size, stack_id) in enumerate(allocs):
    assert handles.get(stream_id) == 0x10000 + 16 * (i % STREAMS), "allocation %d: stream %r" % (i, handles.get(stream_id))
    assert size == 512 * (1 + i % 7), "allocation %d: size %d" % (i, size)
    frames = python_frames(stack_id)
    assert frames[:1] == [("<module>", "generated_sites.py", i + 1)], "allocation %d: frames %r" % (i, frames[:2])
os.remove(trace)
os.rmdir(tmp)
print("test_trace_python: %d call sites on %d streams read back, each with its own line and stream" % (SITES, STREAMS))
print("test_trace_python: all passed")
