#!/usr/bin/env python3
"""test_cualloc_torch.py — tools/cualloc_torch.py (the PyTorch helper) without PyTorch.

A FAKE `torch` package (tests/fake_torch, a test double that records calls and mimics the PyTorch
2.x behaviour the helper relies on) goes first on sys.path; the library is the real one, on the
sim device (meson runs this with CUALLOC_CONF=driver:sim,sim_memory_mb:256):

  - enable() registers libcualloc_torch.so with the right symbol names, loads it once, refuses
    clearly after CUDA initialization (ours and PyTorch's own refusal), and is idempotent;
  - stats() returns libcualloc.so's own figures (moved with cualloc_malloc through ctypes, and
    through the shim's function pointer as PyTorch would call it), from the same copy of the
    library the shim links;
  - the stand-ins answer under PyTorch's key names with cualloc's values, and disable_standins()
    puts PyTorch's functions back;
  - empty_cache() trims; reset_peak_memory_stats() and reset_accumulated_memory_stats() start the
    peaks and the accumulated counts again, as PyTorch's do; mark() works or warns once;
    step marks per optimizer and for all optimizers;
  - the ctypes struct against the header and the C compiler (--layout), and --selftest.

What this cannot show — that the real PyTorch loads the shim, turns its std::runtime_error into
RuntimeError, and trains under cualloc with the stand-ins — is the GPU check, done on a GPU machine.

  python3 tests/test_cualloc_torch.py --lib build/src/libcualloc.so \
      [--torch-lib build/src/libcualloc_torch.so] [--header include/cualloc.h] [--layout sizeof=160,...]
"""
import argparse
import ctypes
import gc
import importlib
import io
import os
import subprocess
import sys
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FAKE_TORCH = os.path.join(HERE, "fake_torch")
TOOLS = os.path.join(ROOT, "tools")

ARGS = None  # parsed command line, set in __main__
MiB = 1 << 20

sys.path.insert(0, FAKE_TORCH)
sys.path.insert(1, TOOLS)


def fresh_modules():
    """A new fake torch and a freshly imported helper for each test (module state reset). The
    shared libraries stay loaded: one process, one heap, as in a real job."""
    for name in [n for n in sys.modules if n == "torch" or n.startswith("torch.") or n == "cualloc_torch"]:
        del sys.modules[name]
    import torch  # the fake
    import cualloc_torch
    assert getattr(torch, "IS_FAKE_TORCH", False), "tests must run against tests/fake_torch, not a real torch"
    return torch, cualloc_torch


def direct_lib():
    """libcualloc.so opened by its own path, independently of the helper."""
    lib = ctypes.CDLL(ARGS.lib)
    lib.cualloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.cualloc_malloc.restype = ctypes.c_void_p
    lib.cualloc_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.cualloc_free.restype = None
    lib.cualloc_check.argtypes = [ctypes.c_int]
    lib.cualloc_check.restype = ctypes.c_int
    return lib


def addr(fn):
    return ctypes.cast(fn, ctypes.c_void_p).value


class TorchLibCase(unittest.TestCase):
    """Tests that need libcualloc_torch.so (skipped where it was not built: no C++ compiler)."""

    def setUp(self):
        if not ARGS.torch_lib:
            self.skipTest("libcualloc_torch.so not built (no C++ compiler)")


class StructLayout(unittest.TestCase):
    def test_matches_header(self):
        _, ct = fresh_modules()
        self.assertEqual(ct.check_struct_against_header(ARGS.header), [])
        self.assertEqual([n for n, _ in ct.header_fields(ARGS.header)], list(ct.STATS_FIELDS))

    def test_matches_compiler(self):
        if not ARGS.layout:
            self.skipTest("no --layout from the C compiler")
        _, ct = fresh_modules()
        for item in ARGS.layout.split(","):
            key, _, value = item.partition("=")
            have = ctypes.sizeof(ct.CuallocStats) if key == "sizeof" else getattr(ct.CuallocStats, key).offset
            self.assertEqual(have, int(value), "%s: ctypes %d, C compiler %s" % (key, have, value))

    def test_header_parser_catches_a_change(self):
        """The header check is not vacuous: a header with a field added must be reported."""
        _, ct = fresh_modules()
        with open(ARGS.header, encoding="utf-8") as f:
            text = f.read()
        changed = text.replace("X(num_trims)", "X(num_trims) \\\n    X(num_new_counter)")
        self.assertNotEqual(changed, text)
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "cualloc_h_changed_%d.h" % os.getpid())
        try:
            with open(path, "w", encoding="utf-8") as f:
                f.write(changed)
            problems = ct.check_struct_against_header(path)
        finally:
            os.unlink(path)
        self.assertTrue(any("field order" in p for p in problems), problems)
        self.assertTrue(any("sizeof" in p for p in problems), problems)


