// The C++ hot path of convbw_mlir.torch.enable(native=True): a kernel for aten::convolution_backward on the
// CPU and CUDA keys that looks each call up in a decision table filled by the Python switch, so that a call
// the table knows never enters Python for torch's part (docs/torch.md#the-native-hot-path).
//
// - a miss: the whole call goes to the Python switch (convbw_mlir/torch/native/__init__.py: _miss), which
//   decides as it always does and hands back what to remember for the call's signature;
// - torch's: torch's own kernel, at::native::convolution_backward (what both keys run: CompositeExplicitAutograd
//   on the CPU, the CUDA key's own registration), called directly under the device guard its CUDA wrapper takes;
// - ours: torch's kernel for dx and the bias gradient (output_mask with dW false), then our dW: for a direct
//   launch whose CUDA graph for this memory (stream, x, dy, dW, workspace) is known, the graph launched from here
//   through the driver's cuGraphLaunch, whose address Python handed over (no Python at all); else the Python
//   callable the switch remembered, which also tells which graph it replayed, to be launched from here next time.
// Only ATen/c10 and torch's Python bindings: it builds without CUDA's headers (driver calls by handed-over address).
#include <ATen/Context.h>
#include <ATen/DeviceGuard.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/convolution_backward_native.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
using at::IntArrayRef;
using at::Tensor;
using Result = std::tuple<Tensor, Tensor, Tensor>;

