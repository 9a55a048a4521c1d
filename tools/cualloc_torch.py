#!/usr/bin/env python3
"""cualloc_torch — use cualloc as PyTorch's CUDA allocator (the pluggable-allocator way in).

    import cualloc_torch
    cualloc_torch.enable()          # before the first CUDA tensor is created
    ...                             # train as usual; torch.cuda.memory_allocated() & co. keep working
    print(cualloc_torch.stats())    # cualloc's own figures, per device

enable() registers libcualloc_torch.so (src/torch_abi.cc) through
torch.cuda.memory.CUDAPluggableAllocator, loads the same libcualloc.so through ctypes for
statistics, and replaces torch.cuda's statistics functions — which raise under any pluggable
allocator ("CUDAPluggableAllocator does not yet support getDeviceStats") — with stand-ins that
answer from cualloc, under PyTorch's key names.

The other way in needs no code change: LD_PRELOAD=build/src/libcualloc.so
PYTORCH_NO_CUDA_MEMORY_CACHING=1 python train.py (see README.md).

This module needs only the standard library; torch is imported inside the functions that use it,
so the module imports, and `python3 cualloc_torch.py --selftest` runs, where torch is missing.

What is verified where: tests/test_cualloc_torch.py checks this module against a fake `torch`
package and the real libcualloc.so on the sim device; tests/test_torch_abi.cc checks the C++ shim.
That PyTorch itself loads the shim, turns its exception into RuntimeError and trains under it is
a GPU check, done on a GPU machine with a real PyTorch.
"""

import ctypes
import ctypes.util
import glob
import os
import re
import sys
import sysconfig
import threading
import warnings
import weakref
from collections import OrderedDict

__all__ = [
    "enable", "is_enabled", "find_library", "load", "library", "stats", "empty_cache", "mark",
    "watch_optimizer", "install_standins", "disable_standins", "memory_stats",
    "memory_stats_as_nested_dict", "CuallocStats",
]

TORCH_LIB_NAME = "libcualloc_torch.so"
MALLOC_SYMBOL = "cualloc_torch_malloc"
FREE_SYMBOL = "cualloc_torch_free"

_HERE = os.path.dirname(os.path.abspath(__file__))


# ----------------------------------------------------------------------------------------------
# cualloc_stats, mirrored from include/cualloc.h. The header lists the fields once, as X-macros:
# the gauges (size_t current, size_t peak), then largest_free_block and capacity_bytes (size_t),
# then the counters (uint64_t). Keep this in the header's order; tests/test_cualloc_torch.py and
# --selftest compare it with the header and with the C compiler's sizeof/offsetof.

_GAUGES = [
    ("requested_bytes", "requested_peak"),
    ("allocated_bytes", "allocated_peak"),
    ("active_bytes", "active_peak"),
    ("reserved_bytes", "reserved_peak"),
    ("inactive_split_bytes", "inactive_split_peak"),
]
_COUNTERS = [
    "num_allocs", "num_frees", "num_maps", "num_unmaps", "num_alloc_retries", "num_ooms",
    "num_syncs", "num_trims",
]


class CuallocStats(ctypes.Structure):
    """struct cualloc_stats (include/cualloc.h), field for field."""
    _fields_ = ([(name, ctypes.c_size_t) for pair in _GAUGES for name in pair]
                + [("largest_free_block", ctypes.c_size_t), ("capacity_bytes", ctypes.c_size_t)]
                + [(name, ctypes.c_uint64) for name in _COUNTERS])


STATS_FIELDS = tuple(name for name, _ in CuallocStats._fields_)


def header_fields(header_path):
    """Parses cualloc.h — the X-macro lists and the struct that expands them — and returns
    [(field, C type)] in struct order: what the ctypes mirror above must equal."""
    with open(header_path, encoding="utf-8") as f:
        text = f.read()

    def macro_body(name):
        m = re.search(r"#define\s+" + name + r"\(X\)((?:[^\n]*\\\n)*[^\n]*)", text)
        if not m:
            raise ValueError("%s: no #define %s(X)" % (header_path, name))
        return re.sub(r"/\*.*?\*/", "", m.group(1).replace("\\\n", "\n"), flags=re.S)

    m = re.search(r"typedef struct cualloc_stats\s*\{(.*?)\}\s*cualloc_stats;", text, re.S)
    if not m:
        raise ValueError("%s: no typedef struct cualloc_stats" % header_path)
    def expand(list_macro, field_macro):
        """CUALLOC_STATS_X(FIELD_MACRO): each X(a, b, ...) of the list, through FIELD_MACRO's
        `type param;` declarations."""
        fm = re.search(r"#define\s+" + field_macro + r"\(([^)]*)\)\s*([^\n]*)", text)
        if not fm:
            raise ValueError("%s: no #define %s" % (header_path, field_macro))
        params = [x.strip() for x in fm.group(1).split(",")]
        decls = re.findall(r"(\w+)\s+(\w+)\s*;", fm.group(2))
        out = []
        for args in re.findall(r"X\(([^)]*)\)", macro_body(list_macro)):
            binding = dict(zip(params, [a.strip() for a in args.split(",")]))
            out += [(binding[param], ctype) for ctype, param in decls]
        return out

    fields = []
    for line in re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S).splitlines():
        line = line.strip()
        if not line:
            continue
        xm = re.fullmatch(r"(CUALLOC_STATS_\w+)\(\s*(\w+)\s*\)", line)
        if xm:
            fields += expand(xm.group(1), xm.group(2))
            continue
        dm = re.fullmatch(r"(size_t|uint64_t|uint32_t|int|unsigned)\s+(\w+)\s*;", line)
        if not dm:
            raise ValueError("%s: cannot read struct cualloc_stats line %r" % (header_path, line))
        fields.append((dm.group(2), dm.group(1)))
    return fields