class Discovery(unittest.TestCase):
    def setUp(self):
        self.saved = os.environ.pop("CUALLOC_TORCH_LIB", None)

    def tearDown(self):
        os.environ.pop("CUALLOC_TORCH_LIB", None)
        if self.saved is not None:
            os.environ["CUALLOC_TORCH_LIB"] = self.saved

    def test_explicit_missing_path_is_named(self):
        _, ct = fresh_modules()
        with self.assertRaises(FileNotFoundError) as cm:
            ct.find_library("/nonexistent/dir/libcualloc_torch.so")
        self.assertIn("/nonexistent/dir/libcualloc_torch.so", str(cm.exception))

    def test_every_place_is_named(self):
        _, ct = fresh_modules()
        os.environ["CUALLOC_TORCH_LIB"] = "/nonexistent/env/libcualloc_torch.so"
        ct._candidate_dirs = lambda: ["/nonexistent/a", "/nonexistent/b"]
        saved = ct.ctypes.util.find_library
        ct.ctypes.util.find_library = lambda name: None  # as if the loader cache had no copy
        try:
            with self.assertRaises(FileNotFoundError) as cm:
                ct.find_library()
        finally:
            ct.ctypes.util.find_library = saved
        msg = str(cm.exception)
        for place in ("/nonexistent/env/libcualloc_torch.so (from CUALLOC_TORCH_LIB)",
                      "/nonexistent/a/libcualloc_torch.so", "/nonexistent/b/libcualloc_torch.so", "ldconfig"):
            self.assertIn(place, msg)
        self.assertIn("meson compile", msg)

    def test_sanitizer_builds_are_passed_over(self):
        """A build-asan/src copy would abort an unsanitized python at load: skip it, and say so."""
        _, ct = fresh_modules()
        d = os.path.join(os.environ.get("TMPDIR", "/tmp"), "cualloc_fake_asan_%d" % os.getpid())
        os.makedirs(d, exist_ok=True)
        fake = os.path.join(d, "libcualloc_torch.so")
        try:
            with open(fake, "wb") as f:
                f.write(b"\x7fELF...libasan.so.8\0...")
            ct._candidate_dirs = lambda: [d, "/nonexistent/c"]
            saved = ct.ctypes.util.find_library
            ct.ctypes.util.find_library = lambda name: None
            try:
                with self.assertRaises(FileNotFoundError) as cm:
                    ct.find_library()
            finally:
                ct.ctypes.util.find_library = saved
            self.assertIn("%s (skipped: built with a sanitizer, needs libasan.so preloaded)" % fake, str(cm.exception))
            self.assertEqual(ct.find_library(fake), fake)  # an explicit path is the user's choice
        finally:
            os.unlink(fake)
            os.rmdir(d)

    def test_default_places(self):
        _, ct = fresh_modules()
        dirs = ct._candidate_dirs()
        self.assertEqual(dirs[0], os.path.join(ROOT, "build", "src"))
        self.assertIn(ROOT, dirs)  # installed: module in <libdir>/cualloc, library in <libdir>
        self.assertIn("/usr/local/lib", dirs)

    def test_env_and_explicit(self):
        if not ARGS.torch_lib:
            self.skipTest("libcualloc_torch.so not built (no C++ compiler)")
        _, ct = fresh_modules()
        os.environ["CUALLOC_TORCH_LIB"] = ARGS.torch_lib
        self.assertEqual(ct.find_library(), os.path.abspath(ARGS.torch_lib))
        os.environ["CUALLOC_TORCH_LIB"] = os.path.dirname(ARGS.torch_lib)  # a directory works too
        self.assertEqual(ct.find_library(), os.path.abspath(ARGS.torch_lib))
        del os.environ["CUALLOC_TORCH_LIB"]
        self.assertEqual(ct.find_library(os.path.dirname(ARGS.torch_lib)), os.path.abspath(ARGS.torch_lib))

    def test_env_naming_nothing_is_said(self):
        """CUALLOC_TORCH_LIB naming no file (a typo, a removed build) while the search finds another
        copy: that copy is used, with a warning naming the variable's value and the copy. It was
        passed over in silence, so a job ran on a library other than the one asked for."""
        if not ARGS.torch_lib:
            self.skipTest("libcualloc_torch.so not built (no C++ compiler)")
        _, ct = fresh_modules()
        os.environ["CUALLOC_TORCH_LIB"] = "/nonexistent/env/libcualloc_torch.so"
        ct._candidate_dirs = lambda: ["/nonexistent/a", os.path.dirname(os.path.abspath(ARGS.torch_lib))]
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            found = ct.find_library()
        self.assertEqual(found, os.path.join(os.path.dirname(os.path.abspath(ARGS.torch_lib)), "libcualloc_torch.so"))
        said = [str(x.message) for x in w]
        self.assertTrue(any("CUALLOC_TORCH_LIB=/nonexistent/env/libcualloc_torch.so" in m and found in m
                            for m in said), said)
        # attributed to the line that called find_library, not to the helper's own code
        self.assertEqual([x.filename for x in w], [__file__])
        # and through enable(), which calls find_library: still the caller's line
        _, ct = fresh_modules()
        ct._candidate_dirs = lambda: ["/nonexistent/a", os.path.dirname(os.path.abspath(ARGS.torch_lib))]
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ct.enable()
        self.assertEqual([(x.filename, x.lineno) for x in w if "CUALLOC_TORCH_LIB" in str(x.message)],
                         [(__file__, sys._getframe().f_lineno - 2)])
        # --find says so on stderr, and still prints the copy it found.
        code = ("import sys; sys.path.insert(0, %r); import cualloc_torch; "
                "sys.exit(cualloc_torch.main(['--find']))" % TOOLS)
        env = dict(os.environ, CUALLOC_TORCH_LIB="/nonexistent/env/libcualloc_torch.so")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        if r.returncode == 0:  # a copy was found (the build tree beside tools/, or an installed one)
            self.assertIn("CUALLOC_TORCH_LIB=/nonexistent/env/libcualloc_torch.so", r.stderr)

    def test_imports_without_torch(self):
        """The module itself must not import torch."""
        code = ("import sys; sys.path.insert(0, %r); import cualloc_torch; "
                "assert 'torch' not in sys.modules, 'imported torch'; print('ok')" % TOOLS)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)