namespace {

// kOff: disable()d, torch's kernel for every call; kTable: the table, misses to Python; kPython: every call to
// the Python switch (enable(native=False) after the C++ kernel was registered: it stays, as the Python one does)
enum Mode : int { kOff = 0, kTable = 1, kPython = 2 };

constexpr int kReasons = 64;       // counters: 0 ours, 1 unaligned, then the Python side's reasons
constexpr size_t kMaxEntries = 4096;  // the Python memo's bound too: programs that see endless shapes

// (step, stream, the addresses its tensor maps describe: at most 2, CudaLauncher's rule), 0 where fewer
using MapsKey = std::array<uintptr_t, 4>;
struct MapsHash {
  size_t operator()(const MapsKey& k) const noexcept {
    size_t h = 0;
    for (uintptr_t v : k) h ^= std::hash<uintptr_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

// the driver's functions, by the address Python hands over (cuda.h's signatures; CUresult 0 is success)
using GraphLaunchFn = int (*)(void* exec, void* stream);              // cuGraphLaunch
using IsCapturingFn = int (*)(void* stream, int* capture_status);     // cuStreamIsCapturing
using MemoryKey = std::array<uintptr_t, 5>;                           // stream, x, dy, dW, workspace
constexpr size_t kMaxGraphs = 64;  // per entry: DirectCall records at most 64 graphs a kernel (entry.py)

struct MemoryHash {
  size_t operator()(const MemoryKey& k) const noexcept {
    size_t h = 0;
    for (uintptr_t v : k) h ^= std::hash<uintptr_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

// DirectCall's schedule launched from here where no graph is known for the memory (DirectCall.native_plan,
// $CONVBW_TORCH_NATIVE_LAUNCH=1): what CudaLauncher._queue does (convbw_mlir/cuda_launch.py), in C++
struct Driver {  // NATIVE_DRIVER_FUNCTIONS' order (entry.py); cuda.h's signatures, CUdeviceptr as uint64_t
  int (*launch_kernel)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void*, void**,
                       void**) = nullptr;
  int (*memset8)(uint64_t, unsigned char, size_t, void*) = nullptr;
  int (*memset16)(uint64_t, unsigned short, size_t, void*) = nullptr;
  int (*memset32)(uint64_t, unsigned, size_t, void*) = nullptr;
  int (*memcpy)(uint64_t, uint64_t, size_t, void*) = nullptr;
  int (*memcpy_htod)(uint64_t, const void*, size_t, void*) = nullptr;
  int (*mem_alloc)(uint64_t*, size_t) = nullptr;
  int (*mem_alloc_host)(void**, size_t) = nullptr;
  int (*encode_tiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const unsigned*, const unsigned*,
                      int, int, int, int) = nullptr;
  int (*encode_im2col)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*, const int*, const int*, unsigned,
                       unsigned, const unsigned*, int, int, int, int) = nullptr;
  int (*event_create)(void**, unsigned) = nullptr;
  int (*event_record)(void*, void*) = nullptr;
  int (*event_query)(void*) = nullptr;
  int (*event_sync)(void*) = nullptr;
};

struct MapSpec {  // one CUtensorMap of a dispatch (cuda_launch.TensorMap)
  int binding = 0, mode = 0, dtype = 0, interleave = 0, swizzle = 0, l2 = 0, oob = 0;
  std::vector<uint64_t> dims, strides;
  std::vector<unsigned> box, elem;
  std::vector<int> lower, upper;
};

struct Step {
  int kind = 0;  // 0 kernel, 1 fill, 2 copy
  void* func = nullptr;
  std::array<unsigned, 7> dims{};  // grid, block, dynamic shared bytes
  std::vector<std::pair<int, int64_t>> binds;  // (buffer: x, dy, dW, workspace; byte offset)
  std::vector<uint32_t> constants;
  int maps_binding = -1;
  std::vector<MapSpec> maps;
  int target = 0, source = -1, width = 0;
  int64_t offset = 0, length = 0, source_offset = 0;
  uint32_t pattern = 0;
};

constexpr size_t kMapsSlot = 256, kMapsSlab = 64;  // cuda_launch._MAPS_SLOT, _MAPS_SLAB
constexpr int kNotReady = 600;                       // CUDA_ERROR_NOT_READY
std::atomic<int64_t> g_map_slots{0};                 // tensor-map slots allocated here, all plans (stats for tests)
std::atomic<int64_t> g_map_waits{0};                 // reuses that waited for the GPU (cuEventSynchronize)

// one tensor-map slot: 256 bytes of device memory, its pinned twin for the upload, the event after its last use
struct MapSlot {
  uint64_t dev = 0;
  char* host = nullptr;
  void* event = nullptr;
  MapsKey key{};
  uint64_t tick = 0;  // last use: the least recently used is reused first
  bool keyed = false;
};

struct Plan {
  Driver drv;
  std::vector<Step> steps;
  // encoded tensor maps per (step, stream, described addresses) in a bounded pool of slots, cuda_launch.MapSlots's
  // rule: at most `cap` slots, the least recently used reused once its event says the GPU read it (else waited
  // for). Never pinned here: C++ launches only on a stream not being captured, so no graph holds its slots (our
  // graphs are recorded by Python's launcher, whose pool pins theirs).
  std::mutex lock;  // held over a step's lookup, launch and event record: a slot is never taken in between
  size_t cap = 64;
  uint64_t tick = 0;
  std::unordered_map<MapsKey, size_t, MapsHash> encoded;  // key -> slot
  std::vector<MapSlot> slots;
};

// a direct launch whose CUDA graphs this side replays itself (DirectCall.native_launch)
struct Graphed {
  PyObject* launch = nullptr;  // launch(x, dy, dW) -> (the cudaGraphExec_t it replayed or 0, its workspace) (owned)
  GraphLaunchFn graph_launch = nullptr;
  IsCapturingFn capturing = nullptr;
  int64_t transient = 0;  // bytes of workspace the kernel needs
  std::unique_ptr<Plan> plan;  // the schedule, launched from here where no graph is known; null: through Python
  // the graphs Python replayed, by memory; owned by the DirectCall (never destroyed) that `launch` holds
  mutable std::shared_mutex lock;
  mutable std::unordered_map<MemoryKey, void*, MemoryHash> execs;
};

struct Entry {
  int reason = 0;         // the counter a call of this signature adds to
  PyObject* dw = nullptr;  // ours: callable(x, w, grad_output) -> dW, or with `direct` kernel(x, grad_output, dW)
                           // into a dW allocated here (owned); null: torch's
  bool direct = false;     // a direct launch on x and dy as they come: dW of this size and these strides
  std::vector<int64_t> size, strides;
  std::unique_ptr<Graphed> graphed;  // a direct launch whose graphs are launched from here; null: through Python
  Entry(int r, PyObject* f) : reason(r), dw(f) { Py_XINCREF(dw); }
  ~Entry() {
    if ((dw != nullptr || (graphed && graphed->launch != nullptr)) && Py_IsInitialized()) {
      py::gil_scoped_acquire gil;  // the last holder may be a thread without the GIL
      Py_XDECREF(dw);
      if (graphed) Py_XDECREF(graphed->launch);
    }
  }
};

using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const noexcept {
    size_t h = k.size();
    for (int64_t v : k) h ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
  }
};

std::atomic<int> g_mode{kOff};
std::shared_mutex g_lock;
// never destroyed: at exit Python is gone before static destructors run, and entries hold Python callables
auto& g_table = *new std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash>();
// the id of the switch's settings (the Python side numbers each distinct one, never reusing a number): the first
// element of every key, so decisions made under other settings are never taken and come back when they do
std::atomic<int64_t> g_settings{-1};
PyObject* g_miss = nullptr;    // the Python switch's entry for misses (owned)
std::array<std::atomic<int64_t>, kReasons> g_counts{};
// the workspace the direct launches last used per (device type, index, stream): DirectCall's own (entry.py), as
// its launch handed it back, so a graph keyed by its address is replayed on the memory it was recorded with;
// never destroyed (its tensors outlive Python's end, as DirectCall's do)
using StreamKey = std::array<int64_t, 3>;
struct StreamHash {
  size_t operator()(const StreamKey& k) const noexcept {
    return std::hash<int64_t>{}(k[0] * 1000003 + k[1]) ^ (std::hash<int64_t>{}(k[2]) << 1);
  }
};
std::shared_mutex g_ws_lock;
auto& g_workspaces = *new std::unordered_map<StreamKey, Tensor, StreamHash>();
std::atomic<int64_t> g_graph_launches{0};  // graphs launched from here (not through Python): stats for tests
std::atomic<int64_t> g_plain_launches{0};  // schedules launched from here (DirectCall.native_plan)

template <class T>
std::vector<T> values(py::handle h) {
  std::vector<T> out;
  for (auto v : h) out.push_back(static_cast<T>(v.cast<int64_t>()));
  return out;
}

// DirectCall.native_plan's tuple; null where a function the schedule calls is missing (then through Python)
std::unique_ptr<Plan> parse_plan(py::handle h) {
  auto t = py::reinterpret_borrow<py::tuple>(h);
  auto fns = values<uintptr_t>(t[0]);
  if (fns.size() != 14) throw std::runtime_error("convbw native: a plan names 14 driver functions");
  auto p = std::make_unique<Plan>();
  Driver& d = p->drv;
  auto set = [&](auto& f, size_t i) { f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(fns[i]); };
  set(d.launch_kernel, 0), set(d.memset8, 1), set(d.memset16, 2), set(d.memset32, 3), set(d.memcpy, 4);
  set(d.memcpy_htod, 5), set(d.mem_alloc, 6), set(d.mem_alloc_host, 7), set(d.encode_tiled, 8);
  set(d.encode_im2col, 9), set(d.event_create, 10), set(d.event_record, 11), set(d.event_query, 12);
  set(d.event_sync, 13);
  if (t.size() > 2) p->cap = static_cast<size_t>(std::max<int64_t>(t[2].cast<int64_t>(), 1));
  bool ok = d.launch_kernel != nullptr;
  for (auto sh : t[1]) {
    auto st = py::reinterpret_borrow<py::tuple>(sh);
    Step s;
    s.kind = st[0].cast<int>();
    if (s.kind == 0) {
      s.func = reinterpret_cast<void*>(st[1].cast<uintptr_t>());
      auto dims = values<unsigned>(st[2]);
      if (dims.size() != 7) throw std::runtime_error("convbw native: a kernel step has 7 launch dimensions");
      std::copy(dims.begin(), dims.end(), s.dims.begin());
      for (auto b : st[3]) {
        auto bt = py::reinterpret_borrow<py::tuple>(b);
        s.binds.emplace_back(bt[0].cast<int>(), bt[1].cast<int64_t>());
      }
      for (auto c : st[4]) s.constants.push_back(static_cast<uint32_t>(c.cast<int64_t>()));
      s.maps_binding = st[5].cast<int>();
      for (auto mh : st[6]) {
        auto m = py::reinterpret_borrow<py::tuple>(mh);
        MapSpec ms;
        ms.binding = m[0].cast<int>(), ms.mode = m[1].cast<int>(), ms.dtype = m[2].cast<int>();
        ms.dims = values<uint64_t>(m[3]), ms.strides = values<uint64_t>(m[4]), ms.box = values<unsigned>(m[5]);
        ms.elem = values<unsigned>(m[6]), ms.lower = values<int>(m[7]), ms.upper = values<int>(m[8]);
        ms.interleave = m[9].cast<int>(), ms.swizzle = m[10].cast<int>(), ms.l2 = m[11].cast<int>();
        ms.oob = m[12].cast<int>();
        ok &= (ms.mode == 0 ? d.encode_tiled != nullptr : d.encode_im2col != nullptr);
        s.maps.push_back(std::move(ms));
      }
      ok &= s.maps.size() <= 2 &&
            (s.maps.empty() || (d.memcpy_htod && d.mem_alloc && d.mem_alloc_host && d.event_create &&
                                d.event_record && d.event_query && d.event_sync && s.maps_binding >= 0 &&
                                s.maps_binding < static_cast<int>(s.binds.size() + s.constants.size())));
      for (auto& [which, off] : s.binds) ok &= which >= 0 && which < 4;
      for (auto& ms : s.maps) ok &= ms.binding >= 0 && ms.binding < static_cast<int>(s.binds.size());
    } else {
      s.target = st[1].cast<int>(), s.offset = st[2].cast<int64_t>(), s.length = st[3].cast<int64_t>();
      s.source = st[4].cast<int>(), s.source_offset = st[5].cast<int64_t>();
      s.pattern = static_cast<uint32_t>(st[6].cast<int64_t>()), s.width = st[7].cast<int>();
      ok &= s.target >= 0 && s.target < 4;
      if (s.kind == 1)
        ok &= (s.width == 1 && d.memset8) || (s.width == 2 && d.memset16) || (s.width == 4 && d.memset32);
      else
        ok &= s.kind == 2 && d.memcpy != nullptr && s.source >= 0 && s.source < 4;
    }
    p->steps.push_back(std::move(s));
  }
  return ok ? std::move(p) : nullptr;
}

[[noreturn]] void cu_fail(int rc, const std::string& what) {
  throw std::runtime_error("convbw native: " + what + ": CUDA error " + std::to_string(rc));
}

// the message is built only on failure: a launch's hot path allocates no string
void cu_check(int rc, const char* what) {
  if (rc != 0) cu_fail(rc, what);
}

// a slot free to be written now (MapSlots.take): a fresh one while fewer than `cap` exist, else the least recently
// used, after its last reader (its event; waited for if the GPU has not got there). Under p.lock.
size_t take_slot(Plan& p) {
  const Driver& d = p.drv;
  if (p.slots.size() < p.cap && p.slots.size() == p.encoded.size()) {  // all in use: grow by a slab, to the cap
    const size_t n = std::min(kMapsSlab, p.cap - p.slots.size());
    uint64_t dev = 0;
    void* host = nullptr;
    cu_check(d.mem_alloc(&dev, kMapsSlot * n), "cuMemAlloc (tensor maps)");
    cu_check(d.mem_alloc_host(&host, kMapsSlot * n), "cuMemAllocHost (tensor maps)");
    for (size_t i = 0; i < n; ++i) {  // never freed, as the plan's other resources
      MapSlot slot;
      slot.dev = dev + kMapsSlot * i, slot.host = static_cast<char*>(host) + kMapsSlot * i;
      cu_check(d.event_create(&slot.event, 2), "cuEventCreate (tensor maps)");  // CU_EVENT_DISABLE_TIMING
      p.slots.push_back(slot);
    }
    g_map_slots.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed);
  }
  size_t best = p.slots.size();
  for (size_t i = 0; i < p.slots.size(); ++i) {
    if (!p.slots[i].keyed) return i;
    if (best == p.slots.size() || p.slots[i].tick < p.slots[best].tick) best = i;
  }
  MapSlot& old = p.slots[best];
  const int rc = d.event_query(old.event);
  if (rc == kNotReady) {
    g_map_waits.fetch_add(1, std::memory_order_relaxed);
    cu_check(d.event_sync(old.event), "cuEventSynchronize (tensor maps)");
  } else {
    cu_check(rc, "cuEventQuery (tensor maps)");
  }
  p.encoded.erase(old.key);
  old.keyed = false;
  return best;
}

// the slot of step `index`'s tensor maps for the addresses its payload binds (CudaLauncher._maps_for); under p.lock
MapSlot& maps_for(Plan& p, size_t index, const Step& s, const uint64_t* payload, void* stream) {
  MapsKey key{index, reinterpret_cast<uintptr_t>(stream), 0, 0};
  for (size_t k = 0; k < s.maps.size(); ++k) key[2 + k] = payload[s.maps[k].binding];
  auto it = p.encoded.find(key);
  if (it != p.encoded.end()) {
    MapSlot& slot = p.slots[it->second];
    slot.tick = ++p.tick;
    return slot;
  }
  const Driver& d = p.drv;
  const size_t at = take_slot(p);
  MapSlot& slot = p.slots[at];
  for (size_t k = 0; k < s.maps.size(); ++k) {
    const MapSpec& m = s.maps[k];
    alignas(64) unsigned char map[128] = {};
    const unsigned rank = static_cast<unsigned>(m.dims.size());
    std::vector<uint64_t> strides = m.strides;
    strides.resize(std::max<size_t>(strides.size(), 1));
    void* address = reinterpret_cast<void*>(payload[m.binding]);
    int rc;
    if (m.mode == 0) {
      rc = d.encode_tiled(map, m.dtype, rank, address, m.dims.data(), strides.data(), m.box.data(), m.elem.data(),
                          m.interleave, m.swizzle, m.l2, m.oob);
    } else {
      std::vector<int> lower = m.lower, upper = m.upper;
      lower.resize(std::max<size_t>(lower.size(), 1)), upper.resize(std::max<size_t>(upper.size(), 1));
      rc = d.encode_im2col(map, m.dtype, rank, address, m.dims.data(), strides.data(), lower.data(), upper.data(),
                           m.box.at(0), m.box.at(1), m.elem.data(), m.interleave, m.swizzle, m.l2, m.oob);
    }
    if (rc != 0)
      cu_fail(rc, std::string(m.mode == 0 ? "cuTensorMapEncodeTiled" : "cuTensorMapEncodeIm2col") + " (step " +
                      std::to_string(index) + ", binding " + std::to_string(m.binding) + ")");
    std::memcpy(slot.host + 128 * k, map, 128);
  }
  cu_check(d.memcpy_htod(slot.dev, slot.host, 128 * s.maps.size(), stream), "cuMemcpyHtoDAsync (tensor maps)");
  slot.key = key, slot.keyed = true, slot.tick = ++p.tick;
  p.encoded.emplace(key, at);
  return slot;
}

// the schedule on `stream` (CudaLauncher._queue): ptrs are x, dy, dW and the workspace's addresses
void plain_launch(Plan& p, void* stream, const std::array<uint64_t, 4>& ptrs) {
  const Driver& d = p.drv;
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const Step& s = p.steps[i];
    if (s.kind == 0) {
      const size_t nb = s.binds.size(), n = nb + s.constants.size();
      std::vector<uint64_t> payload(std::max<size_t>(n, 1));  // one 8-byte slot a binding, then each constant
      std::vector<void*> params(std::max<size_t>(n, 1));
      for (size_t j = 0; j < nb; ++j) payload[j] = ptrs[s.binds[j].first] + s.binds[j].second;
      for (size_t j = 0; j < s.constants.size(); ++j) payload[nb + j] = s.constants[j];
      for (size_t j = 0; j < n; ++j) params[j] = &payload[j];
      std::unique_lock<std::mutex> lock(p.lock, std::defer_lock);
      MapSlot* slot = nullptr;
      if (!s.maps.empty()) {
        lock.lock();
        slot = &maps_for(p, i, s, payload.data(), stream);
        payload[s.maps_binding] = slot->dev;
      }
      const int rc = d.launch_kernel(s.func, s.dims[0], s.dims[1], s.dims[2], s.dims[3], s.dims[4], s.dims[5],
                                     s.dims[6], stream, params.data(), nullptr);
      if (rc != 0) cu_fail(rc, "cuLaunchKernel (step " + std::to_string(i) + ")");
      if (slot != nullptr) cu_check(d.event_record(slot->event, stream), "cuEventRecord (tensor maps)");
    } else if (s.kind == 1) {
      const uint64_t dst = ptrs[s.target] + s.offset;
      const size_t count = static_cast<size_t>(s.length / s.width);
      const int rc = s.width == 1   ? d.memset8(dst, static_cast<unsigned char>(s.pattern), count, stream)
                     : s.width == 2 ? d.memset16(dst, static_cast<unsigned short>(s.pattern), count, stream)
                                    : d.memset32(dst, s.pattern, count, stream);
      if (rc != 0) cu_fail(rc, "cuMemsetD" + std::to_string(8 * s.width) + "Async (step " + std::to_string(i) + ")");
    } else {
      const int rc = d.memcpy(ptrs[s.target] + s.offset, ptrs[s.source] + s.source_offset,
                              static_cast<size_t>(s.length), stream);
      if (rc != 0) cu_fail(rc, "cuMemcpyAsync (step " + std::to_string(i) + ")");
    }
  }
}

