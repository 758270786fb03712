// torchneuron C++ core: only what PyTorch gives Python no hook for.
//
// - A DeviceAllocator whose pointers are opaque handles inside a PROT_NONE
//   reservation: host code that dereferences one faults at once. Frees are
//   queued for the Python runtime (never a call into Python from a deleter).
// - A pinned host allocator, a DeviceGuardImpl (devices, streams, events),
//   the PrivateUse1 hooks, a per-device Philox-style generator (seed, offset).
// - The metadata-only kernels: empty, empty_strided, as_strided, view,
//   _reshape_alias, resize_, set_.
// The C ABI at the bottom is read by torchneuron/runtime/core.py via ctypes.
#include <ATen/EmptyTensor.h>
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/CallOnce.h>
#include <torch/library.h>

#include <sys/mman.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

using c10::DeviceIndex;
constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 64;
constexpr size_t kAlignment = 512;
constexpr size_t kReservation = size_t(1) << 42;  // 4 TiB of address space, never backed

std::atomic<int> g_device_count{0};
thread_local DeviceIndex t_current_device = 0;

DeviceIndex device_count() { return static_cast<DeviceIndex>(g_device_count.load()); }

void check_device(DeviceIndex index) {
  TORCH_CHECK(index >= 0 && index < device_count(), "Invalid neuron device index ", int(index),
              ": there are ", int(device_count()),
              " neuron devices (set TORCHNEURON_CORES to change that)");
}

// ---------------------------------------------------------------- allocator
// Events for the Python runtime, in the order they happened: a storage grew
// (copy old -> new, then the old handle's free follows) or a handle died.
struct StorageEvent {
  int64_t kind;  // 0 free, 1 grow
  uint64_t handle;
  uint64_t new_handle;
  int64_t device;
  uint64_t nbytes;      // bytes to keep (grow) or bytes freed
  uint64_t new_nbytes;  // grow: the new size
};

// Read by Python without a call (ctypes in_dll): queued events, and whether one must be applied
// before any buffer is read (a growth) or memory is worth reclaiming now.
extern "C" __attribute__((visibility("default"))) std::atomic<int64_t> tn_pending{0};
extern "C" __attribute__((visibility("default"))) std::atomic<int64_t> tn_pending_urgent{0};
constexpr int64_t kDrainCount = 64;
constexpr uint64_t kDrainBytes = uint64_t(64) << 20;

// CUDA's caching allocator serves requests of up to 1 MiB from its small pool; its statistics split
// by pool, so ours do too (tools read "allocated_bytes.small_pool.current" after a small tensor).
constexpr size_t kSmallSize = size_t(1) << 20;

struct PoolCounters {
  int64_t allocated = 0, peak = 0, total_allocated = 0, total_freed = 0;
  int64_t count = 0, peak_count = 0, total_count = 0, total_frees = 0;

  void add(int64_t n) {
    allocated += n;
    total_allocated += n;
    peak = std::max(peak, allocated);
    count++;
    total_count++;
    peak_count = std::max(peak_count, count);
  }
  void remove(int64_t n) {
    allocated -= n;
    total_freed += n;
    count--;
    total_frees++;
  }
  void reset_accumulated() { total_allocated = total_freed = total_count = total_frees = 0; }
  void reset_peak() {
    peak = allocated;
    peak_count = count;
  }
};

// pools[0]: every allocation (c10's StatType::AGGREGATE), [1] small, [2] large: c10's order.
struct DeviceCounters {
  std::array<PoolCounters, 3> pools{};
  int64_t num_ooms = 0;
  int64_t limit = INT64_MAX;
  int64_t allocated() const { return pools[0].allocated; }
};

inline size_t pool_of(size_t nbytes) { return nbytes <= kSmallSize ? 1 : 2; }