class Enable(TorchLibCase):
    def refused(self, ct):
        """The RuntimeError enable() raises (the test fails when it raises none)."""
        with self.assertRaises(RuntimeError) as cm:
            ct.enable(ARGS.torch_lib)
        return cm.exception

    def test_registers_the_library_and_symbols(self):
        torch, ct = fresh_modules()
        alloc = ct.enable(ARGS.torch_lib)
        st = torch.cuda._state
        self.assertEqual(st["allocators"], [(os.path.abspath(ARGS.torch_lib), "cualloc_torch_malloc", "cualloc_torch_free")])
        self.assertEqual(st["changed_to"], [alloc])
        self.assertIs(st["current"], alloc)
        self.assertTrue(ct.is_enabled())
        # Enable does not initialize CUDA (that would have been too late for the swap).
        self.assertFalse(torch.cuda.is_initialized())
        # Again: a no-op, no second registration.
        self.assertIs(ct.enable(ARGS.torch_lib), alloc)
        self.assertEqual(st["change_calls"], 1)

    def test_after_initialization_is_a_clear_error(self):
        torch, ct = fresh_modules()
        torch.cuda._fake_empty(1024)  # a CUDA tensor under the native allocator
        self.assertTrue(torch.cuda.is_initialized())
        msg = str(self.refused(ct))
        self.assertIn("after CUDA was initialized", msg)
        self.assertIn("before creating any CUDA tensor", msg)
        self.assertIn("LD_PRELOAD", msg)
        self.assertEqual(torch.cuda._state["change_calls"], 0)
        self.assertFalse(ct.is_enabled())
        self.assertEqual(ct._originals, {})

    def test_pytorch_refusal_is_rewrapped(self):
        """is_initialized() says no but PyTorch still refuses (its allocator was used another way):
        the user gets our advice and PyTorch's words."""
        torch, ct = fresh_modules()
        torch.cuda._state["native_used"] = True
        err = self.refused(ct)
        self.assertIn("before creating any CUDA tensor", str(err))
        self.assertIn("Can't swap an already initialized allocator", str(err))
        self.assertIsInstance(err.__cause__, RuntimeError)
        self.assertFalse(ct.is_enabled())

    def test_another_pluggable_allocator_is_named(self):
        """Another pluggable allocator swapped in first (by the script or a library, e.g. RMM's
        rmm_torch_allocator): PyTorch refuses a second swap although CUDA is not initialized, so
        the error must name that allocator, not send the user to move enable() before CUDA's
        initialization, which would change nothing."""
        torch, ct = fresh_modules()
        other = torch.cuda.memory.CUDAPluggableAllocator(ARGS.torch_lib, "cualloc_torch_malloc",
                                                         "cualloc_torch_free")  # not through cualloc_torch
        torch.cuda.memory.change_current_allocator(other)
        self.assertFalse(torch.cuda.is_initialized())
        msg = str(self.refused(ct))
        self.assertIn("another pluggable allocator", msg)
        self.assertIn("change_current_allocator", msg)
        self.assertNotIn("after CUDA was initialized", msg)
        self.assertFalse(ct.is_enabled())
        self.assertEqual(ct._originals, {})
        self.assertIs(torch.cuda._state["current"], other)

    def test_again_without_a_path(self):
        """enable(path) first, then enable() (a library's own call, say): a no-op, even where the
        default search would find no library or another copy."""
        torch, ct = fresh_modules()
        alloc = ct.enable(ARGS.torch_lib)
        saved_env = os.environ.pop("CUALLOC_TORCH_LIB", None)
        ct._candidate_dirs = lambda: ["/nonexistent/a"]
        saved = ct.ctypes.util.find_library
        ct.ctypes.util.find_library = lambda name: None
        try:
            self.assertIs(ct.enable(), alloc)
            os.environ["CUALLOC_TORCH_LIB"] = "/nonexistent/env/libcualloc_torch.so"
            self.assertIs(ct.enable(step_marks=True), alloc)
        finally:
            ct.ctypes.util.find_library = saved
            os.environ.pop("CUALLOC_TORCH_LIB", None)
            if saved_env is not None:
                os.environ["CUALLOC_TORCH_LIB"] = saved_env
        self.assertEqual(torch.cuda._state["change_calls"], 1)
        self.assertIsNotNone(ct._global_hook_handle)
        ct._global_hook_handle.remove()
        # Another library named explicitly is still refused.
        with self.assertRaisesRegex(RuntimeError, "already enabled"):
            ct.enable(os.path.join(os.path.dirname(ARGS.torch_lib), "libcualloc.so"))

    def test_library_the_loader_cache_names(self):
        """Found only in the dynamic loader's cache, the library is a bare name, not a path:
        enable() loads it for the statistics as PyTorch loaded it, rather than looking for a file
        of that name after the swap (which failed, leaving the allocator swapped and enable() a
        TypeError the next time)."""
        code = "\n".join([
            "import os, sys",
            "sys.path[:0] = [%r, %r]" % (FAKE_TORCH, TOOLS),
            "import torch, cualloc_torch as ct",
            "os.environ.pop('CUALLOC_TORCH_LIB', None)",
            "ct._candidate_dirs = lambda: ['/nonexistent/a']",
            "ct.ctypes.util.find_library = lambda name: 'libcualloc_torch.so'  # as ldconfig -p would",
            "alloc = ct.enable()",
            "assert torch.cuda._state['allocators'][0][0] == 'libcualloc_torch.so'",
            "t = torch.cuda._fake_empty(1 << 20)",
            "assert torch.cuda.memory_allocated() == ct.stats()['allocated_bytes'] >= 1 << 20",
            "t.free()",
            "assert ct.enable() is alloc",
            "print('ok')"])
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(ARGS.torch_lib))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip().splitlines()[-1:], ["ok"], r.stdout + r.stderr)

    def test_again_after_a_reload(self):
        """The swap outlives the module (importlib.reload, a notebook's autoreload, a second copy
        of it): enable() again uses the allocator in use, where PyTorch would refuse a second swap
        even before CUDA is initialized, and also after it, tensors made."""
        torch, ct = fresh_modules()
        alloc = ct.enable(ARGS.torch_lib)
        original_stats = ct._originals["torch.cuda.memory_stats"]
        t = torch.cuda._fake_empty(MiB)  # CUDA initialized, under cualloc
        ct = importlib.reload(ct)
        self.assertFalse(ct.is_enabled())
        self.assertIs(ct.enable(ARGS.torch_lib), alloc)
        self.assertIs(ct.enable(), alloc)
        self.assertTrue(ct.is_enabled())
        self.assertEqual(torch.cuda._state["change_calls"], 1)
        self.assertEqual(torch.cuda.memory_allocated(), ct.stats()["allocated_bytes"])
        t.free()
        with self.assertRaisesRegex(RuntimeError, "already enabled"):
            ct.enable(os.path.join(os.path.dirname(ARGS.torch_lib), "libcualloc.so"))
        ct.disable_standins()  # PyTorch's own functions come back, not the first copy's stand-ins
        self.assertIs(torch.cuda.memory_stats, original_stats)

    def test_graph_capture_is_refused(self):
        """A CUDA graph captured under a pluggable allocator would replay into memory cualloc has
        handed to other tensors: the capture is refused before it starts, with the ways out."""
        torch, ct = fresh_modules()
        g = torch.cuda.CUDAGraph()
        g.capture_begin()  # PyTorch's own allocator: captures
        self.assertEqual(torch.cuda._state["captures"], 1)
        ct.enable(ARGS.torch_lib)
        stream = torch.cuda.current_stream()
        with self.assertRaises(RuntimeError) as cm:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                pass
        # Refused before torch.cuda.graph makes its capture stream current: an __enter__ that
        # raises gets no __exit__, so all later work would have run on that side stream.
        self.assertIs(torch.cuda.current_stream(), stream)
        self.assertIn("CUDA graph capture is not supported under cualloc_torch.enable()", str(cm.exception))
        self.assertIn("LD_PRELOAD", str(cm.exception))
        self.assertEqual(torch.cuda._state["captures"], 1)
        ct.enable(ARGS.torch_lib)  # again: still refused, wrapped once
        with self.assertRaises(RuntimeError):
            torch.cuda.graphs.CUDAGraph().capture_begin(capture_error_mode="thread_local")
        self.assertEqual(torch.cuda._state["captures"], 1)

    def test_cudnn_benchmark_warns(self):
        """cuDNN's benchmark mode fails every convolution under a pluggable allocator (cacheInfo):
        turning it on after enable() warns once and is still done as asked; on before enable(), the
        warning comes from enable()."""
        torch, ct = fresh_modules()
        ct.enable(ARGS.torch_lib)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.backends.cudnn.benchmark = False
            self.assertEqual(w, [])
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.benchmark = True
        self.assertIs(torch.backends.cudnn.benchmark, True)
        self.assertEqual(len(w), 1, [str(x.message) for x in w])
        self.assertIs(w[0].category, RuntimeWarning)
        self.assertIn("cacheInfo", str(w[0].message))
        self.assertIn("LD_PRELOAD", str(w[0].message))
        self.assertEqual(w[0].filename, __file__)  # the line that set it, not the helper's
        ct.enable(ARGS.torch_lib)  # again: wrapped once
        self.assertIs(type(type(torch.backends.cudnn).__dict__["benchmark"].prop).__name__, "ContextProp")

        torch, ct = fresh_modules()
        torch.backends.cudnn.benchmark = True
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            ct.enable(ARGS.torch_lib)
        self.assertEqual([str(x.message)[:60] for x in w], [ct.CUDNN_BENCHMARK_MESSAGE[:60]])

    def test_cpu_only_build_is_a_clear_error(self):
        """A PyTorch built without CUDA has the CUDAPluggableAllocator class but not its binding:
        enable() says what is wrong instead of letting an AttributeError about torch._C out."""
        torch, ct = fresh_modules()
        torch.cuda._state["built_with_cuda"] = False
        msg = str(self.refused(ct))
        self.assertIn("built without CUDA", msg)
        self.assertIn("torch.backends.cuda.is_built()", msg)
        self.assertEqual(torch.cuda._state["change_calls"], 0)
        self.assertFalse(ct.is_enabled())
        self.assertEqual(ct._originals, {})

    def test_rocm_build_is_a_clear_error(self):
        """A ROCm build of PyTorch says torch.backends.cuda.is_built() too, but its devices are
        AMD's: enable() refuses it by name instead of every allocation failing as out of memory."""
        torch, ct = fresh_modules()
        torch.version.hip = "6.2.41133"
        msg = str(self.refused(ct))
        self.assertIn("ROCm build", msg)
        self.assertIn("6.2.41133", msg)
        self.assertEqual(torch.cuda._state["change_calls"], 0)
        self.assertFalse(ct.is_enabled())

    def test_missing_library(self):
        torch, ct = fresh_modules()
        with self.assertRaises(FileNotFoundError):
            ct.enable("/nonexistent/libcualloc_torch.so")
        self.assertEqual(torch.cuda._state["change_calls"], 0)


