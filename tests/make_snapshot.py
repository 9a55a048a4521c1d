"""make_snapshot.py OUT.pickle [varlen|optstep [OPTIMIZER]] — a small PyTorch memory snapshot, shaped like the
ones torch.cuda.memory._dump_snapshot writes (segments with blocks, one device's events with
frames, external_annotations), whose frames carry PyTorch's machinery the way real ones do: its
stack capture, its caching allocator, tensor factories, dispatcher wrappers (Register*.cpp,
at::_ops), the interpreter's loop, nn.Module's call wrapper and the process start, around an
operator (at::native::...) and the user's Python lines. For tests/check_import.sh, which checks
what allocview makes of it without the corpus.
  varlen   six steps whose activations follow drawn sequence lengths (3, 8, 2, 5, 7, 1 units)
  optstep  one step whose optimizer makes its state (4 x 64 MiB) on top of parameters: the peak
           lies inside the annotated optimizer step
  OPTIMIZER  the optimizer's name in the annotations, "Optimizer.step#OPTIMIZER.step" (AdamW)
Plain data only (dicts, lists, str, int, bool, tuple), pickle protocol 4, as PyTorch writes it.
"""
import pickle
import sys

MiB = 1 << 20
machinery = [
    {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
    {"name": "torch::CapturedTraceback::gather(bool, bool, bool)", "filename": "??", "line": 0},
    {"name": "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)", "filename": "CUDACachingAllocator.cpp", "line": 0},
    {"name": "at::TensorBase at::detail::_empty_generic<c10::ArrayRef<long> >(c10::ArrayRef<long>, c10::Allocator*, c10::DispatchKeySet, c10::ScalarType)", "filename": "??", "line": 0},
]
def op(name):
    return [{"name": name, "filename": "??", "line": 0},
            {"name": "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<at::Tensor (at::Tensor const&)> >::call(c10::OperatorKernel*)", "filename": "RegisterCUDA.cpp", "line": 0},
            {"name": "at::_ops::%s::call(at::Tensor const&)" % name.split("::")[-1].split("(")[0], "filename": "??", "line": 0}]
def py(fn, line, file="/home/u/model.py"):
    return [{"name": fn, "filename": file, "line": line},
            {"name": "_PyEval_EvalFrameDefault", "filename": "??", "line": 0},
            {"name": "_call_impl", "filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py", "line": 1750},
            {"name": "_PyObject_Call_Prepend", "filename": "??", "line": 0}]
main = [{"name": "<module>", "filename": "/home/u/train.py", "line": 40},
        {"name": "__libc_start_main", "filename": "??", "line": 0}, {"name": "_start", "filename": "??", "line": 0}]
def frames(opname, fn, line):
    return machinery + op(opname) + py(fn, line) + main
base = 0x7f0000000000
events, t = [], 1000
def ev(action, addr, size, fr=None):
    global t
    t += 10
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t}
    if fr is not None:
        e["frames"] = fr
    events.append(e)
ann = []


def mark(stage, name):
    ann.append({"stage": stage, "name": name, "device": 0, "time_us": t + 1})


ev("segment_alloc", base, 1024 * MiB, [])
params = base
ev("alloc", params, 64 * MiB, frames("at::native::empty_cuda(c10::ArrayRef<long>)", "__init__", 12))
state = []
addr = base + 64 * MiB
# sequence lengths in units of 8 MiB of activation per layer, 4 layers
MODE = sys.argv[2] if len(sys.argv) > 2 else "varlen"
OPT = sys.argv[3] if len(sys.argv) > 3 else "AdamW"
LENGTHS = [3, 8, 2, 5, 7, 1] if MODE == "varlen" else [2]
STATE = (2, 32 * MiB) if MODE == "varlen" else (4, 64 * MiB)
for step, L in enumerate(LENGTHS, 1):
    acts = []
    for layer in range(4):
        a = addr; addr += L * 8 * MiB
        ev("alloc", a, L * 8 * MiB, frames("at::native::gelu(at::Tensor const&)", "forward", 20 + layer))
        acts.append((a, L * 8 * MiB))
    for a, s in reversed(acts):
        ev("free_requested", a, s, []); ev("free_completed", a, s, [])
    addr = base + 64 * MiB + (len(state) * 32 * MiB)
    mark("START", "Optimizer.step#%s.step" % OPT)
    if step == 1:
        for k in range(STATE[0]):
            s = base + 512 * MiB + k * STATE[1]
            ev("alloc", s, STATE[1], frames("at::native::empty_like(at::Tensor const&)", "step", 80 + k * 2))
            state.append(s)
    mark("END", "Optimizer.step#%s.step" % OPT)
    mark("START", "Optimizer.zero_grad#%s.zero_grad" % OPT)
    mark("END", "Optimizer.zero_grad#%s.zero_grad" % OPT)
blocks = [{"address": params, "size": 64 * MiB, "requested_size": 64 * MiB, "state": "active_allocated", "frames": []}]
blocks += [{"address": s, "size": STATE[1], "requested_size": STATE[1], "state": "active_allocated", "frames": []}
           for s in state]
seg = {"device": 0, "address": base, "total_size": 1024 * MiB, "allocated_size": 128 * MiB, "active_size": 128 * MiB,
       "requested_size": 128 * MiB, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
       "is_expandable": False, "frames": [], "blocks": blocks}
snap = {"segments": [seg], "device_traces": [events], "allocator_settings": {"expandable_segments": False},
        "external_annotations": ann}
pickle.dump(snap, open(sys.argv[1], "wb"), protocol=4)