void noop_delete(void*) {}
void handle_delete(void* ptr);

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  NeuronAllocator() {
    void* base = mmap(nullptr, kReservation, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TORCH_CHECK(base != MAP_FAILED, "torchneuron: cannot reserve device address space");
    base_ = reinterpret_cast<uintptr_t>(base);
    next_ = base_;
  }

  c10::DataPtr allocate(size_t n) override { return allocate_on(t_current_device, n); }

  c10::DataPtr allocate_on(DeviceIndex device, size_t n) {
    check_device(device);
    c10::Device dev(kNeuron, device);
    if (n == 0) return {nullptr, nullptr, &noop_delete, dev};
    size_t rounded = (n + kAlignment - 1) / kAlignment * kAlignment;
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceCounters& c = counters_[device];
    if (c.allocated() + static_cast<int64_t>(n) > c.limit) {
      c.num_ooms++;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron out of memory on device ", int(device),
                       ": tried to allocate ", n, " bytes with ", c.allocated(), " bytes in use of a limit of ",
                       c.limit, " bytes (TORCHNEURON_MEMORY_LIMIT). Free tensors or lower the batch size.");
    }
    uintptr_t addr = take_range(rounded);
    live_[addr] = Live{n, rounded, device};
    c.pools[0].add(n);
    c.pools[pool_of(n)].add(n);
    void* p = reinterpret_cast<void*>(addr);
    return {p, p, &handle_delete, dev};
  }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == live_.end()) return;
    DeviceCounters& c = counters_[it->second.device];
    c.pools[0].remove(it->second.nbytes);
    c.pools[pool_of(it->second.nbytes)].remove(it->second.nbytes);
    events_.push_back({0, it->first, 0, it->second.device, it->second.nbytes, 0});
    tn_pending = static_cast<int64_t>(events_.size());
    pending_bytes_ += it->second.nbytes;
    if (tn_pending >= kDrainCount || pending_bytes_ >= kDrainBytes) tn_pending_urgent = 1;
    dead_[it->first] = it->second.rounded;
    live_.erase(it);
  }

  void push_grow(uint64_t old_handle, uint64_t new_handle, DeviceIndex device, uint64_t keep_nbytes,
                 uint64_t new_nbytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back({1, old_handle, new_handle, device, keep_nbytes, new_nbytes});
    tn_pending = static_cast<int64_t>(events_.size());
    tn_pending_urgent = 1;
  }

  // Python takes the queued events, drops their buffers, then hands the
  // address ranges back for reuse; a range is never reused before that.
  int64_t take_events(StorageEvent* out, int64_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t n = 0;
    while (n < capacity && !events_.empty()) {
      const StorageEvent& e = events_.front();
      if (e.kind == 0) {
        auto it = dead_.find(e.handle);
        if (it != dead_.end()) {
          taken_.emplace_back(it->first, it->second);
          dead_.erase(it);
        }
      }
      out[n++] = e;
      events_.pop_front();
    }
    tn_pending = static_cast<int64_t>(events_.size());
    if (events_.empty()) {
      pending_bytes_ = 0;
      tn_pending_urgent = 0;
    }
    return n;
  }
  int64_t pending_events() {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int64_t>(events_.size());
  }
  // Hands back the address ranges of every freed handle taken so far: Python has dropped their buffers.
  void release_taken() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [addr, rounded] : taken_) free_ranges_[rounded].push_back(addr);
    taken_.clear();
  }

  int device_of(const void* ptr) {
    uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    if (a < base_ || a >= base_ + kReservation) return -1;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(a);
    if (it == live_.begin()) return -1;
    --it;
    if (a >= it->first + it->second.rounded) return -1;
    return it->second.device;
  }

  DeviceCounters counters(DeviceIndex d) {
    std::lock_guard<std::mutex> lock(mutex_);
    return counters_.at(d);
  }
  void set_limit(DeviceIndex d, int64_t limit) {
    std::lock_guard<std::mutex> lock(mutex_);
    counters_.at(d).limit = limit;
  }

  // c10::DeviceAllocator
  bool initialized() override { return device_count() > 0; }
  void emptyCache(c10::MempoolId_t) override {}
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(DeviceIndex d) override {
    check_device(d);
    DeviceCounters c = counters(d);
    c10::CachingDeviceAllocator::DeviceStats s;
    for (size_t pool = 0; pool < c.pools.size(); pool++) {
      const PoolCounters& p = c.pools[pool];
      for (auto* arr : {&s.allocated_bytes, &s.reserved_bytes, &s.active_bytes, &s.requested_bytes}) {
        auto& st = (*arr)[pool];
        st.current = p.allocated;
        st.peak = p.peak;
        st.allocated = p.total_allocated;
        st.freed = p.total_freed;
      }
      for (auto* arr : {&s.allocation, &s.segment, &s.active}) {
        auto& st = (*arr)[pool];
        st.current = p.count;
        st.peak = p.peak_count;
        st.allocated = p.total_count;
        st.freed = p.total_frees;
      }
    }
    s.num_ooms = c.num_ooms;
    return s;
  }
  void resetAccumulatedStats(DeviceIndex d) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& c = counters_.at(d);
    for (auto& p : c.pools) p.reset_accumulated();
    c.num_ooms = 0;
  }
  void resetPeakStats(DeviceIndex d) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& p : counters_.at(d).pools) p.reset_peak();
  }
  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex d) override {
    DeviceCounters c = counters(d);
    return {static_cast<size_t>(c.limit - c.allocated()), static_cast<size_t>(c.limit)};
  }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "neuron storages hold device handles: copy them with Tensor.copy_()");
  }
  c10::DeleterFnPtr raw_deleter() const override { return &handle_delete; }

 private:
  struct Live {
    size_t nbytes, rounded;
    DeviceIndex device;
  };
  uintptr_t take_range(size_t rounded) {
    auto it = free_ranges_.find(rounded);
    if (it != free_ranges_.end() && !it->second.empty()) {
      uintptr_t a = it->second.back();
      it->second.pop_back();
      return a;
    }
    TORCH_CHECK_WITH(OutOfMemoryError, next_ + rounded <= base_ + kReservation,
                     "neuron: device address space exhausted");
    uintptr_t a = next_;
    next_ += rounded;
    return a;
  }

  std::mutex mutex_;
  uintptr_t base_ = 0, next_ = 0;
  std::map<uintptr_t, Live> live_;
  std::unordered_map<uintptr_t, size_t> dead_;
  std::vector<std::pair<uintptr_t, size_t>> taken_;
  uint64_t pending_bytes_ = 0;
  std::unordered_map<size_t, std::vector<uintptr_t>> free_ranges_;
  std::deque<StorageEvent> events_;
  std::array<DeviceCounters, kMaxDevices> counters_{};
};