void push(Key& k, IntArrayRef a) {
  k.push_back(static_cast<int64_t>(a.size()));
  k.insert(k.end(), a.begin(), a.end());
}

// everything the Python switch's memo key holds (switch.py, _override)
Key make_key(const Tensor& go, const Tensor& x, const Tensor& w, IntArrayRef stride, IntArrayRef padding,
             IntArrayRef dilation, bool transposed, IntArrayRef output_padding, int64_t groups) {
  Key k;
  k.reserve(64);
  k.push_back(g_settings.load(std::memory_order_acquire));
  k.push_back(static_cast<int64_t>(x.device().type()));
  k.push_back(x.device().index());
  k.push_back(static_cast<int64_t>(x.scalar_type()));
  k.push_back(static_cast<int64_t>(go.scalar_type()));
  k.push_back(static_cast<int64_t>(w.scalar_type()));
  push(k, x.sizes());
  push(k, x.strides());
  push(k, go.sizes());
  push(k, go.strides());
  push(k, w.sizes());
  push(k, w.strides());
  push(k, stride);
  push(k, padding);
  push(k, dilation);
  push(k, output_padding);
  k.push_back(transposed);
  k.push_back(groups);
  k.push_back(at::globalContext().deterministicAlgorithms());
  return k;
}

Result torch_kernel(const Tensor& go, const Tensor& x, const Tensor& w, at::OptionalIntArrayRef bias_sizes,
                    IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                    IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  const c10::OptionalDeviceGuard guard(at::device_of(go));  // as the CUDA key's generated wrapper does
  return at::native::convolution_backward(go, x, w, bias_sizes, stride, padding, dilation, transposed,
                                          output_padding, groups, mask);
}