def check_struct_against_header(header_path):
    """Returns a list of mismatches between CuallocStats and the header (empty when they agree)."""
    problems = []
    want = header_fields(header_path)
    ctype_of = {"size_t": ctypes.c_size_t, "uint64_t": ctypes.c_uint64}
    have = [(n, t) for n, t in CuallocStats._fields_]
    if [n for n, _ in want] != [n for n, _ in have]:
        problems.append("field order differs: header %s, ctypes %s" % ([n for n, _ in want], [n for n, _ in have]))
    for (wn, wt), (hn, ht) in zip(want, have):
        if wn == hn and ctypes.sizeof(ctype_of.get(wt, ctypes.c_char)) != ctypes.sizeof(ht):
            problems.append("field %s: header type %s, ctypes %s" % (wn, wt, ht.__name__))
    size = 0
    for _, t in want:
        c = ctype_of.get(t)
        if c is None:
            problems.append("header type %s has no ctypes mapping here" % t)
            continue
        a = ctypes.alignment(c)
        size = (size + a - 1) // a * a + ctypes.sizeof(c)
    if size != ctypes.sizeof(CuallocStats):
        problems.append("sizeof: header implies %d bytes, ctypes has %d" % (size, ctypes.sizeof(CuallocStats)))
    return problems


# ----------------------------------------------------------------------------------------------
# Finding and loading the library.

def _candidate_dirs():
    """Where libcualloc_torch.so may be, in the order searched (after an explicit path and
    CUALLOC_TORCH_LIB): the build tree next to this file, then installed library directories."""
    root = os.path.dirname(_HERE)
    dirs = [os.path.join(root, "build", "src")]
    # Other build directories of a source checkout (build-*, newest first).
    others = [d for d in glob.glob(os.path.join(root, "build*", "src")) if d not in dirs]
    others.sort(key=lambda d: os.path.getmtime(d) if os.path.exists(d) else 0, reverse=True)
    dirs += others
    # Installed: meson installs this module under <libdir>/cualloc, the library in <libdir>.
    dirs += [os.path.dirname(_HERE), _HERE]
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    for prefix in [sys.prefix, "/usr/local", "/usr"]:
        for sub in (["lib", multiarch] if multiarch else None, ["lib64"], ["lib"]):
            if sub:
                dirs.append(os.path.join(prefix, *sub))
    seen, out = set(), []
    for d in dirs:
        d = os.path.normpath(d)
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def find_library(path=None):
    """Returns the path of libcualloc_torch.so: `path` if given (a file, or a directory holding
    it), else $CUALLOC_TORCH_LIB, else the first of the build tree and installed library
    directories that has it, else what the dynamic loader's cache knows (with a RuntimeWarning
    when $CUALLOC_TORCH_LIB is set but names no library). Raises FileNotFoundError naming every
    place looked in."""
    looked = []
    if path is not None:
        p = os.fspath(path)
        if os.path.isdir(p):
            p = os.path.join(p, TORCH_LIB_NAME)
        if os.path.isfile(p):
            return os.path.abspath(p)
        raise FileNotFoundError(
            "cualloc_torch: %s does not exist (the path given to enable()/find_library()). "
            "Build the library with `meson setup build && meson compile -C build` (it is "
            "build/src/%s), or pass its path." % (p, TORCH_LIB_NAME))
    env = os.environ.get("CUALLOC_TORCH_LIB")
    if env:
        p = os.path.join(env, TORCH_LIB_NAME) if os.path.isdir(env) else env
        if os.path.isfile(p):
            return os.path.abspath(p)
        looked.append("%s (from CUALLOC_TORCH_LIB)" % p)
    else:
        looked.append("$CUALLOC_TORCH_LIB (not set)")

    def searched(found):
        # The variable names the library the user wants: a copy found instead is said, never
        # taken silently (a typo there would otherwise run the job on another build).
        if env:
            _warn_once(("CUALLOC_TORCH_LIB", env, found),
                       "cualloc_torch: CUALLOC_TORCH_LIB=%s names no %s (nor a directory holding it); "
                       "using %s, found by the default search" % (env, TORCH_LIB_NAME, found))
        return found

    for d in _candidate_dirs():
        p = os.path.join(d, TORCH_LIB_NAME)
        if os.path.isfile(p):
            runtime = _sanitizer_runtime(p)
            if runtime is None:
                return searched(p)
            looked.append("%s (skipped: built with a sanitizer, needs %s preloaded)" % (p, runtime))
            continue
        looked.append(p)
    found = ctypes.util.find_library("cualloc_torch")
    if found:
        return searched(found)  # a name the loader resolves (ldconfig cache)
    looked.append("the dynamic loader's cache (ldconfig -p)")
    raise FileNotFoundError(
        "cualloc_torch: cannot find %s. Looked in:\n  %s\nBuild it with `meson setup build && "
        "meson compile -C build` (it needs a C++ compiler), install it with `meson install -C "
        "build`, or name it: cualloc_torch.enable(path=...) or CUALLOC_TORCH_LIB=/path/to/%s."
        % (TORCH_LIB_NAME, "\n  ".join(looked), TORCH_LIB_NAME))


def _sanitizer_runtime(path):
    """The sanitizer runtime a library needs (e.g. "libasan.so"), or None. A sanitizer build dir
    is passed over in the search: its library cannot load into an unsanitized python. (Reads the
    file's strings; the dynamic section names the runtime.)"""
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return None
    for runtime in (b"libasan.so", b"libtsan.so", b"libubsan.so", b"libhwasan.so", b"libmsan.so"):
        if runtime in data:
            return runtime.decode()
    return None


_state_lock = threading.RLock()
_lib = None          # ctypes handle of libcualloc_torch.so (its cualloc_* symbols resolve to libcualloc.so)
_lib_path = None
_allocator = None    # the torch CUDAPluggableAllocator, kept alive
_warned = set()


def _warn_once(key, message, category=RuntimeWarning):
    """Warns once per key, attributed to the first caller outside this module (the user's line that
    called enable(), find_library(), set torch.backends.cudnn.benchmark, ...), however deep inside
    the module the warning was found."""
    if key not in _warned:
        _warned.add(key)
        level, f = 2, sys._getframe(1)  # stacklevel 2: _warn_once's caller
        while f is not None and f.f_code.co_filename == __file__:
            f = f.f_back
            level += 1
        warnings.warn(message, category, stacklevel=level)