NeuronAllocator g_allocator;
void handle_delete(void* ptr) { g_allocator.free(ptr); }
REGISTER_ALLOCATOR(kNeuron, &g_allocator);

// ----------------------------------------------------------- host allocator
// Pinned memory: page-aligned host memory the runtime may hand to the device
// without a staging copy. Tracked so is_pinned() answers correctly.
void pinned_delete(void* ptr);

class PinnedHostAllocator final : public at::HostAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &noop_delete, c10::Device(c10::kCPU)};
    void* p = nullptr;
    TORCH_CHECK(posix_memalign(&p, 4096, n) == 0, "pinned allocation of ", n, " bytes failed");
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_[reinterpret_cast<uintptr_t>(p)] = n;
    return {p, p, &pinned_delete, c10::Device(c10::kCPU)};
  }
  void release(void* p) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_.erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }
  bool contains(const void* ptr) {
    uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a < it->first + it->second;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> blocks_;
};

PinnedHostAllocator g_host_allocator;
void pinned_delete(void* ptr) { g_host_allocator.release(ptr); }
REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator);

// ------------------------------------------------------- streams and events
// Work on a device runs in the order it is issued (JAX orders it by data
// dependence), so streams are labels and events are sync points; waiting is
// delegated to the Python runtime through a callback set once at start-up.
using SyncCallback = void (*)(int64_t device);
std::atomic<SyncCallback> g_sync_callback{nullptr};
void sync_device(DeviceIndex d) {
  if (auto cb = g_sync_callback.load()) cb(d);
}

std::array<std::atomic<c10::StreamId>, kMaxDevices> g_current_stream{};
std::atomic<c10::StreamId> g_next_stream{1};