py::object wrap(const Tensor& t) {
  if (!t.defined()) return py::none();
  return py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
}

Tensor unwrap(py::handle h, const char* what) {
  if (h.is_none()) return Tensor();
  if (!THPVariable_Check(h.ptr())) throw std::runtime_error(std::string("convbw native: ") + what + " is not a tensor");
  return THPVariable_Unpack(h.ptr());
}

py::tuple ints(IntArrayRef a) {
  py::tuple t(a.size());
  for (size_t i = 0; i < a.size(); ++i) t[i] = py::int_(a[i]);
  return t;
}

Result miss(int mode, const Key* key, const Tensor& go, const Tensor& x, const Tensor& w,
            at::OptionalIntArrayRef bias_sizes, IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation,
            bool transposed, IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  py::gil_scoped_acquire gil;
  try {
    py::object bias = bias_sizes.has_value() ? py::object(ints(*bias_sizes)) : py::object(py::none());
    py::list m(3);
    for (int i = 0; i < 3; ++i) m[i] = py::bool_(mask[i]);
    // lists where the schema has lists: what the Python kernel receives from the dispatcher
    py::tuple out = py::handle(g_miss)(wrap(go), wrap(x), wrap(w), bias, py::list(ints(stride)),
                                       py::list(ints(padding)), py::list(ints(dilation)), transposed,
                                       py::list(ints(output_padding)), groups, m);
    Result r{unwrap(out[0], "dx"), unwrap(out[1], "dW"), unwrap(out[2], "the bias gradient")};
    const int reason = out[4].cast<int>();
    const int64_t settings = out[3].cast<int64_t>();
    if (mode == kTable && key != nullptr && reason >= 0 && reason < kReasons && settings >= 0) {
      Key k = *key;
      k[0] = settings;  // remembered under the settings it was decided under (they may have changed meanwhile)
      auto e = std::make_shared<Entry>(reason, out[5].is_none() ? nullptr : out[5].ptr());
      if (!out[6].is_none()) {  // (size, strides) of dW for a direct launch
        e->direct = true;
        for (auto v : py::reinterpret_borrow<py::tuple>(out[6])[0]) e->size.push_back(v.cast<int64_t>());
        for (auto v : py::reinterpret_borrow<py::tuple>(out[6])[1]) e->strides.push_back(v.cast<int64_t>());
        if (!out[7].is_none()) {  // (launch, cuGraphLaunch, cuStreamIsCapturing, workspace bytes)
          auto spec = py::reinterpret_borrow<py::tuple>(out[7]);
          auto g = std::make_unique<Graphed>();
          g->graph_launch = reinterpret_cast<GraphLaunchFn>(spec[1].cast<uintptr_t>());
          g->capturing = reinterpret_cast<IsCapturingFn>(spec[2].cast<uintptr_t>());
          g->transient = spec[3].cast<int64_t>();
          if (spec.size() > 4 && !spec[4].is_none()) g->plan = parse_plan(spec[4]);
          if (g->capturing != nullptr && (g->graph_launch != nullptr || g->plan)) {
            g->launch = py::object(spec[0]).release().ptr();
            e->graphed = std::move(g);
          }
        }
      }
      std::remove_reference_t<decltype(g_table)> old;  // freed outside the lock
      std::unique_lock lock(g_lock);
      if (g_table.size() >= kMaxEntries) old.swap(g_table);
      g_table.emplace(std::move(k), std::move(e));
    }
    return r;
  } catch (py::error_already_set& e) {
    e.restore();
    throw python_error();
  }
}