class Stats(TorchLibCase):
    def setUp(self):
        super().setUp()
        self.torch, self.ct = fresh_modules()
        self.ct.enable(ARGS.torch_lib)
        self.lib = direct_lib()

    def tearDown(self):
        self.assertEqual(self.lib.cualloc_check(0), 0)

    def test_same_copy_of_the_library(self):
        helper = self.ct.library()
        self.assertEqual(addr(helper.cualloc_get_stats), addr(self.lib.cualloc_get_stats))
        self.assertEqual(addr(helper.cualloc_malloc), addr(self.lib.cualloc_malloc))

    def test_fields_and_real_figures(self):
        s0 = self.ct.stats()
        self.assertEqual(set(s0), set(self.ct.STATS_FIELDS))
        self.assertEqual(len(s0), 20)
        self.assertEqual(s0, self.ct.stats(0))
        self.assertEqual(s0, self.ct.stats("cuda:0"))
        self.assertEqual(s0, self.ct.stats(self.torch.device("cuda", 0)))
        p = self.lib.cualloc_malloc(8 * MiB + 100, 0, None)
        self.assertTrue(p)
        try:
            s1 = self.ct.stats()
            self.assertEqual(s1["requested_bytes"] - s0["requested_bytes"], 8 * MiB + 100)
            self.assertEqual(s1["allocated_bytes"] - s0["allocated_bytes"], 8 * MiB + 512)
            self.assertEqual(s1["num_allocs"] - s0["num_allocs"], 1)
            self.assertGreaterEqual(s1["reserved_bytes"], s1["allocated_bytes"])
            self.assertGreaterEqual(s1["allocated_peak"], s1["allocated_bytes"])
            self.assertEqual(s1["capacity_bytes"], 256 * MiB)  # sim_memory_mb:256
        finally:
            self.lib.cualloc_free(p, None)
        s2 = self.ct.stats()
        self.assertEqual(s2["allocated_bytes"], s0["allocated_bytes"])
        self.assertEqual(s2["num_frees"] - s0["num_frees"], 1)

    def test_through_the_shim_as_pytorch_calls_it(self):
        s0 = self.ct.stats()
        t = self.torch.cuda._fake_empty(3 * MiB)
        self.assertTrue(t.ptr)
        self.assertEqual(self.ct.stats()["allocated_bytes"] - s0["allocated_bytes"], 3 * MiB)
        t.free()
        self.assertEqual(self.ct.stats()["allocated_bytes"], s0["allocated_bytes"])

    def test_bad_device(self):
        with self.assertRaises(ValueError):
            self.ct.stats(5)
        with self.assertRaises(ValueError):
            self.ct.stats("cpu")
        # ctypes cuts an int to 32 bits: 2**32 was device 0, True device 1.
        for bad in (2**32, "cuda:4294967296", -2**31 - 1, True):
            with self.assertRaises(ValueError, msg=repr(bad)):
                self.ct.stats(bad)
        with self.assertRaises(ValueError):
            self.ct.empty_cache(2**32)
        with self.assertRaisesRegex(ValueError, "device 5 is not a device cualloc can use"):
            self.ct.empty_cache(5)  # as stats(5): not a silent no-op

    def test_empty_cache_trims(self):
        p = self.lib.cualloc_malloc(64 * MiB, 0, None)
        self.lib.cualloc_free(p, None)
        before = self.ct.stats()
        self.assertGreaterEqual(before["reserved_bytes"] - before["allocated_bytes"], 64 * MiB)
        self.torch.cuda.empty_cache()  # the stand-in
        after = self.ct.stats()
        self.assertEqual(after["num_trims"], before["num_trims"] + 1)
        self.assertLess(after["reserved_bytes"], before["reserved_bytes"])
        self.assertEqual(self.torch.cuda._state["empty_cache_calls"], 0)  # PyTorch's was not used
        self.ct.empty_cache(0)
        self.assertEqual(self.ct.stats()["num_trims"], before["num_trims"] + 2)