def load(path=None):
    """Loads libcualloc_torch.so (found as find_library does) with ctypes and returns the handle;
    idempotent. Its cualloc_* symbols resolve through its dependency to libcualloc.so — the very
    copy PyTorch's allocator calls — so the statistics read here are the allocator's own. A
    libcualloc.so path also works (stats only, no PyTorch registration)."""
    with _state_lock:
        if _lib is not None and (path is None or _norm(find_library(path)) == _lib_path):
            return _lib
        return _load_found(find_library(path))


def _load_found(p):
    """Loads `p`, what find_library returned: a path, or a bare name that only the dynamic
    loader resolves (its cache), which must not be searched for again as a file."""
    global _lib, _lib_path
    with _state_lock:
        lib = ctypes.CDLL(p)
        _declare(lib)
        _lib, _lib_path = lib, _norm(p)
        return lib


def _norm(p):
    """A library path as compared here: resolved when it is a path, as is when it is a bare name
    the loader resolves (ldconfig cache)."""
    return os.path.realpath(p) if os.path.sep in p else p


def library():
    """The loaded ctypes handle (loading it on first use)."""
    return _lib if _lib is not None else load()


def _declare(lib):
    lib.cualloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cualloc_malloc.restype = ctypes.c_void_p
    lib.cualloc_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cualloc_free.restype = None
    lib.cualloc_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(CuallocStats)]
    lib.cualloc_get_stats.restype = ctypes.c_int
    lib.cualloc_trim.argtypes = [ctypes.c_int]
    lib.cualloc_trim.restype = None
    lib.cualloc_check.argtypes = [ctypes.c_int]
    lib.cualloc_check.restype = ctypes.c_int
    reset_fn = _optional_symbol(lib, "cualloc_reset_peaks")
    if reset_fn is not None:
        reset_fn.argtypes = [ctypes.c_int]
        reset_fn.restype = ctypes.c_int
    mark_fn = _optional_symbol(lib, "cualloc_mark")
    if mark_fn is not None:
        mark_fn.argtypes = [ctypes.c_char_p]
        mark_fn.restype = None


def _optional_symbol(lib, name):
    try:
        return getattr(lib, name)
    except AttributeError:
        return None


# ----------------------------------------------------------------------------------------------
# Devices.

def _device_index(device):
    """PyTorch's device argument (None, int, "cuda", "cuda:1", torch.device, torch.cuda.device) → an
    ordinal. None and an index-less device mean the current device; asking torch for it only when
    CUDA is already initialized, so reading statistics never initializes CUDA (which would forbid
    enable()). The ordinal goes to C as an int: one that does not fit is refused (ctypes would cut
    it to 32 bits, and 2**32 would name device 0), and so is a bool (True is an int, but not a
    device)."""
    index = _device_ordinal(device)
    if isinstance(index, bool) or not -2**31 <= index < 2**31:
        raise ValueError("cualloc_torch: %r is not a CUDA device" % (device,))
    return index


def _device_ordinal(device):
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        m = re.fullmatch(r"\s*cuda\s*(?::\s*(\d+))?\s*", device)
        if not m:
            raise ValueError("cualloc_torch: %r is not a CUDA device" % device)
        return int(m.group(1)) if m.group(1) is not None else _current_device()
    if device is None:
        return _current_device()
    # torch.cuda.device (the context manager) holds its ordinal in idx and has no type or index;
    # PyTorch's _get_device_index reads idx. (Only where torch is imported can it be one.)
    cuda_device_cls = getattr(getattr(sys.modules.get("torch"), "cuda", None), "device", None)
    if isinstance(cuda_device_cls, type) and isinstance(device, cuda_device_cls):
        return device.idx
    index = getattr(device, "index", None)
    dtype = getattr(device, "type", "cuda")
    if dtype != "cuda":
        raise ValueError("cualloc_torch: %r is not a CUDA device" % (device,))
    return index if index is not None else _current_device()


def _current_device():
    torch = sys.modules.get("torch")
    if torch is None:
        return 0
    try:
        if torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # a partial or CPU-only torch: device 0
        pass
    return 0


def _device_range():
    """Devices cualloc knows (cualloc_get_stats answers 0 for each valid ordinal)."""
    lib = library()
    s = CuallocStats()
    n = 0
    while n < 1024 and lib.cualloc_get_stats(n, ctypes.byref(s)) == 0:
        n += 1
    return range(n)


# ----------------------------------------------------------------------------------------------
# Statistics, cache, marks.

def _not_a_device(dev):
    return ValueError("cualloc_torch: device %d is not a device cualloc can use" % dev)


def _device_stats(dev):
    """cualloc_get_stats of ordinal dev; ValueError for a device cualloc does not have."""
    s = CuallocStats()
    if library().cualloc_get_stats(dev, ctypes.byref(s)) != 0:
        raise _not_a_device(dev)
    return s


def stats(device=None):
    """cualloc's statistics for `device` (default: the current device) as a dict of every field
    of struct cualloc_stats (include/cualloc.h): bytes for the gauges and their peaks since start,
    counts for the counters. Raises ValueError for a device cualloc does not have."""
    s = _device_stats(_device_index(device))
    return {name: int(getattr(s, name)) for name in STATS_FIELDS}


def empty_cache(device=None):
    """Releases cualloc's cached free memory (cualloc_trim): on `device`, or on every device when
    None — what torch.cuda.empty_cache() does for PyTorch's own allocator. Raises ValueError for a
    device cualloc does not have, as stats() does (cualloc_trim would ignore it)."""
    lib = library()
    if device is None:
        for d in _device_range():
            lib.cualloc_trim(d)
        return
    dev = _device_index(device)
    _device_stats(dev)  # (raises for a device cualloc does not have)
    lib.cualloc_trim(dev)


def mark(label):
    """Writes a mark (e.g. "step 12", "eval") into cualloc's trace, so allocview can split reports
    by phase. A no-op, with a one-time warning, where the library has no trace API (cualloc_mark)
    or cannot be loaded."""
    try:
        lib = library()
    except (OSError, FileNotFoundError) as e:
        _warn_once("mark-nolib", "cualloc_torch.mark(): library not loaded (%s); marks are ignored" % e)
        return
    fn = _optional_symbol(lib, "cualloc_mark")
    if fn is None:
        _warn_once("mark-nosym", "cualloc_torch.mark(): this libcualloc.so has no cualloc_mark (no trace "
                   "API); marks are ignored")
        return
    fn(str(label).encode("utf-8", "replace"))