void* current_stream(const at::Device& d) {
  if (d.is_cpu()) return nullptr;  // the CPU tests' stand-in for a direct launch: stream 0
  const auto* impl = c10::impl::getDeviceGuardImpl(d.type());
  return impl->getStreamNativeHandle(impl->getStream(d));
}

StreamKey stream_key(const at::Device& d, void* stream) {
  return {static_cast<int64_t>(d.type()), d.index(), static_cast<int64_t>(reinterpret_cast<intptr_t>(stream))};
}

MemoryKey memory_key(void* stream, const Tensor& x, const Tensor& go, const Tensor& dw, const Tensor& ws) {
  return {reinterpret_cast<uintptr_t>(stream), reinterpret_cast<uintptr_t>(x.data_ptr()),
          reinterpret_cast<uintptr_t>(go.data_ptr()), reinterpret_cast<uintptr_t>(dw.data_ptr()),
          reinterpret_cast<uintptr_t>(ws.data_ptr())};
}

// our dW of a direct entry into a dW allocated here: the CUDA graph DirectCall recorded for this memory launched
// from here (no Python), else the kernel through Python, which says which graph it replayed, if any
Tensor direct_dw(const Entry& e, const Tensor& x, const Tensor& go) {
  Tensor dw = at::empty_strided(e.size, e.strides, x.options());
  const Graphed* g = e.graphed.get();
  void* stream = nullptr;
  bool graphs = false;
  if (g != nullptr) {
    const c10::OptionalDeviceGuard guard(at::device_of(x));  // as torch's replay() takes
    stream = current_stream(x.device());
    int status = 1;
    // never while the stream is being captured (the kernels go into that capture, as in Python), nor unsure
    graphs = g->capturing(stream, &status) == 0 && status == 0;
    Tensor ws;
    if (graphs) {
      std::shared_lock lock(g_ws_lock);
      auto it = g_workspaces.find(stream_key(x.device(), stream));
      if (it != g_workspaces.end() && it->second.numel() >= g->transient) ws = it->second;
    }
    if (ws.defined()) {
      void* exec = nullptr;
      if (g->graph_launch != nullptr) {
        std::shared_lock lock(g->lock);
        auto it = g->execs.find(memory_key(stream, x, go, dw, ws));
        if (it != g->execs.end()) exec = it->second;
      }
      if (exec == nullptr && g->plan) {  // no graph for this memory: the schedule itself, from here
        plain_launch(*g->plan, stream,
                     {reinterpret_cast<uint64_t>(x.data_ptr()), reinterpret_cast<uint64_t>(go.data_ptr()),
                      reinterpret_cast<uint64_t>(dw.data_ptr()), reinterpret_cast<uint64_t>(ws.data_ptr())});
        g_plain_launches.fetch_add(1, std::memory_order_relaxed);
        return dw;
      }
      if (exec != nullptr) {
        const int rc = g->graph_launch(exec, stream);
        if (rc != 0)
          throw std::runtime_error("convbw native: cuGraphLaunch of our dW kernel's CUDA graph: CUDA error " +
                                   std::to_string(rc));
        g_graph_launches.fetch_add(1, std::memory_order_relaxed);
        return dw;
      }
    }
  }
  py::gil_scoped_acquire gil;
  try {
    if (!graphs) {
      py::handle(e.dw)(wrap(x), wrap(go), wrap(dw));
      return dw;
    }
    py::tuple r = py::handle(g->launch)(wrap(x), wrap(go), wrap(dw));
    const auto exec = r[0].cast<uintptr_t>();
    const Tensor used = unwrap(r[1], "the workspace");
    if (used.defined()) {
      Tensor old;  // released outside the lock
      {
        std::unique_lock lock(g_ws_lock);
        Tensor& held = g_workspaces[stream_key(x.device(), stream)];
        old = std::move(held);
        held = used;
      }
      if (exec != 0) {
        std::unique_lock lock(g->lock);
        if (g->execs.size() < kMaxGraphs) g->execs.emplace(memory_key(stream, x, go, dw, used), reinterpret_cast<void*>(exec));
      }
    }
    return dw;
  } catch (py::error_already_set& err) {
    err.restore();
    throw python_error();
  }
}