struct NeuronEvent {
  DeviceIndex device;
  double recorded_at = 0;  // seconds, after the device's work up to the record finished
  bool timing;
};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (d.index() != old.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return {kNeuron, t_current_device}; }
  void setDevice(c10::Device d) const override {
    check_device(d.index());
    t_current_device = d.index();
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_current_device = d.index(); }
  // A device without an index (torch.Stream(device="neuron")) is the current device, as on CUDA.
  static c10::Device resolved(c10::Device d) {
    return d.has_index() ? d : c10::Device(kNeuron, t_current_device);
  }
  c10::Stream getStream(c10::Device d) const override {
    d = resolved(d);
    check_device(d.index());
    return c10::Stream(c10::Stream::UNSAFE, d, g_current_stream[d.index()].load());
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return c10::Stream(c10::Stream::UNSAFE, resolved(d), 0);
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    d = resolved(d);
    check_device(d.index());
    return c10::Stream(c10::Stream::UNSAFE, d, g_next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override { return getNewStream(d, 0); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Device d = resolved(s.device());
    check_device(d.index());
    auto old = g_current_stream[d.index()].exchange(s.id());
    return c10::Stream(c10::Stream::UNSAFE, d, old);
  }
  DeviceIndex deviceCount() const noexcept override { return device_count(); }

  void record(void** event, const c10::Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    auto* e = static_cast<NeuronEvent*>(*event);
    if (!e) {
      e = new NeuronEvent{device_index >= 0 ? device_index : resolved(stream.device()).index(), 0,
                          flag == c10::EventFlag::BACKEND_DEFAULT};
      *event = e;
    }
    // A timed event waits for the work before it, so that elapsed_time
    // measures device work rather than issue time.
    if (e->timing) sync_device(e->device);
    e->recorded_at = now_seconds();
  }
  void block(void*, const c10::Stream&) const override {}  // one ordered queue per device
  bool queryEvent(void* event) const override {
    if (event) sync_device(static_cast<NeuronEvent*>(event)->device);
    return true;
  }
  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    delete static_cast<NeuronEvent*>(event);
  }
  bool queryStream(const c10::Stream& s) const override {
    sync_device(resolved(s.device()).index());
    return true;
  }
  void synchronizeStream(const c10::Stream& s) const override { sync_device(resolved(s.device()).index()); }
  void synchronizeEvent(void* event) const override {
    if (event) sync_device(static_cast<NeuronEvent*>(event)->device);
  }
  void synchronizeDevice(const DeviceIndex d) const override { sync_device(d); }
  double elapsedTime(void* a, void* b, const DeviceIndex) const override {
    auto* ea = static_cast<NeuronEvent*>(a);
    auto* eb = static_cast<NeuronEvent*>(b);
    TORCH_CHECK(ea && eb && ea->timing && eb->timing,
                "elapsed_time needs two recorded events created with enable_timing=True");
    return (eb->recorded_at - ea->recorded_at) * 1000.0;
  }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

// ---------------------------------------------------------------- generator
// Counter-based like CUDA's Philox: the state is (seed, offset); each random
// op derives its key from both and advances the offset.
struct NeuronGenerator final : public c10::GeneratorImpl {
  explicit NeuronGenerator(DeviceIndex d)
      : c10::GeneratorImpl(c10::Device(kNeuron, d), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom(true));
    return seed_;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype().itemsize() == 1,
                "a neuron generator state is a ByteTensor of 16 bytes (seed, offset)");
    const uint8_t* p = static_cast<const uint8_t*>(state.data());
    std::memcpy(&seed_, p, 8);
    std::memcpy(&offset_, p + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    auto t = at::detail::empty_cpu({16}, c10::ScalarType::Byte, std::nullopt, std::nullopt, std::nullopt,
                                   std::nullopt);
    uint8_t* p = static_cast<uint8_t*>(t.data_ptr());
    std::memcpy(p, &seed_, 8);
    std::memcpy(p + 8, &offset_, 8);
    return t.getIntrusivePtr();
  }
  static c10::DeviceType device_type() { return kNeuron; }

 private:
  NeuronGenerator* clone_impl() const override {
    auto* g = new NeuronGenerator(device().index());
    g->seed_ = seed_;
    g->offset_ = offset_;
    return g;
  }
  uint64_t seed_ = c10::default_rng_seed_val;
  uint64_t offset_ = 0;
};