class Standins(TorchLibCase):
    def setUp(self):
        super().setUp()
        self.torch, self.ct = fresh_modules()
        self.original_stats = self.torch.cuda.memory_stats
        self.ct.enable(ARGS.torch_lib)
        self.lib = direct_lib()
        self.p = self.lib.cualloc_malloc(5 * MiB, 0, None)

    def tearDown(self):
        self.lib.cualloc_free(self.p, None)

    def test_pytorch_key_names_with_cualloc_values(self):
        c = self.torch.cuda
        s = self.ct.stats()
        ms = c.memory_stats()
        self.assertIs(c.memory.memory_stats, self.ct.memory_stats)
        expected = {
            "allocated_bytes.all.current": s["allocated_bytes"], "allocated_bytes.all.peak": s["allocated_peak"],
            "reserved_bytes.all.current": s["reserved_bytes"], "reserved_bytes.all.peak": s["reserved_peak"],
            "requested_bytes.all.current": s["requested_bytes"], "requested_bytes.all.peak": s["requested_peak"],
            "active_bytes.all.current": s["active_bytes"], "active_bytes.all.peak": s["active_peak"],
            "inactive_split_bytes.all.current": s["inactive_split_bytes"],
            "inactive_split_bytes.all.peak": s["inactive_split_peak"],
            "num_alloc_retries": s["num_alloc_retries"], "num_ooms": s["num_ooms"],
            "num_device_alloc": s["num_maps"], "num_device_free": s["num_unmaps"],
            "num_sync_all_streams": s["num_syncs"],
            "allocation.all.current": s["num_allocs"] - s["num_frees"],
            "allocation.all.allocated": s["num_allocs"], "allocation.all.freed": s["num_frees"],
        }
        for k, v in expected.items():
            self.assertEqual(ms[k], v, k)
        # Only these (README.md lists them): a key of PyTorch's that cualloc cannot give (per pool,
        # block and segment counts, oversize figures) is a KeyError, never a made-up figure.
        self.assertEqual(set(ms), set(expected))
        self.assertEqual(list(ms), sorted(ms))  # PyTorch returns its keys sorted
        # The same figures nested, as torch.cuda.memory_stats_as_nested_dict gives them.
        nested = c.memory_stats_as_nested_dict()
        self.assertEqual(nested["allocated_bytes"]["all"]["current"], s["allocated_bytes"])
        self.assertEqual(nested["reserved_bytes"]["all"]["peak"], s["reserved_peak"])
        self.assertEqual(nested["num_ooms"], s["num_ooms"])
        self.assertEqual(c.memory.memory_stats_as_nested_dict(0), nested)
        self.assertGreaterEqual(ms["allocated_bytes.all.current"], 5 * MiB)
        self.assertEqual(c.memory_allocated(), s["allocated_bytes"])
        self.assertEqual(c.memory_allocated(0), s["allocated_bytes"])
        self.assertEqual(c.memory.memory_allocated(device=0), s["allocated_bytes"])
        self.assertEqual(c.max_memory_allocated(), s["allocated_peak"])
        self.assertEqual(c.memory_reserved(), s["reserved_bytes"])
        self.assertEqual(c.max_memory_reserved(), s["reserved_peak"])
        self.assertIn("allocated_bytes", c.memory_summary())

    ACCUMULATED_KEYS = ("allocation.all.allocated", "allocation.all.freed", "num_alloc_retries", "num_ooms",
                        "num_device_alloc", "num_device_free", "num_sync_all_streams")

    def test_reset_accumulated(self):
        """reset_accumulated_memory_stats starts PyTorch's accumulated figures again from 0 (PyTorch's
        DeviceCachingAllocator::resetAccumulatedStats: the .allocated/.freed of every stat and the
        event counters), and touches neither the current figures nor the peaks."""
        c = self.torch.cuda
        t = c._fake_empty(2 * MiB)
        t.free()
        self.assertIsNone(self.lib.cualloc_malloc(1 << 50, 0, None))  # an OOM: counted in num_ooms
        before = c.memory_stats()
        self.assertGreater(before["allocation.all.allocated"], 0)
        self.assertGreater(before["allocation.all.freed"], 0)
        self.assertGreater(before["num_ooms"], 0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.reset_accumulated_memory_stats()
        self.assertEqual(w, [])
        ms = c.memory_stats()
        for k in self.ACCUMULATED_KEYS:
            self.assertEqual(ms[k], 0, k)
        for k in ("allocation.all.current", "allocated_bytes.all.current", "allocated_bytes.all.peak",
                  "reserved_bytes.all.current", "reserved_bytes.all.peak"):
            self.assertEqual(ms[k], before[k], k)
        # Counted from the reset; cualloc's own counters (stats()) still since start.
        u = c._fake_empty(3 * MiB)
        ms = c.memory_stats()
        self.assertEqual((ms["allocation.all.allocated"], ms["allocation.all.freed"]), (1, 0))
        self.assertEqual(ms["allocation.all.current"], before["allocation.all.current"] + 1)
        u.free()
        self.assertIsNone(self.lib.cualloc_malloc(1 << 50, 0, None))
        ms = c.memory_stats()
        self.assertEqual((ms["allocation.all.allocated"], ms["allocation.all.freed"], ms["num_ooms"]), (1, 1, 1))
        self.assertEqual(c.memory_stats_as_nested_dict()["allocation"]["all"]["allocated"], 1)
        s = self.ct.stats()
        self.assertEqual(s["num_ooms"], before["num_ooms"] + 1)
        self.assertEqual(s["num_allocs"] - s["num_frees"], ms["allocation.all.current"])
        # Per device, and through torch.accelerator's namesake too.
        c.memory.reset_accumulated_memory_stats(0)
        self.assertEqual(c.memory_stats(0)["num_ooms"], 0)
        with self.assertRaises(ValueError):
            c.reset_accumulated_memory_stats(7)
        self.assertIsNone(self.lib.cualloc_malloc(1 << 50, 0, None))
        self.assertEqual(self.torch.accelerator.memory_stats()["num_ooms"], 1)
        self.torch.accelerator.reset_accumulated_memory_stats()
        self.assertEqual(self.torch.accelerator.memory_stats()["num_ooms"], 0)

    def test_reset_accumulated_in_a_forked_child(self):
        """A forked child starts with fresh heaps (counters from 0) but inherits the values kept at
        the parent's reset: its figures count its own heap, never below 0."""
        c = self.torch.cuda
        for _ in range(3):
            c._fake_empty(MiB).free()
        c.reset_accumulated_memory_stats()
        self.assertEqual(c.memory_stats()["allocation.all.allocated"], 0)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, and leave without unittest's cleanup
            try:
                c._fake_empty(MiB).free()
                ms = c.memory_stats()
                msg = "%d %d" % (ms["allocation.all.allocated"], ms["allocation.all.freed"])
            except BaseException as e:
                msg = repr(e)
            os.write(w, msg.encode())
            os._exit(0)
        os.close(w)
        with os.fdopen(r) as f:
            got = f.read()
        os.waitpid(pid, 0)
        self.assertEqual(got, "1 1")

    def test_reset_accumulated_after_a_reload(self):
        """The counts since a reset survive the module being loaded again (importlib.reload, a
        notebook's autoreload), as the stand-ins themselves do."""
        c = self.torch.cuda
        c.reset_accumulated_memory_stats()
        t = c._fake_empty(MiB)
        t.free()
        ct = importlib.reload(self.ct)
        ct.enable(ARGS.torch_lib)
        ms = c.memory_stats()
        self.assertEqual((ms["allocation.all.allocated"], ms["allocation.all.freed"]), (1, 1))

    def test_reset_peaks(self):
        """reset_peak_memory_stats brings the peaks down to the current figures, as PyTorch's does,
        and leaves the accumulated figures alone."""
        c = self.torch.cuda
        t = c._fake_empty(48 * MiB)
        t.free()
        self.assertGreater(c.max_memory_allocated(), c.memory_allocated())
        accumulated = {k: c.memory_stats()[k] for k in self.ACCUMULATED_KEYS}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c.reset_peak_memory_stats()
            self.assertEqual({k: c.memory_stats()[k] for k in self.ACCUMULATED_KEYS}, accumulated)
            self.assertEqual(c.max_memory_allocated(), c.memory_allocated())
            self.assertEqual(c.max_memory_reserved(), c.memory_reserved())
            u = c._fake_empty(3 * MiB)
            self.assertEqual(c.max_memory_allocated(), c.memory_allocated())
            u.free()
            self.assertEqual(c.max_memory_allocated(), c.memory_allocated() + 3 * MiB)
            c.memory.reset_max_memory_allocated(0)
            self.assertEqual(c.max_memory_allocated(0), c.memory_allocated(0))
            self.assertEqual(w, [])
            with self.assertRaises(ValueError):
                c.reset_peak_memory_stats(7)

    def test_accelerator_functions(self):
        """PyTorch's device-agnostic torch.accelerator memory functions ask the device allocator
        directly, not torch.cuda.memory_stats, so they need stand-ins of their own."""
        acc, s = self.torch.accelerator, self.ct.stats()
        self.assertEqual(acc.memory_allocated(), s["allocated_bytes"])
        self.assertEqual(acc.memory_allocated(0), s["allocated_bytes"])
        self.assertEqual(acc.memory.max_memory_allocated(), s["allocated_peak"])
        self.assertEqual(acc.memory_reserved(), s["reserved_bytes"])
        self.assertEqual(acc.max_memory_reserved(), s["reserved_peak"])
        self.assertEqual(acc.memory_stats()["allocated_bytes.all.current"], s["allocated_bytes"])
        t = self.torch.cuda._fake_empty(48 * MiB)
        t.free()
        self.assertGreater(acc.max_memory_allocated(), acc.memory_allocated())
        acc.reset_peak_memory_stats()
        self.assertEqual(acc.max_memory_allocated(), acc.memory_allocated())
        trims = self.ct.stats()["num_trims"]
        acc.empty_cache()
        self.assertEqual(self.ct.stats()["num_trims"], trims + 1)
        self.assertEqual(self.torch.cuda._state["empty_cache_calls"], 0)  # PyTorch's was not used
        self.ct.disable_standins()
        with self.assertRaisesRegex(RuntimeError, "does not yet support getDeviceStats"):
            acc.memory_allocated()

    def test_disable_standins_restores_pytorch(self):
        self.assertIn("torch.cuda.memory_stats", self.ct._originals)
        self.assertIn("torch.cuda.memory.memory_stats", self.ct._originals)
        self.assertIs(self.ct._originals["torch.cuda.memory_stats"], self.original_stats)
        self.ct.disable_standins()
        self.assertEqual(self.ct._originals, {})
        self.assertIs(self.torch.cuda.memory_stats, self.original_stats)
        # ...which is why the stand-ins exist: PyTorch's raise under a pluggable allocator.
        with self.assertRaisesRegex(RuntimeError, "does not yet support getDeviceStats"):
            self.torch.cuda.memory_allocated()
        self.ct.install_standins()
        self.assertEqual(self.torch.cuda.memory_allocated(), self.ct.stats()["allocated_bytes"])

    def test_standins_off(self):
        torch, ct = fresh_modules()
        original = torch.cuda.memory_stats
        ct.enable(ARGS.torch_lib, standins=False)
        self.assertIs(torch.cuda.memory_stats, original)
        self.assertEqual(ct._originals, {})


# Run in a child process on two sim devices (this process's library has one: CUALLOC_CONF is read
# once). The fake torch and cualloc_torch come first on its path; it prints "ok" at the end.
TWO_DEVICES_CHILD = r"""
import sys
sys.path[:0] = [%(fake)r, %(tools)r]
import torch, cualloc_torch as ct
MiB = 1 << 20
torch.cuda._state["device_count"] = 2
ct.enable(%(lib)r)
c = torch.cuda
with c.device(1):                        # a tensor made on device 1
    t = c._fake_empty(3 * MiB)
    assert c.memory_allocated() == ct.stats(1)["allocated_bytes"] == 3 * MiB, c.memory_allocated()
assert c.current_device() == 0
assert c.memory_allocated() == ct.stats(0)["allocated_bytes"] == 0
for dev in (1, "cuda:1", torch.device("cuda", 1), c.device(1)):
    got = c.memory_allocated(dev), c.max_memory_allocated(dev), c.memory_stats(dev)["allocated_bytes.all.current"]
    assert got == (3 * MiB, 3 * MiB, 3 * MiB), "device %%r: %%r" %% (dev, got)
try:
    c.memory_allocated(c.device(5))
    raise AssertionError("torch.cuda.device(5) of 2 devices was read")
except ValueError:
    pass
before0 = c.memory_stats(0)["allocation.all.allocated"]
c.reset_accumulated_memory_stats("cuda:1")  # that device's counts only
assert c.memory_stats(1)["allocation.all.allocated"] == 0 and c.memory_stats(1)["allocation.all.current"] == 1
assert c.memory_stats(0)["allocation.all.allocated"] == before0
c.set_device(1)
u = c._fake_empty(MiB)
assert c.memory_allocated() == 4 * MiB and ct.stats(0)["allocated_bytes"] == 0
assert c.memory_stats()["allocation.all.allocated"] == 1, c.memory_stats()
c.reset_accumulated_memory_stats()          # the current device: 1
assert c.memory_stats(1)["allocation.all.allocated"] == 0
t.free()
u.free()
assert ct.stats(1)["reserved_bytes"] > 0
c.empty_cache()                          # every device's cache, as PyTorch's
assert ct.stats(1)["reserved_bytes"] == 0, ct.stats(1)
print("ok")
"""


class TwoDevices(TorchLibCase):
    def test_device_arguments_name_the_device(self):
        """Every form of PyTorch's device argument reads that device, torch.cuda.device (the context
        manager, whose ordinal is its idx) included; a tensor goes to the current device."""
        code = TWO_DEVICES_CHILD % {"fake": FAKE_TORCH, "tools": TOOLS, "lib": ARGS.torch_lib}
        env = dict(os.environ, CUALLOC_CONF="driver:sim,sim_memory_mb:256,sim_devices:2")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip().splitlines()[-1:], ["ok"], r.stdout + r.stderr)