# Step marks: "step N" after each optimizer step. Counted per optimizer; the first optimizer seen
# writes "step N", any other "step N (optimizer K)" so a GAN's two optimizers stay apart. Before
# each step, "START Optimizer.step#<class>.step", the name of PyTorch's own profiler annotation of
# the step, so that allocview finds a peak inside the optimizer's step in cualloc's traces as in
# PyTorch's snapshots.
_step_counts = weakref.WeakKeyDictionary()
_optimizer_ids = weakref.WeakKeyDictionary()
_watched = weakref.WeakSet()
_global_hook_handle = None


# The step-mark state, recorded on torch.optim.optimizer: like enable()'s swap it outlives this
# module (importlib.reload, a notebook's autoreload, a second copy of the module). Global hooks an
# earlier copy registered stay registered, so a copy that registered its own would mark every step
# twice, and counts that started again would write "step 1" a second time.
_STEP_RECORD = "_cualloc_torch_step_marks"


def _adopt_step_marks():
    """Takes over the step counts, optimizer numbers, watched optimizers and global hooks an earlier
    copy of this module recorded; records this copy's when none did. Returns torch.optim.optimizer
    and the record."""
    global _step_counts, _optimizer_ids, _watched, _global_hook_handle
    import torch.optim.optimizer as optimizer_mod  # noqa: E402 (lazy: torch may be absent)
    with _state_lock:
        record = getattr(optimizer_mod, _STEP_RECORD, None)
        if record is None:
            record = {"step_counts": _step_counts, "optimizer_ids": _optimizer_ids, "watched": _watched,
                      "hooks": _global_hook_handle}
            setattr(optimizer_mod, _STEP_RECORD, record)
        _step_counts, _optimizer_ids, _watched = record["step_counts"], record["optimizer_ids"], record["watched"]
        _global_hook_handle = record["hooks"]
        return optimizer_mod, record


def _step_label(opt):
    with _state_lock:
        n = _step_counts.get(opt, 0) + 1
        _step_counts[opt] = n
        if opt not in _optimizer_ids:
            # The lowest number no live optimizer has: the first optimizer (or the one that took
            # its place, e.g. a new one for a second phase) writes the plain "step N" allocview
            # counts steps by, and two live optimizers never share a label.
            used = set(_optimizer_ids.values())
            _optimizer_ids[opt] = next(i for i in range(len(used) + 1) if i not in used)
        k = _optimizer_ids[opt]
    return "step %d" % n if k == 0 else "step %d (optimizer %d)" % (n, k)


def _on_step(opt, args=None, kwargs=None):
    mark(_step_label(opt))


def _on_step_start(opt, args=None, kwargs=None):
    mark("START Optimizer.step#%s.step" % type(opt).__name__)


def _on_step_start_global(opt, args=None, kwargs=None):
    if opt not in _watched:  # watch_optimizer already marks this one
        _on_step_start(opt)


class _Handles:
    """The hooks of one watch: remove() removes them all, then calls on_remove (if given)."""

    def __init__(self, *handles, on_remove=None):
        self._handles = [h for h in handles if h is not None]
        self._on_remove = on_remove

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        if self._on_remove is not None:
            self._on_remove()
            self._on_remove = None


def _on_step_global(opt, args=None, kwargs=None):
    if opt not in _watched:  # watch_optimizer already marks this one
        mark(_step_label(opt))


def watch_optimizer(opt):
    """Marks "step N" in the trace after each opt.step() (Optimizer.register_step_post_hook,
    PyTorch >= 2.0), and "START Optimizer.step#<class>.step" before it. Returns a handle
    (handle.remove() stops both)."""
    if not hasattr(opt, "register_step_post_hook"):
        raise RuntimeError("cualloc_torch.watch_optimizer(): this optimizer has no register_step_post_hook "
                           "(PyTorch >= 2.0 needed); call cualloc_torch.mark('step N') yourself")
    _adopt_step_marks()
    _watched.add(opt)
    pre = opt.register_step_pre_hook(_on_step_start) if hasattr(opt, "register_step_pre_hook") else None
    ref = weakref.ref(opt)

    def unwatch():  # the global hooks (step_marks=True) mark it again
        o = ref()
        if o is not None:
            _watched.discard(o)

    return _Handles(pre, opt.register_step_post_hook(_on_step), on_remove=unwatch)


def _watch_all_optimizers():
    global _global_hook_handle
    optimizer_mod, record = _adopt_step_marks()
    if _global_hook_handle is not None:
        return True
    register = getattr(optimizer_mod, "register_optimizer_step_post_hook", None)
    if register is None:
        _warn_once("step-marks", "cualloc_torch: this PyTorch has no torch.optim.optimizer."
                   "register_optimizer_step_post_hook; use cualloc_torch.watch_optimizer(opt) for step marks")
        return False
    register_pre = getattr(optimizer_mod, "register_optimizer_step_pre_hook", None)

    def forget():  # removed: a later enable(step_marks=True), from any copy, registers anew
        global _global_hook_handle
        record["hooks"] = None
        _global_hook_handle = None

    _global_hook_handle = _Handles(register_pre(_on_step_start_global) if register_pre else None,
                                   register(_on_step_global), on_remove=forget)
    record["hooks"] = _global_hook_handle
    return True


# ----------------------------------------------------------------------------------------------
# Stand-ins for torch.cuda's statistics, which raise under a pluggable allocator.

# PyTorch's accumulated figures, as the counters of struct cualloc_stats they are read from.
# cualloc's counters only grow (its exit summary and trace count since start), so
# reset_accumulated_memory_stats() keeps, per device, the counters' values at the reset, and the
# stand-ins report the counts since then: what PyTorch's resetAccumulatedStats does to the
# .allocated/.freed of each stat and to its event counters. The current figures and peaks are not
# counters and are never offset.
_ACCUMULATED = (
    ("allocation.all.allocated", "num_allocs"),
    ("allocation.all.freed", "num_frees"),
    ("num_alloc_retries", "num_alloc_retries"),
    ("num_ooms", "num_ooms"),
    ("num_device_alloc", "num_maps"),
    ("num_device_free", "num_unmaps"),
    ("num_sync_all_streams", "num_syncs"),
)
# (process id, device ordinal) -> {counter: its value at the last reset}. A forked child starts with
# fresh heaps, whose counts all come after any reset of its parent's, so it finds none of these.
_accumulated_base = {}