// -------------------------------------------------------------------- hooks
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes);

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  const at::Generator& getDefaultGenerator(DeviceIndex d) const override {
    if (d < 0) d = t_current_device;
    check_device(d);
    static std::array<at::Generator, kMaxDevices> generators;
    static std::array<c10::once_flag, kMaxDevices> once;
    c10::call_once(once[d], [d] { generators[d] = at::make_generator<NeuronGenerator>(d); });
    return generators[d];
  }
  at::Generator getNewGenerator(DeviceIndex d) const override {
    if (d < 0) d = t_current_device;
    check_device(d);
    return at::make_generator<NeuronGenerator>(d);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    int d = g_allocator.device_of(data);
    TORCH_CHECK(d >= 0, "pointer ", data, " is not a live neuron allocation");
    return {kNeuron, static_cast<DeviceIndex>(d)};
  }
  bool isPinnedPtr(const void* data) const override { return g_host_allocator.contains(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &g_host_allocator; }
  bool hasPrimaryContext(DeviceIndex d) const override { return d >= 0 && d < device_count(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_storage_bytes(storage.unsafeGetStorageImpl(), newsize);
  }
  DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(DeviceIndex d) const override {
    check_device(d);
    t_current_device = d;
  }
  DeviceIndex getCurrentDevice() const override { return t_current_device; }
  DeviceIndex exchangeDevice(DeviceIndex d) const override {
    DeviceIndex old = t_current_device;
    setCurrentDevice(d);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override { return exchangeDevice(d); }
};

// ------------------------------------------------------ metadata-only kernels
// A storage grows by taking a new handle; the runtime copies the old buffer
// into the new one when it drains the event queue (before the old free).
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize storage that is not resizable");
  DeviceIndex device = storage->device().index();
  c10::DataPtr fresh = g_allocator.allocate_on(device, new_nbytes);
  g_allocator.push_grow(reinterpret_cast<uint64_t>(storage->data()), reinterpret_cast<uint64_t>(fresh.get()),
                        device, std::min(storage->nbytes(), new_nbytes), new_nbytes);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_nbytes);
}

void fit_storage(c10::TensorImpl* impl) {
  if (impl->numel() == 0) return;
  size_t needed = at::detail::computeStorageNbytes(impl->sizes(), impl->strides(), impl->dtype().itemsize(),
                                                   impl->storage_offset());
  if (needed > impl->storage().nbytes()) resize_storage_bytes(impl->storage().unsafeGetStorageImpl(), needed);
}

at::Tensor neuron_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                        std::optional<c10::Layout>, std::optional<c10::Device> device, std::optional<bool>,
                        std::optional<c10::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor neuron_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                                std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                                std::optional<c10::Device> device, std::optional<bool>) {
  c10::OptionalDeviceGuard guard(device);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                           c10::dtype_or_default(dtype));
}

const at::Tensor& neuron_resize_(const at::Tensor& self, c10::IntArrayRef size,
                                 std::optional<c10::MemoryFormat> memory_format) {
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) {
    impl->set_sizes_contiguous(size);
    fit_storage(impl);
  }
  auto format = memory_format.value_or(c10::MemoryFormat::Contiguous);
  if (format != c10::MemoryFormat::Preserve && memory_format.has_value()) impl->empty_tensor_restride(format);
  return self;
}

at::Tensor& neuron_set_storage_offset(at::Tensor& self, c10::Storage source, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  at::native::checkSetStorage(self, source, offset, size, stride);
  auto* impl = self.unsafeGetTensorImpl();
  impl->set_storage_offset(offset);
  if (stride.data() && !(stride.empty() && !size.empty())) {
    impl->set_sizes_and_strides(size, stride);
  } else {
    impl->set_sizes_contiguous(size);
  }
  fit_storage(impl);
  return self;
}

at::Tensor& neuron_set_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return neuron_set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& neuron_set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return neuron_set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                                   source.strides());
}

at::Tensor& neuron_set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &g_allocator, true);
  // Allocated on the current device: the tensor keeps its own device.
  empty.set_data_ptr_noswap(c10::DataPtr(nullptr, self.device()));
  return neuron_set_storage_offset(self, std::move(empty), 0, {0}, {});
}