class Marks(TorchLibCase):
    def setUp(self):
        super().setUp()
        self.torch, self.ct = fresh_modules()

    def test_mark_works_or_warns_once(self):
        self.ct.enable(ARGS.torch_lib)
        has_mark = hasattr(ctypes.CDLL(ARGS.lib), "cualloc_mark")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.ct.mark("phase one")
            self.ct.mark("phase two")
        if has_mark:
            self.assertEqual(w, [], "cualloc_mark exists, so no warning")
        else:
            self.assertEqual(len(w), 1, [str(x.message) for x in w])
            self.assertIn("no cualloc_mark", str(w[0].message))

    def _record_marks(self):
        marks = []
        self.ct.mark = marks.append  # the hooks call the module's mark()
        return marks

    def test_watch_optimizer(self):
        marks = self._record_marks()
        opt = self.torch.optim.AdamW()
        handle = self.ct.watch_optimizer(opt)
        opt.step()
        opt.step()
        start = "START Optimizer.step#AdamW.step"  # PyTorch's own annotation of the step
        self.assertEqual(marks, [start, "step 1", start, "step 2"])
        handle.remove()
        opt.step()
        self.assertEqual(marks, [start, "step 1", start, "step 2"])

    def test_step_marks_for_all_optimizers(self):
        marks = self._record_marks()
        self.ct.enable(ARGS.torch_lib, step_marks=True)
        g, d = self.torch.optim.Optimizer(), self.torch.optim.Optimizer()
        g.step()
        d.step()
        g.step()
        start = "START Optimizer.step#Optimizer.step"
        self.assertEqual(marks, [start, "step 1", start, "step 1 (optimizer 1)", start, "step 2"])
        # An optimizer also watched explicitly is marked once per step, not twice.
        marks.clear()
        handle = self.ct.watch_optimizer(g)
        g.step()
        self.assertEqual(marks, [start, "step 3"])
        # Unwatched again: the global hooks mark it (it was left out of them for good).
        marks.clear()
        handle.remove()
        g.step()
        self.assertEqual(marks, [start, "step 4"])
        # A new optimizer after the first is gone takes the plain "step N"; one made while d lives
        # never takes d's number.
        marks.clear()
        del g
        gc.collect()
        e = self.torch.optim.Optimizer()
        e.step()
        d.step()
        self.assertEqual(marks, [start, "step 1", start, "step 2 (optimizer 1)"])
        self.ct._global_hook_handle.remove()

    def test_step_marks_once_after_a_reload(self):
        """The module reloaded (importlib.reload, a notebook's autoreload) and enable(step_marks=True)
        called again: every step is marked once, its count going on from before the reload."""
        self.ct.enable(ARGS.torch_lib, step_marks=True)
        opt = self.torch.optim.Optimizer()
        opt.step()
        self.ct = importlib.reload(self.ct)
        marks = self._record_marks()
        self.ct.enable(ARGS.torch_lib, step_marks=True)
        opt.step()
        start = "START Optimizer.step#Optimizer.step"
        self.assertEqual(marks, [start, "step 2"])
        marks.clear()
        handle = self.ct.watch_optimizer(opt)  # watched by the reloaded module: still once a step
        opt.step()
        self.assertEqual(marks, [start, "step 3"])
        handle.remove()
        self.ct._global_hook_handle.remove()
        marks.clear()
        opt.step()  # no hooks left: neither marked nor counted
        self.assertEqual(marks, [])
        self.ct.enable(ARGS.torch_lib, step_marks=True)  # registered anew
        opt.step()
        self.assertEqual(marks, [start, "step 4"])
        self.ct._global_hook_handle.remove()