def memory_stats(device=None):
    """torch.cuda.memory_stats() under cualloc: an OrderedDict with PyTorch's key names ("all" pool
    only) and cualloc's values. num_device_alloc/free count chunk maps/unmaps (VMM) or segment
    allocations/frees (classic); num_sync_all_streams counts the allocator's synchronizations.
    The accumulated figures (allocation.all.allocated/freed and the num_* counters) count from the
    device's last reset_accumulated_memory_stats(), as PyTorch's do."""
    dev = _device_index(device)
    s = stats(dev)
    base = _accumulated_base.get((os.getpid(), dev), {})
    if any(s[counter] < value for counter, value in base.items()):
        # A counter below its value at the reset: the device's heap started again since (a device
        # reset), so all it has counted came after the reset.
        base = {}
    d = {}
    for cur, peak in _GAUGES:
        key = cur[: -len("_bytes")] if cur.endswith("_bytes") else cur
        d["%s_bytes.all.current" % key] = s[cur]
        d["%s_bytes.all.peak" % key] = s[peak]
    d["allocation.all.current"] = s["num_allocs"] - s["num_frees"]
    for key, counter in _ACCUMULATED:
        d[key] = s[counter] - base.get(counter, 0)
    return OrderedDict(sorted(d.items()))


def memory_stats_as_nested_dict(device=None):
    """torch.cuda.memory_stats_as_nested_dict() under cualloc: memory_stats(), nested at its dots
    ("allocated_bytes.all.current" → d["allocated_bytes"]["all"]["current"])."""
    nested = {}
    for key, value in memory_stats(device).items():
        *path, last = key.split(".")
        d = nested
        for part in path:
            d = d.setdefault(part, {})
        d[last] = value
    return nested


def _memory_allocated(device=None):
    return stats(device)["allocated_bytes"]


def _max_memory_allocated(device=None):
    return stats(device)["allocated_peak"]


def _memory_reserved(device=None):
    return stats(device)["reserved_bytes"]


def _max_memory_reserved(device=None):
    return stats(device)["reserved_peak"]


def _reset_peaks(device=None):
    """torch.cuda.reset_peak_memory_stats (and reset_max_memory_allocated/_cached): cualloc's peaks
    of the device come down to the current figures (cualloc_reset_peaks), so max_memory_allocated()
    measures from here, as under PyTorch's allocator. A library without the function warns once
    and leaves the peaks since start."""
    fn = _optional_symbol(library(), "cualloc_reset_peaks")
    if fn is None:
        _warn_once("reset-peaks", "cualloc_torch: this libcualloc has no cualloc_reset_peaks; "
                   "torch.cuda.reset_peak_memory_stats() is a no-op (peaks are since process start)")
        return
    dev = _device_index(device)
    if fn(dev) != 0:
        raise _not_a_device(dev)


def _reset_accumulated(device=None):
    """torch.cuda.reset_accumulated_memory_stats: the stand-ins' accumulated figures of the device
    count from here (see _ACCUMULATED); cualloc's own counters (stats()) stay since start. Raises
    ValueError for a device cualloc does not have."""
    dev = _device_index(device)
    s = stats(dev)
    with _state_lock:
        _accumulated_base[(os.getpid(), dev)] = {counter: s[counter] for _, counter in _ACCUMULATED}


def _empty_cache():
    empty_cache(None)


def _memory_summary(device=None, abbreviated=False):
    s = stats(device)
    mib = float(1 << 20)
    lines = ["cualloc memory summary, device %d" % _device_index(device),
             "  %-22s %14s %14s" % ("MiB", "current", "peak")]
    for cur, peak in _GAUGES:
        lines.append("  %-22s %14.2f %14.2f" % (cur, s[cur] / mib, s[peak] / mib))
    lines.append("  %-22s %14.2f" % ("largest_free_block", s["largest_free_block"] / mib))
    lines.append("  %-22s %14.2f" % ("capacity_bytes", s["capacity_bytes"] / mib))
    for c in _COUNTERS:
        lines.append("  %-22s %14d" % (c, s[c]))
    return "\n".join(lines) + "\n"


# name → stand-in; each is installed on torch.cuda, torch.cuda.memory, torch.accelerator and
# torch.accelerator.memory where the name exists.
_STANDINS = {
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
    "memory_allocated": _memory_allocated,
    "max_memory_allocated": _max_memory_allocated,
    "memory_reserved": _memory_reserved,
    "max_memory_reserved": _max_memory_reserved,
    "memory_cached": _memory_reserved,            # deprecated aliases, where torch still has them
    "max_memory_cached": _max_memory_reserved,
    "memory_summary": _memory_summary,
    "reset_peak_memory_stats": _reset_peaks,
    "reset_max_memory_allocated": _reset_peaks,
    "reset_max_memory_cached": _reset_peaks,
    "reset_accumulated_memory_stats": _reset_accumulated,
    "empty_cache": _empty_cache,
}

# "torch.cuda.memory_stats" → the original function, while the stand-ins are installed.
_originals = {}


def install_standins():
    """Replaces torch.cuda's statistics functions (see _STANDINS) with cualloc's, and those of
    torch.accelerator (PyTorch >= 2.9: memory_stats, memory_allocated, ... empty_cache), which ask
    the device allocator directly and so never reach torch.cuda's; the originals are kept in
    cualloc_torch._originals. Idempotent."""
    import torch  # noqa: E402
    modules = []
    for modname in ("cuda", "accelerator"):
        mod = getattr(torch, modname, None)
        if mod is None:
            continue
        modules.append(("torch." + modname, mod))
        mem = getattr(mod, "memory", None)
        if mem is not None:
            modules.append(("torch.%s.memory" % modname, mem))
    with _state_lock:
        for modname, mod in modules:
            for name, fn in _STANDINS.items():
                key = "%s.%s" % (modname, name)
                if key in _originals or not hasattr(mod, name):
                    continue
                _originals[key] = getattr(mod, name)
                setattr(mod, name, fn)