Result convolution_backward(const Tensor& go, const Tensor& x, const Tensor& w, at::OptionalIntArrayRef bias_sizes,
                            IntArrayRef stride, IntArrayRef padding, IntArrayRef dilation, bool transposed,
                            IntArrayRef output_padding, int64_t groups, std::array<bool, 3> mask) {
  const int mode = g_mode.load(std::memory_order_acquire);
  if (mode == kOff || !mask[1])
    return torch_kernel(go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask);
  if (mode == kPython)
    return miss(mode, nullptr, go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                mask);
  const Key key = make_key(go, x, w, stride, padding, dilation, transposed, output_padding, groups);
  std::shared_ptr<const Entry> e;
  {
    std::shared_lock lock(g_lock);
    auto it = g_table.find(key);
    if (it != g_table.end()) e = it->second;
  }
  if (!e)
    return miss(mode, &key, go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                mask);
  const bool aligned =
      !x.is_cuda() || ((reinterpret_cast<uintptr_t>(x.data_ptr()) | reinterpret_cast<uintptr_t>(go.data_ptr())) & 15) == 0;
  if (e->dw == nullptr || !aligned) {  // torch's whole (our direct launch's pointers are 16-byte aligned)
    g_counts[e->dw == nullptr ? e->reason : 1].fetch_add(1, std::memory_order_relaxed);
    return torch_kernel(go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups, mask);
  }
  Tensor dx, db;
  if (mask[0] || mask[2]) {
    Result rest = torch_kernel(go, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                               {mask[0], false, mask[2]});
    dx = std::get<0>(rest);
    db = std::get<2>(rest);
  }
  Tensor dw;
  {
    RECORD_FUNCTION("convbw::conv_weight", std::vector<c10::IValue>());  // torch.profiler tells ours from torch's
    if (e->direct) {  // dW allocated here (the Python allocation and two frames fewer), the kernel queues it
      dw = direct_dw(*e, x, go);
    } else {
      py::gil_scoped_acquire gil;
      try {
        dw = unwrap(py::handle(e->dw)(wrap(x), wrap(w), wrap(go)), "dW");
      } catch (py::error_already_set& err) {
        err.restore();
        throw python_error();
      }
    }
    e.reset();  // the last holder (a table cleared meanwhile) takes the GIL to release the callables (~Entry)
  }
  g_counts[0].fetch_add(1, std::memory_order_relaxed);
  return {dx, dw, db};
}