// ------------------------------------------------------ attention backend choice
// F.scaled_dot_product_attention (a C++ composite) asks the _fused_sdp_choice DispatchStub, not
// the op, which backend runs; Python cannot register a DispatchStub. Neuron's fused path is the
// "overrideable" backend, lowered in torchneuron/lowering/attention.py. Calls it does not cover
// go to the math path, and so do calls under sdpa_kernel(SDPBackend.MATH).
bool fused_attention_covers(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                            bool enable_gqa) {
  const auto dtype = q.scalar_type();
  const bool floating = dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf;
  if (!floating || k.scalar_type() != dtype || v.scalar_type() != dtype) return false;
  if (q.is_nested() || k.is_nested() || v.is_nested()) return false;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return false;
  // (dropout too: the lowering hands the backward its PRNG key as philox_seed/philox_offset)
  // the fused op has no forward derivative in PyTorch (nor on CPU or CUDA): dual inputs take the
  // math path, so forward-mode AD through attention keeps working
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->_fw_grad(/*level=*/0).defined()) return false;
  }
  if (mask.has_value() && mask->defined() && mask->_fw_grad(/*level=*/0).defined()) return false;
  const int64_t batch = q.sym_size(0).guard_int(__FILE__, __LINE__);
  const int64_t q_heads = q.sym_size(1).guard_int(__FILE__, __LINE__);
  const int64_t kv_heads = k.sym_size(1).guard_int(__FILE__, __LINE__);
  if (k.sym_size(0) != batch || v.sym_size(0) != batch || v.sym_size(1) != kv_heads) return false;
  if (k.sym_size(2) != v.sym_size(2) || k.sym_size(3) != q.sym_size(3)) return false;
  // k/v heads shared by groups of q heads: GQA, or one head broadcast as the math path does
  if (kv_heads != q_heads && !(kv_heads == 1 || (enable_gqa && q_heads % kv_heads == 0))) return false;
  if (mask.has_value() && mask->defined()) {
    if (is_causal || mask->dim() > 4 || mask->is_nested()) return false;
    if (mask->scalar_type() != at::kBool && mask->scalar_type() != dtype) return false;
  }
  return true;
}

int64_t neuron_fused_sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal,
                                std::optional<double> scale, bool enable_gqa) {
  auto& ctx = at::globalContext();
  if (ctx.userEnabledOverrideableSDP() &&
      fused_attention_covers(q, k, v, mask, dropout_p, is_causal, enable_gqa)) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  return static_cast<int64_t>(ctx.userEnabledMathSDP() ? at::SDPBackend::math : at::SDPBackend::error);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", neuron_empty);
  m.impl("empty_strided", neuron_empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", neuron_resize_);
  m.impl("set_.source_Storage", neuron_set_storage);
  m.impl("set_.source_Storage_storage_offset", neuron_set_storage_offset);
  m.impl("set_.source_Tensor", neuron_set_tensor);
  m.impl("set_", neuron_set_empty);
  m.impl("_fused_sdp_choice", neuron_fused_sdp_choice);
}

struct Registrar {
  Registrar() {
    at::RegisterPrivateUse1HooksInterface(new NeuronHooks());
  }
} g_registrar;

}  // namespace

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &neuron_fused_sdp_choice)
}  // namespace at::native

// ------------------------------------------------------ C ABI for the runtime
#define TN_EXPORT __attribute__((visibility("default")))
extern "C" {
TN_EXPORT void tn_set_device_count(int64_t n) { g_device_count = static_cast<int>(std::min<int64_t>(n, kMaxDevices)); }
TN_EXPORT void tn_set_sync_callback(SyncCallback cb) { g_sync_callback = cb; }
TN_EXPORT void tn_set_memory_limit(int64_t device, int64_t limit) { g_allocator.set_limit(device, limit); }
TN_EXPORT int64_t tn_pending_events() { return g_allocator.pending_events(); }
TN_EXPORT int64_t tn_take_events(StorageEvent* out, int64_t capacity) { return g_allocator.take_events(out, capacity); }
TN_EXPORT void tn_release_taken() { g_allocator.release_taken(); }
TN_EXPORT int64_t tn_memory_allocated(int64_t device) { return g_allocator.counters(device).allocated(); }
TN_EXPORT int64_t tn_current_stream(int64_t device) { return g_current_stream.at(device).load(); }
}