def disable_standins():
    """Puts back torch.cuda's own statistics functions."""
    with _state_lock:
        for key, fn in list(_originals.items()):
            modname, name = key.rsplit(".", 1)
            mod = sys.modules.get(modname)
            if mod is not None:
                setattr(mod, name, fn)
            del _originals[key]


# ----------------------------------------------------------------------------------------------
# enable()

def is_enabled():
    return _allocator is not None


def enable(path=None, peer_access=True, step_marks=False, standins=True):
    """Makes cualloc PyTorch's CUDA allocator. Call it before the first CUDA tensor: PyTorch
    cannot swap an allocator it has already initialized.

    path        libcualloc_torch.so (default: found as find_library() says)
    peer_access with more than one GPU, let every GPU reach every other GPU's cualloc memory
                where the hardware allows it (cualloc_enable_peer_access_all: PyTorch's pluggable
                interface never shows cualloc cudaDeviceEnablePeerAccess); a library without it
                gets a warning instead
    step_marks  mark "step N" in cualloc's trace after every optimizer step, for all optimizers
                (torch.optim.optimizer.register_optimizer_step_post_hook); watch_optimizer(opt)
                does it for one
    standins    replace torch.cuda.memory_stats & co. with cualloc's figures (default)

    Returns the torch CUDAPluggableAllocator. Calling it again with the same library, or with no
    path, is a no-op (but for installing what step_marks and standins ask), also from this module
    reloaded or another copy of it.
    Raises RuntimeError when CUDA is already initialized or this PyTorch has no CUDA (a CPU-only
    build), FileNotFoundError when the library is not found."""
    global _allocator
    import torch  # noqa: E402 (lazy: the module imports without torch)

    with _state_lock:
        if _allocator is None:
            _adopt_earlier_swap(torch)
        if _allocator is not None:
            # Enabled already. Without a path the library in use is the one meant: the search is
            # not made again, since it need not find that library (enable(path=...) first).
            wanted = find_library(path) if path is not None else _lib_path
            if _norm(wanted) != _lib_path:
                raise RuntimeError("cualloc_torch.enable(): already enabled with %s; cannot switch to %s"
                                   % (_lib_path, wanted))
            _finish_enable(torch, step_marks, standins)
            return _allocator
        lib_path = find_library(path)
        memory = getattr(torch.cuda, "memory", None)
        if memory is None or not hasattr(memory, "CUDAPluggableAllocator") \
                or not hasattr(memory, "change_current_allocator"):
            raise RuntimeError("cualloc_torch.enable(): this PyTorch has no torch.cuda.memory."
                               "CUDAPluggableAllocator (PyTorch >= 2.0 with CUDA is needed); use "
                               "LD_PRELOAD=libcualloc.so PYTORCH_NO_CUDA_MEMORY_CACHING=1 instead")
        # A CPU-only build has the class too, but not the binding it calls (torch._C.
        # _cuda_customAllocator), so it would fail with an AttributeError about torch._C.
        try:
            import torch.backends.cuda as backends_cuda  # noqa: E402 (does not initialize CUDA)
        except ImportError:
            backends_cuda = None
        is_built = getattr(backends_cuda, "is_built", None)
        if is_built is not None and not is_built():
            raise RuntimeError("cualloc_torch.enable(): this PyTorch (%s) is built without CUDA "
                               "(torch.backends.cuda.is_built() is False), so it has no CUDA allocator "
                               "to replace; install a CUDA build of PyTorch"
                               % getattr(torch, "__version__", "unknown version"))
        # A ROCm build answers is_built() too, and its CUDA API runs on HIP: the CUDA driver
        # cualloc uses has no device there, so every allocation would fail as out of memory.
        hip = getattr(getattr(torch, "version", None), "hip", None)
        if hip:
            raise RuntimeError("cualloc_torch.enable(): this PyTorch (%s) is a ROCm build (torch.version.hip "
                               "is %s); cualloc serves NVIDIA GPUs through the CUDA driver and cannot "
                               "allocate AMD GPU memory" % (getattr(torch, "__version__", "unknown version"), hip))
        # Another pluggable allocator already swapped in (RMM's rmm_torch_allocator, say): PyTorch
        # initializes a pluggable allocator when it is made and refuses to swap an initialized one,
        # so no place of enable() in the script can help (get_allocator_backend() is the name of
        # the allocator in use, "pluggable" for any CUDAPluggableAllocator; it does not initialize
        # CUDA). The swaps this module made itself were adopted above.
        if _allocator_backend(memory) == "pluggable":
            raise RuntimeError("cualloc_torch.enable(): another pluggable allocator is already PyTorch's CUDA "
                               "allocator (torch.cuda.memory.change_current_allocator was called before, by "
                               "this script or a library it uses, e.g. RMM's rmm_torch_allocator), and PyTorch "
                               "swaps its allocator only once per process. Remove that swap to use cualloc")
        if _cuda_in_use(torch):
            raise RuntimeError(_too_late_message())
        allocator = memory.CUDAPluggableAllocator(lib_path, MALLOC_SYMBOL, FREE_SYMBOL)
        try:
            memory.change_current_allocator(allocator)
        except Exception as e:  # PyTorch: "Can't swap an already initialized allocator"
            raise RuntimeError("%s (PyTorch said: %s)" % (_too_late_message(), e)) from e
        _allocator = allocator
        _load_found(lib_path)  # the library PyTorch just loaded, by the same name
        setattr(memory, _SWAP_RECORD, {"lib_path": lib_path, "allocator": allocator, "originals": _originals,
                                       "accumulated_base": _accumulated_base})
        if peer_access:
            try:
                if torch.cuda.device_count() > 1:  # does not initialize CUDA
                    fn = getattr(_lib, "cualloc_enable_peer_access_all", None) if _lib is not None else None
                    if fn is not None:
                        fn.restype = ctypes.c_int
                        fn.argtypes = []
                        fn()
                    else:
                        _warn_once("peers", "cualloc_torch: with expandable segments (the default) cualloc grants "
                               "each device access to its own memory only; this library has no "
                               "cualloc_enable_peer_access_all, so peer-to-peer access is not set up")
            except Exception:
                pass
        _finish_enable(torch, step_marks, standins)
        return allocator