// torch's "Overriding a previously registered kernel" (the Python switch's, or torch's own CUDA one): we mean it
struct Quiet : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

void register_kernel() {
  static bool done = false;
  if (done) return;
  done = true;
  Quiet quiet;
  const c10::WarningUtils::WarningHandlerGuard guard(&quiet);
  // never freed: a kernel removed while another thread dispatches to it is freed under that thread (issue 42)
  auto* lib = new torch::Library(torch::Library::IMPL, "aten", std::nullopt, __FILE__, __LINE__);
  lib->impl("convolution_backward", torch::dispatch(c10::DispatchKey::CPU, TORCH_FN(convolution_backward)));
  lib->impl("convolution_backward", torch::dispatch(c10::DispatchKey::CUDA, TORCH_FN(convolution_backward)));
}

// the switch's state: mode, the id of its settings, the Python entry for misses
void set_state(int mode, int64_t settings, py::object miss_fn) {
  if (mode < kOff || mode > kPython) throw py::value_error("mode: expected 0, 1 or 2, got " + std::to_string(mode));
  if (!miss_fn.is_none()) {
    Py_XDECREF(g_miss);
    g_miss = miss_fn.inc_ref().ptr();
  }
  g_settings.store(settings, std::memory_order_release);
  g_mode.store(mode, std::memory_order_release);
}