class SelfTest(unittest.TestCase):
    def test_selftest_passes(self):
        cmd = [sys.executable, os.path.join(TOOLS, "cualloc_torch.py"), "--selftest", "--header", ARGS.header]
        if ARGS.layout:
            cmd += ["--layout", ARGS.layout]
        if ARGS.torch_lib:
            cmd += ["--lib", ARGS.torch_lib]
        r = subprocess.run(cmd, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("cualloc_torch selftest: ok", r.stdout)
        self.assertNotIn("FAIL", r.stdout)

    def test_bad_arguments_fail_naming_them(self):
        # A header or library named but not there was skipped (exit 0), a bad --layout raised.
        for args, named in ((["--header", "/nonexistent/cualloc.h"], "--header /nonexistent/cualloc.h"),
                            (["--lib", "/nonexistent-dir"], "--lib: "),
                            (["--layout", "sizeof=abc"], "--layout item 'sizeof=abc'"),
                            (["--layout", "no_such_field=8"], "--layout item 'no_such_field=8'"),
                            (["--layout", "junk"], "--layout item 'junk'")):
            cmd = [sys.executable, os.path.join(TOOLS, "cualloc_torch.py"), "--selftest"] + args
            r = subprocess.run(cmd, capture_output=True, text=True)
            self.assertEqual(r.returncode, 1, " ".join(args) + ": " + r.stdout + r.stderr)
            self.assertIn("FAIL: " + named, r.stdout)
            self.assertNotIn("Traceback", r.stderr)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libcualloc.so")
    ap.add_argument("--torch-lib", help="libcualloc_torch.so (tests needing it skip without)")
    ap.add_argument("--header", default=os.path.join(ROOT, "include", "cualloc.h"))
    ap.add_argument("--layout", help="sizeof=N,field=OFFSET,... from the C compiler")
    ARGS, rest = ap.parse_known_args()
    ARGS.lib = os.path.abspath(ARGS.lib)
    if ARGS.torch_lib:
        ARGS.torch_lib = os.path.abspath(ARGS.torch_lib)
    if "driver:sim" not in os.environ.get("CUALLOC_CONF", ""):
        print("test_cualloc_torch: needs CUALLOC_CONF=driver:sim,sim_memory_mb:256 (meson sets it)", file=sys.stderr)
        sys.exit(2)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