# enable()'s swap, recorded on torch.cuda.memory: like the swap itself it outlives this module
# (importlib.reload, a notebook's autoreload, a second copy of the module), and PyTorch refuses a
# second swap, even before CUDA is initialized (a pluggable allocator is initialized when made).
_SWAP_RECORD = "_cualloc_torch_swap"


def _adopt_earlier_swap(torch):
    """Takes over the swap an earlier copy of this module made, if any: its library, allocator,
    the PyTorch functions its stand-ins replaced (so that disable_standins() puts PyTorch's back)
    and the counters' values at its reset_accumulated_memory_stats() calls."""
    global _allocator, _originals, _accumulated_base
    record = getattr(getattr(torch.cuda, "memory", None), _SWAP_RECORD, None)
    if record is None:
        return
    _load_found(record["lib_path"])
    # Resets this copy made itself (stand-ins installed before enable()) are the latest for their
    # devices; the record's dict stays the one shared with the earlier copy's stand-ins.
    shared = record.setdefault("accumulated_base", {})
    shared.update(_accumulated_base)
    _accumulated_base = shared
    # Functions this copy replaced itself already (install_standins() before enable()) are
    # PyTorch's only where the earlier copy had not replaced them: its record wins.
    for key, fn in _originals.items():
        record["originals"].setdefault(key, fn)
    _originals = record["originals"]
    _allocator = record["allocator"]


def _finish_enable(torch, step_marks, standins):
    _refuse_graph_capture(torch)
    _warn_cudnn_benchmark(torch)
    if standins:
        install_standins()
    if step_marks:
        _watch_all_optimizers()


GRAPH_CAPTURE_MESSAGE = (
    "cualloc_torch: CUDA graph capture is not supported under cualloc_torch.enable(). A captured graph "
    "keeps using the memory its kernels were given when it replays, and PyTorch tells a pluggable "
    "allocator nothing about the graph (its private memory pool is PyTorch's own allocator's), so "
    "cualloc would hand that memory to other tensors after the capture and every replay would "
    "overwrite them. Capture graphs (torch.cuda.graph, make_graphed_callables, "
    "torch.compile(mode='reduce-overhead')) without cualloc_torch.enable(), or run the job with "
    "LD_PRELOAD=libcualloc.so beneath PyTorch's own cache (without PYTORCH_NO_CUDA_MEMORY_CACHING), "
    "where PyTorch keeps its graph pools; torch.compile's other modes (the default, "
    "mode='max-autotune-no-cudagraphs') record no graph")


def _refuse_graph_capture(torch):
    """CUDAGraph.capture_begin raises instead of starting a capture whose memory cualloc could not
    keep for the graph (GRAPH_CAPTURE_MESSAGE). Every Python way into a capture goes through it
    (torch.cuda.graph, make_graphed_callables, torch.compile's CUDA graph trees). The torch.cuda.graph
    context manager raises first thing too: its __enter__ makes its capture stream current before
    capture_begin, and an __enter__ that raises gets no __exit__, so the work after a caught refusal
    would all have run on that side stream. Idempotent."""
    graphs = getattr(torch.cuda, "graphs", None)
    for cls, name in ((getattr(graphs, "CUDAGraph", None) or getattr(torch.cuda, "CUDAGraph", None), "capture_begin"),
                      (getattr(graphs, "graph", None) or getattr(torch.cuda, "graph", None), "__enter__")):
        if cls is None or getattr(getattr(cls, name, None), "_cualloc_refuses", False):
            continue

        def refuse(self, *args, **kwargs):
            raise RuntimeError(GRAPH_CAPTURE_MESSAGE)

        refuse._cualloc_refuses = True
        setattr(cls, name, refuse)


CUDNN_BENCHMARK_MESSAGE = (
    "cualloc_torch: torch.backends.cudnn.benchmark is True under cualloc_torch.enable(). cuDNN's benchmark mode "
    "asks the allocator for its largest cached block (cacheInfo), which PyTorch's pluggable allocator refuses, so "
    "every convolution will raise RuntimeError('CUDAPluggableAllocator does not yet support cacheInfo ...'). Leave "
    "torch.backends.cudnn.benchmark False under enable(), or run the job with LD_PRELOAD=libcualloc.so beneath "
    "PyTorch's own cache (without PYTORCH_NO_CUDA_MEMORY_CACHING), which answers it")


class _BenchmarkWarns:
    """torch.backends.cudnn's `benchmark` setting (a descriptor on its module's class, as PyTorch
    makes it), wrapped: setting it True warns (CUDNN_BENCHMARK_MESSAGE), then sets it as asked."""
    _cualloc_warns = True

    def __init__(self, prop):
        self.prop = prop

    def __get__(self, obj, objtype=None):
        return self.prop.__get__(obj, objtype)

    def __set__(self, obj, value):
        if value:
            _warn_once("cudnn-benchmark", CUDNN_BENCHMARK_MESSAGE)
        self.prop.__set__(obj, value)


def _warn_cudnn_benchmark(torch):
    """cuDNN's benchmark mode fails every convolution under a pluggable allocator (seen with PyTorch
    2.11 on an H100: bench/RESULTS.md): a warning where it is on at enable(), or when it is turned on
    later through torch.backends.cudnn.benchmark. The setting itself is left as the job asks.
    Idempotent."""
    try:
        import importlib
        cudnn = importlib.import_module("torch.backends.cudnn")
    except Exception:
        return
    cls = type(cudnn)
    prop = cls.__dict__.get("benchmark")
    if prop is not None and hasattr(prop, "__set__") and not getattr(prop, "_cualloc_warns", False):
        setattr(cls, "benchmark", _BenchmarkWarns(prop))
    try:
        on = bool(cudnn.benchmark)
    except Exception:
        on = False
    if on:
        _warn_once("cudnn-benchmark", CUDNN_BENCHMARK_MESSAGE)


def _cuda_in_use(torch):
    try:
        if torch.cuda.is_initialized():
            return True
    except Exception:
        pass
    return False