void clear() {
  std::remove_reference_t<decltype(g_table)> old;  // freed after the lock is released (with the GIL: Python calls)
  std::unique_lock lock(g_lock);
  old.swap(g_table);
}

std::vector<int64_t> counts() {
  std::vector<int64_t> out(kReasons);
  for (int i = 0; i < kReasons; ++i) out[i] = g_counts[i].load(std::memory_order_relaxed);
  return out;
}

void reset_counts() {
  for (auto& c : g_counts) c.store(0, std::memory_order_relaxed);
  g_graph_launches.store(0, std::memory_order_relaxed);
  g_plain_launches.store(0, std::memory_order_relaxed);
}

int64_t graph_launches() { return g_graph_launches.load(std::memory_order_relaxed); }
int64_t plain_launches() { return g_plain_launches.load(std::memory_order_relaxed); }
// tensor-map slots allocated and reuses that waited, over the process (bounded: a cap a plan, cuda_launch.MapSlots)
std::pair<int64_t, int64_t> map_slots() {
  return {g_map_slots.load(std::memory_order_relaxed), g_map_waits.load(std::memory_order_relaxed)};
}

size_t table_size() {
  std::shared_lock lock(g_lock);
  return g_table.size();
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("register_kernel", &register_kernel, "register the C++ kernel for aten::convolution_backward (CPU, CUDA)");
  m.def("set_state", &set_state, py::arg("mode"), py::arg("settings"), py::arg("miss"));
  m.def("clear", &clear);
  m.def("counts", &counts);
  m.def("reset_counts", &reset_counts);
  m.def("graph_launches", &graph_launches, "our dW's CUDA graphs launched from C++ since reset_counts");
  m.def("plain_launches", &plain_launches, "our dW's schedules launched from C++ (no graph) since reset_counts");
  m.def("map_slots", &map_slots, "(tensor-map slots allocated, reuses that waited) by the schedules launched here");
  m.def("table_size", &table_size);
  m.attr("REASONS") = kReasons;
}