def _allocator_backend(memory):
    """torch.cuda.memory.get_allocator_backend() ("native", "cudaMallocAsync" or "pluggable"), or
    None where this PyTorch cannot say."""
    try:
        return memory.get_allocator_backend()
    except Exception:
        return None


def _too_late_message():
    return ("cualloc_torch.enable() was called after CUDA was initialized in this process, and "
            "PyTorch cannot swap its allocator once it has been initialized. Call "
            "`import cualloc_torch; cualloc_torch.enable()` at the top of the script, before "
            "creating any CUDA tensor or model.cuda() and before torch.cuda calls that initialize "
            "CUDA (current_device, set_device, synchronize, ...). Or use the no-code-change way: "
            "LD_PRELOAD=libcualloc.so PYTORCH_NO_CUDA_MEMORY_CACHING=1 python train.py")


# ----------------------------------------------------------------------------------------------
# --selftest: the checks that need no torch.

def _selftest(header=None, layout=None, lib=None):
    failures = []

    def check(ok, what):
        print("%s: %s" % ("ok  " if ok else "FAIL", what))
        if not ok:
            failures.append(what)

    # 1. The ctypes mirror against the header (and the compiler's layout when given).
    # A header or library named on the command line must be there: only the default places may be
    # missing (not a source checkout, not built) and skipped; a named one skipped passed unchecked.
    if header is not None and not os.path.isfile(header):
        check(False, "--header %s: no such file" % header)
    header = header or os.path.join(os.path.dirname(_HERE), "include", "cualloc.h")
    if os.path.isfile(header):
        problems = check_struct_against_header(header)
        check(not problems, "CuallocStats matches %s%s" % (header, (": " + "; ".join(problems)) if problems else ""))
    else:
        print("skip: %s not found (not a source checkout); struct not compared with the header" % header)
    if layout:
        for item in layout.split(","):
            key, _, value = item.partition("=")
            if not re.fullmatch(r"[0-9]+", value) or (key != "sizeof" and not isinstance(
                    getattr(CuallocStats, key, None), type(CuallocStats.requested_bytes))):
                check(False, "--layout item '%s': not sizeof=N or FIELD=OFFSET of a cualloc_stats field" % item)
                continue
            want = int(value)
            have = ctypes.sizeof(CuallocStats) if key == "sizeof" else getattr(CuallocStats, key).offset
            check(have == want, "%s: ctypes %d, C compiler %d" % ("sizeof(cualloc_stats)" if key == "sizeof"
                                                                  else "offsetof(cualloc_stats, %s)" % key, have, want))

    # 2. Discovery: a wrong explicit path and a wrong CUALLOC_TORCH_LIB are named in the errors,
    #    and the not-found error lists every place looked in.
    bogus = os.path.join(os.sep, "nonexistent-cualloc-dir", TORCH_LIB_NAME)
    try:
        find_library(bogus)
        check(False, "find_library(%s) should fail" % bogus)
    except FileNotFoundError as e:
        check(bogus in str(e), "a missing explicit path is named in the error")
    saved_env = os.environ.get("CUALLOC_TORCH_LIB")
    saved_dirs = globals()["_candidate_dirs"]
    try:
        os.environ["CUALLOC_TORCH_LIB"] = bogus
        globals()["_candidate_dirs"] = lambda: [os.path.join(os.sep, "nonexistent-a"), os.path.join(os.sep, "nonexistent-b")]
        found = None
        try:
            found = find_library()
        except FileNotFoundError as e:
            msg = str(e)
            check(all(s in msg for s in (bogus, "CUALLOC_TORCH_LIB", os.path.join(os.sep, "nonexistent-a", TORCH_LIB_NAME),
                                         os.path.join(os.sep, "nonexistent-b", TORCH_LIB_NAME), "ldconfig")),
                  "the not-found error names every place looked in")
        if found is not None:
            print("skip: %s is in the loader cache; not-found message not checked" % found)
    finally:
        globals()["_candidate_dirs"] = saved_dirs
        if saved_env is None:
            os.environ.pop("CUALLOC_TORCH_LIB", None)
        else:
            os.environ["CUALLOC_TORCH_LIB"] = saved_env
    root = os.path.dirname(_HERE)
    check(_candidate_dirs()[0] == os.path.join(root, "build", "src"), "the build tree is searched first")

    # 3. The library itself, where built: both torch symbols and the cualloc_ API resolve.
    try:
        p = find_library(lib)
    except FileNotFoundError as e:
        if lib is not None:
            check(False, "--lib: %s" % str(e).splitlines()[0])
        else:
            print("skip: library not built (%s)" % str(e).splitlines()[0])
    else:
        try:
            h = ctypes.CDLL(p)
            missing = [s for s in (MALLOC_SYMBOL, FREE_SYMBOL, "cualloc_malloc", "cualloc_free",
                                   "cualloc_get_stats", "cualloc_trim") if _optional_symbol(h, s) is None]
            check(not missing, "%s exports the torch functions and reaches the cualloc_ API%s"
                  % (p, (": missing " + ", ".join(missing)) if missing else ""))
        except OSError as e:
            check(False, "loading %s: %s" % (p, e))

    print("cualloc_torch selftest: %s" % ("%d failure(s)" % len(failures) if failures else "ok"))
    return 1 if failures else 0


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(description="cualloc's PyTorch helper. Import it as a module "
                                 "(import cualloc_torch; cualloc_torch.enable()); run it for the self-test.")
    ap.add_argument("--selftest", action="store_true", help="run the checks that need no torch")
    ap.add_argument("--header", help="include/cualloc.h to compare the ctypes struct with")
    ap.add_argument("--layout", help="sizeof=N,field=OFFSET,... from the C compiler")
    ap.add_argument("--lib", help="libcualloc_torch.so to check")
    ap.add_argument("--find", action="store_true", help="print the library path enable() would use")
    args = ap.parse_args(argv)
    if args.find:
        try:
            print(find_library(args.lib))
            return 0
        except FileNotFoundError as e:
            print(e, file=sys.stderr)
            return 1
    if args.selftest:
        return _selftest(args.header, args.layout, args.lib)
    ap.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
