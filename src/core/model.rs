//! A simulated GPU behind the core's `Gpu` interface, for `cargo test`.
//!
//! Work is a graph of operations: each op waits for the previous op of its
//! stream and for what CUDA's stream rules add (the legacy stream and
//! blocking streams wait for each other; `wait_event` waits for the event's
//! latest record). Nothing runs until the test says so: `progress` completes
//! ready ops in an order drawn from a seeded generator, and a host wait
//! completes ops until the awaited one is done. So a test chooses the
//! interleaving, and a failing seed replays exactly.
//!
//! The pool follows the driver's reuse rules: a block freed on stream S is
//! reused by a later allocation on S at once (in S's order); on another
//! stream only once its free has completed (opportunistic), or where that
//! stream already waits for the free (event dependencies). Captures follow
//! CUDA's modes: while a stream captures in global mode, a legacy-stream
//! operation or a host wait on the legacy stream fails with 900 and
//! invalidates the capture, and anything recorded into a capturing stream
//! joins the capture; the model counts both as violations.

use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use crate::cuda::gpu::{Context, CuError, CuResult, Event, Gpu, Pool, PoolCounter, Stream, OUT_OF_MEMORY};

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub const CAPTURE_UNSUPPORTED: CuError = CuError(900);
const INVALID_VALUE: CuError = CuError(1);

pub const DEVICE: i32 = 0;
pub const PER_THREAD: Stream = Stream(2 as *mut c_void);
/// The pool key of a block of the real allocator (`alloc_now`).
const REAL_ALLOCATOR: usize = usize::MAX;

/// What a program op does to memory: the checker's view of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Touch {
    pub ptr: u64,
    /// Which allocation of `ptr` the work belongs to (1 = the first).
    pub generation: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureMode {
    Global,
    ThreadLocal,
    Relaxed,
}

pub type OpId = usize;

struct Op {
    deps: Vec<OpId>,
    done: bool,
    stream: usize,
    /// Program work (a kernel) and the memory it uses; None for the shim's ops.
    touch: Option<Touch>,
}

struct StreamState {
    nonblocking: bool,
    last: Option<OpId>,
    destroyed: bool,
    capture: Option<CaptureMode>,
}

struct FreedBlock {
    ptr: u64,
    size: u64,
    free_op: OpId,
    stream: usize,
}

#[derive(Default)]
struct PoolState {
    freed: Vec<FreedBlock>,
    used: u64,
    used_high: u64,
    reserved: u64,
    reserved_high: u64,
    follow_event_deps: bool,
    opportunistic: bool,
}

/// What the model saw that the contract forbids.
#[derive(Default, Debug, Clone)]
pub struct Violations {
    /// Program work that ran while work issued before the free of an earlier
    /// allocation of the same address had not finished.
    pub early_reuse: Vec<String>,
    /// Captures the shim invalidated or joined.
    pub capture: Vec<String>,
    /// A live pointer handed out twice, or other misuse of the driver.
    pub misuse: Vec<String>,
}

impl Violations {
    pub fn is_empty(&self) -> bool {
        self.early_reuse.is_empty() && self.capture.is_empty() && self.misuse.is_empty()
    }
}

struct State {
    ops: Vec<Op>,
    streams: HashMap<usize, StreamState>,
    events: HashMap<usize, Option<OpId>>,
    pools: HashMap<usize, PoolState>,
    /// Pool of each live block, and its size.
    /// Live blocks: their pool (`REAL_ALLOCATOR`: from `alloc_now`) and size.
    allocated: HashMap<u64, (usize, u64)>,
    /// Bytes of the live blocks of `alloc_now`.
    real_bytes: u64,
    next_handle: usize,
    next_address: u64,
    capacity: u64,
    context_id: u64,
    rng: u64,
    /// Per address: the ops that must finish before generation g+1 may run
    /// (everything outstanding when the program freed generation g).
    before_reuse: HashMap<(u64, u64), Vec<OpId>>,
    generations: HashMap<u64, u64>,
    violations: Violations,
    /// Times the shim called a driver function, by name.
    calls: HashMap<&'static str, u64>,
    /// Every address the pools handed out, in order: what a replay must repeat.
    handed_out: Vec<u64>,
}

/// The simulated GPU: one device, one primary context.
pub struct SimGpu {
    state: Mutex<State>,
    /// Another thread's steps, run once right after the next wait the given
    /// stream is made to make: a test's way to land them mid-barrier.
    pub after_next_wait: Mutex<Option<(Stream, Steps)>>,
    /// Another thread's steps, run once right before the next event record
    /// on the legacy stream is issued.
    pub before_next_legacy_record: Mutex<Option<Steps>>,
    /// While set, every event record on the legacy stream fails, as a
    /// driver error would make it.
    pub fail_legacy_records: AtomicBool,
}

/// Steps of another thread, for `SimGpu::after_next_wait` and
/// `SimGpu::before_next_legacy_record`.
pub type Steps = Box<dyn FnOnce() + Send>;

const CONTEXT: Context = Context(0x10 as *mut c_void);
const LEGACY: usize = 1;

impl SimGpu {
    /// A GPU of `capacity` bytes whose op order is drawn from `seed`.
    pub fn new(seed: u64, capacity: u64) -> SimGpu {
        let mut streams = HashMap::new();
        for (handle, nonblocking) in [(LEGACY, false), (PER_THREAD.0 as usize, false)] {
            streams.insert(handle, StreamState { nonblocking, last: None, destroyed: false, capture: None });
        }
        SimGpu {
            state: Mutex::new(State {
                ops: Vec::new(),
                streams,
                events: HashMap::new(),
                pools: HashMap::new(),
                allocated: HashMap::new(),
                real_bytes: 0,
                next_handle: 0x1000,
                next_address: 0x7f00_0000_0000,
                capacity,
                context_id: 1,
                rng: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                before_reuse: HashMap::new(),
                generations: HashMap::new(),
                violations: Violations::default(),
                calls: HashMap::new(),
                handed_out: Vec::new(),
            }),
            after_next_wait: Mutex::new(None),
            before_next_legacy_record: Mutex::new(None),
            fail_legacy_records: AtomicBool::new(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn context(&self) -> Context {
        CONTEXT
    }

    // ---- the program's side ------------------------------------------------

    /// A stream of the program's.
    pub fn program_stream(&self, nonblocking: bool) -> Stream {
        let mut s = self.state();
        Stream(s.new_stream(nonblocking) as *mut c_void)
    }

    /// The program destroys its stream; work already issued still runs.
    pub fn program_destroy_stream(&self, stream: Stream) {
        let mut s = self.state();
        if let Some(st) = s.streams.get_mut(&(stream.0 as usize)) {
            st.destroyed = true;
        }
    }

    /// A kernel of the program's on `stream` using `touch`.
    pub fn launch(&self, stream: Stream, touch: Touch) -> OpId {
        let mut s = self.state();
        s.issue(stream.0 as usize, Some(touch), &[])
    }

    /// The program frees generation `touch.generation` of `touch.ptr` (with
    /// whatever allocator): from now on, the next generation's work must not
    /// run before everything issued so far has finished.
    pub fn program_freed(&self, touch: Touch) {
        let mut s = self.state();
        let outstanding = (0..s.ops.len()).filter(|&i| !s.ops[i].done && s.ops[i].touch.is_some()).collect();
        s.before_reuse.insert((touch.ptr, touch.generation), outstanding);
    }

    /// The program frees a block with `cudaFreeAsync` on `stream`: only the
    /// work ordered before that free must finish before reuse.
    pub fn program_freed_on(&self, touch: Touch, stream: Stream) {
        let mut s = self.state();
        let last = s.streams.get(&(stream.0 as usize)).and_then(|st| st.last);
        let before: Vec<OpId> = match last {
            Some(last) => s.ancestors(last).into_iter().filter(|&i| !s.ops[i].done && s.ops[i].touch.is_some()).collect(),
            None => Vec::new(),
        };
        s.before_reuse.insert((touch.ptr, touch.generation), before);
    }

    pub fn begin_capture(&self, stream: Stream, mode: CaptureMode) -> bool {
        let mut s = self.state();
        let key = stream.0 as usize;
        if key == LEGACY {
            return false;
        }
        match s.streams.get_mut(&key) {
            Some(st) if st.capture.is_none() && !st.destroyed => {
                st.capture = Some(mode);
                true
            }
            _ => false,
        }
    }

    pub fn end_capture(&self, stream: Stream) {
        if let Some(st) = self.state().streams.get_mut(&(stream.0 as usize)) {
            st.capture = None;
        }
    }

    /// Completes up to `n` ready ops, chosen at random.
    pub fn progress(&self, n: usize) {
        let mut s = self.state();
        for _ in 0..n {
            if !s.complete_one() {
                break;
            }
        }
    }

    /// Completes every op (a device synchronization, or the end of a test).
    pub fn drain(&self) {
        let mut s = self.state();
        while s.complete_one() {}
        let stuck: Vec<OpId> = (0..s.ops.len()).filter(|&i| !s.ops[i].done).collect();
        if !stuck.is_empty() {
            s.violations.misuse.push(format!("{} op(s) can never run (a wait cycle)", stuck.len()));
        }
    }

    /// A device reset: all work finishes, the shim's objects die, the
    /// primary context gets a new ID.
    pub fn reset(&self) {
        self.drain();
        let mut s = self.state();
        s.streams.retain(|&h, _| h == LEGACY || h == PER_THREAD.0 as usize);
        s.events.clear();
        s.pools.clear();
        s.allocated.clear();
        s.before_reuse.clear();
        s.context_id += 1;
    }

    /// The next allocation number of `ptr` (1 for its first).
    pub fn next_generation(&self, ptr: u64) -> u64 {
        let mut s = self.state();
        let generation = s.generations.entry(ptr).or_insert(0);
        *generation += 1;
        *generation
    }

    /// The pool (its handle) that handed out the live block `ptr`; None for
    /// a block of the real allocator.
    pub fn pool_of(&self, ptr: u64) -> Option<usize> {
        self.state().allocated.get(&ptr).map(|&(pool, _)| pool).filter(|&pool| pool != REAL_ALLOCATOR)
    }

    /// Whether `ptr` is a live block of a pool or of the real allocator
    /// (handed out, not yet freed).
    pub fn is_allocated(&self, ptr: u64) -> bool {
        self.state().allocated.contains_key(&ptr)
    }

    pub fn violations(&self) -> Violations {
        self.state().violations.clone()
    }

    /// The addresses the pools handed out so far, in order, and the number of
    /// ops issued: two runs of one program and seed must give the same.
    pub fn history(&self) -> (Vec<u64>, usize) {
        let s = self.state();
        (s.handed_out.clone(), s.ops.len())
    }

    /// Driver calls the shim has made so far, but for the questions about
    /// the current context (a thread-local read in the driver).
    pub fn work_calls(&self) -> u64 {
        let s = self.state();
        let context_questions = ["current_context", "current_device", "context_id"];
        s.calls.iter().filter(|(name, _)| !context_questions.contains(name)).map(|(_, n)| n).sum()
    }

    /// Times the shim called the driver function `name`.
    pub fn calls(&self, name: &str) -> u64 {
        self.state().calls.get(name).copied().unwrap_or(0)
    }

    /// Times the shim made the host wait for the GPU.
    pub fn host_waits(&self) -> u64 {
        let s = self.state();
        ["wait_for", "synchronize_stream", "synchronize_context"].iter().filter_map(|name| s.calls.get(name)).sum()
    }

    /// Bytes the pools reserve and the real allocator's live blocks hold.
    pub fn held(&self) -> u64 {
        let s = self.state();
        s.pools.values().map(|p| p.reserved).sum::<u64>() + s.real_bytes
    }

    /// The most memory the pools have held at once, all together.
    pub fn reserved_high(&self) -> u64 {
        self.state().pools.values().map(|p| p.reserved_high).sum()
    }

    /// Whether program work issued before the free of `touch` is unfinished.
    pub fn work_before_free_unfinished(&self, touch: Touch) -> bool {
        let s = self.state();
        s.before_reuse.get(&(touch.ptr, touch.generation)).is_some_and(|ops| ops.iter().any(|&op| !s.ops[op].done))
    }

    fn note(&self, name: &'static str) -> MutexGuard<'_, State> {
        let mut s = self.state();
        *s.calls.entry(name).or_insert(0) += 1;
        s
    }
}

impl State {
    fn new_stream(&mut self, nonblocking: bool) -> usize {
        let handle = self.next_handle;
        self.next_handle += 1;
        self.streams.insert(handle, StreamState { nonblocking, last: None, destroyed: false, capture: None });
        handle
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn global_capture(&self) -> Option<usize> {
        self.streams.iter().find(|(_, st)| st.capture == Some(CaptureMode::Global)).map(|(&h, _)| h)
    }

    /// A shim operation on `stream`: legal in every capture mode?
    fn check_capture(&mut self, stream: usize, what: &str) -> CuResult<()> {
        if self.streams.get(&stream).is_some_and(|st| st.capture.is_some()) {
            self.violations.capture.push(format!("the shim's {what} joined a capture"));
            return Err(CAPTURE_UNSUPPORTED);
        }
        if stream == LEGACY {
            if let Some(capturing) = self.global_capture() {
                self.violations.capture.push(format!("the shim's {what} on the legacy stream invalidated a global capture"));
                if let Some(st) = self.streams.get_mut(&capturing) {
                    st.capture = None;
                }
                return Err(CAPTURE_UNSUPPORTED);
            }
        }
        Ok(())
    }

    /// Adds an op on `stream` after the ops CUDA orders before it.
    fn issue(&mut self, stream: usize, touch: Option<Touch>, extra: &[OpId]) -> OpId {
        let mut deps: Vec<OpId> = extra.to_vec();
        let Some(st) = self.streams.get(&stream) else {
            self.violations.misuse.push(format!("work on unknown stream {stream:#x}"));
            return self.push_op(deps, stream, touch);
        };
        if st.destroyed {
            self.violations.misuse.push(format!("work on destroyed stream {stream:#x}"));
        }
        deps.extend(st.last);
        if stream == LEGACY {
            let blocking: Vec<OpId> = self.streams.values().filter(|s| !s.nonblocking).filter_map(|s| s.last).collect();
            deps.extend(blocking);
        } else if !st.nonblocking {
            deps.extend(self.streams[&LEGACY].last);
        }
        let id = self.push_op(deps, stream, touch);
        self.streams.get_mut(&stream).expect("checked above").last = Some(id);
        id
    }

    fn push_op(&mut self, deps: Vec<OpId>, stream: usize, touch: Option<Touch>) -> OpId {
        self.ops.push(Op { deps, done: false, stream, touch });
        self.ops.len() - 1
    }

    fn ready(&self, id: OpId) -> bool {
        !self.ops[id].done && self.ops[id].deps.iter().all(|&d| self.ops[d].done)
    }

    /// Completes one random ready op; false if none is ready.
    fn complete_one(&mut self) -> bool {
        let ready: Vec<OpId> = (0..self.ops.len()).filter(|&i| self.ready(i)).collect();
        if ready.is_empty() {
            return false;
        }
        let pick = ready[(self.next_random() % ready.len() as u64) as usize];
        self.complete(pick);
        true
    }

    fn complete(&mut self, id: OpId) {
        if let Some(touch) = self.ops[id].touch {
            // Generation 0 of an address is the memory it was mapped from, if any.
            if touch.generation >= 1 {
                if let Some(before) = self.before_reuse.get(&(touch.ptr, touch.generation - 1)) {
                    let unfinished: Vec<OpId> = before.iter().copied().filter(|&b| !self.ops[b].done).collect();
                    if !unfinished.is_empty() {
                        self.violations.early_reuse.push(format!(
                            "work of allocation {} of {:#x} (op {id}, stream {:#x}) ran before op(s) {unfinished:?} \
                             issued before the free of allocation {}",
                            touch.generation, touch.ptr, self.ops[id].stream, touch.generation - 1
                        ));
                    }
                }
            }
        }
        self.ops[id].done = true;
    }

    /// Completes ops until `id` is done; false if it never can be.
    fn run_until(&mut self, id: OpId) -> bool {
        while !self.ops[id].done {
            // Prefer progress toward `id`, but in any order the GPU might choose.
            if !self.complete_one() {
                return false;
            }
        }
        true
    }

    fn ancestors(&self, id: OpId) -> HashSet<OpId> {
        let mut seen = HashSet::new();
        let mut todo = vec![id];
        while let Some(op) = todo.pop() {
            if seen.insert(op) {
                todo.extend(self.ops[op].deps.iter().copied());
            }
        }
        seen
    }

    fn host_wait(&mut self, target: Option<OpId>, what: &str) -> CuResult<()> {
        let Some(target) = target else { return Ok(()) };
        if !self.run_until(target) {
            self.violations.misuse.push(format!("{what} can never finish"));
            return Err(INVALID_VALUE);
        }
        Ok(())
    }
}

impl Gpu for SimGpu {
    fn current_context(&self) -> CuResult<Option<Context>> {
        drop(self.note("current_context"));
        Ok(Some(CONTEXT))
    }

    fn current_device(&self) -> CuResult<i32> {
        drop(self.note("current_device"));
        Ok(DEVICE)
    }

    fn context_id(&self, _ctx: Context) -> CuResult<u64> {
        Ok(self.note("context_id").context_id)
    }

    fn active_primary_context(&self, _device: i32) -> CuResult<Option<Context>> {
        drop(self.note("active_primary_context"));
        Ok(Some(CONTEXT))
    }

    fn push_context(&self, _ctx: Context) -> CuResult<()> {
        drop(self.note("push_context"));
        Ok(())
    }

    fn pop_context(&self) -> CuResult<()> {
        drop(self.note("pop_context"));
        Ok(())
    }

    fn synchronize_context(&self) -> CuResult<()> {
        let mut s = self.note("synchronize_context");
        if let Some(capturing) = s.global_capture() {
            s.violations.capture.push("the shim synchronized the device during a global capture".into());
            s.streams.get_mut(&capturing).expect("found").capture = None;
            return Err(CAPTURE_UNSUPPORTED);
        }
        while s.complete_one() {}
        Ok(())
    }

    fn supports_pools(&self, _device: i32) -> CuResult<bool> {
        drop(self.note("supports_pools"));
        Ok(true)
    }

    fn supports_host_pools(&self, _device: i32) -> CuResult<bool> {
        drop(self.note("supports_host_pools"));
        Ok(true)
    }

    fn device_count(&self) -> CuResult<i32> {
        drop(self.note("device_count"));
        Ok(1)
    }

    fn total_memory(&self, _device: i32) -> CuResult<u64> {
        Ok(self.note("total_memory").capacity)
    }

    fn device_uuid(&self, device: i32) -> CuResult<[u8; 16]> {
        drop(self.note("device_uuid"));
        Ok([device as u8; 16])
    }

    fn create_nonblocking_stream(&self) -> CuResult<Stream> {
        let mut s = self.note("create_stream");
        Ok(Stream(s.new_stream(true) as *mut c_void))
    }

    fn destroy_stream(&self, stream: Stream) -> CuResult<()> {
        let mut s = self.note("destroy_stream");
        match s.streams.get_mut(&(stream.0 as usize)) {
            Some(st) => st.destroyed = true,
            None => s.violations.misuse.push("the shim destroyed an unknown stream".into()),
        }
        Ok(())
    }

    fn synchronize_stream(&self, stream: Stream) -> CuResult<()> {
        let mut s = self.note("synchronize_stream");
        let key = stream.0 as usize;
        s.check_capture(key, "stream synchronize")?;
        let last = s.streams.get(&key).and_then(|st| st.last);
        s.host_wait(last, "a stream synchronize")
    }

    fn is_idle(&self, stream: Stream) -> bool {
        let s = self.note("is_idle");
        let key = stream.0 as usize;
        s.streams.get(&key).is_some_and(|st| st.capture.is_none() && st.last.is_none_or(|op| s.ops[op].done))
    }

    fn is_capturing(&self, stream: Stream) -> bool {
        let s = self.note("is_capturing");
        s.streams.get(&(stream.0 as usize)).is_some_and(|st| st.capture.is_some())
    }

    fn stream_context(&self, _stream: Stream) -> CuResult<Context> {
        drop(self.note("stream_context"));
        Ok(CONTEXT)
    }

    fn wait_event(&self, waiter: Stream, event: Event) -> CuResult<()> {
        let mut s = self.note("wait_event");
        let key = waiter.0 as usize;
        s.check_capture(key, "event wait")?;
        let recorded = s.events.get(&(event.0 as usize)).copied().flatten();
        s.issue(key, None, &recorded.into_iter().collect::<Vec<_>>());
        drop(s);
        let mut hook = self.after_next_wait.lock().unwrap_or_else(|p| p.into_inner());
        if hook.as_ref().is_some_and(|(stream, _)| *stream == waiter) {
            let (_, steps) = hook.take().expect("checked");
            drop(hook);
            steps();
        }
        Ok(())
    }

    fn create_event(&self) -> CuResult<Event> {
        let mut s = self.note("create_event");
        let handle = s.next_handle;
        s.next_handle += 1;
        s.events.insert(handle, None);
        Ok(Event(handle as *mut c_void))
    }

    fn destroy_event(&self, event: Event) -> CuResult<()> {
        let mut s = self.note("destroy_event");
        if s.events.remove(&(event.0 as usize)).is_none() {
            s.violations.misuse.push("the shim destroyed an unknown event".into());
        }
        Ok(())
    }

    fn record(&self, event: Event, stream: Stream) -> CuResult<()> {
        let key = stream.0 as usize;
        if key == LEGACY {
            let steps = self.before_next_legacy_record.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(steps) = steps {
                steps();
            }
        }
        let mut s = self.note("record");
        if key == LEGACY && self.fail_legacy_records.load(Relaxed) {
            return Err(INVALID_VALUE);
        }
        s.check_capture(key, "event record")?;
        let id = s.issue(key, None, &[]);
        match s.events.get_mut(&(event.0 as usize)) {
            Some(latest) => *latest = Some(id),
            None => s.violations.misuse.push("the shim recorded an unknown event".into()),
        }
        Ok(())
    }

    fn has_passed(&self, event: Event) -> bool {
        let s = self.note("has_passed");
        match s.events.get(&(event.0 as usize)) {
            Some(Some(id)) => s.ops[*id].done,
            Some(None) => true,
            None => false,
        }
    }

    fn wait_for(&self, event: Event) -> CuResult<()> {
        let mut s = self.note("wait_for");
        let recorded = s.events.get(&(event.0 as usize)).copied().flatten();
        if let Some(op) = recorded {
            if s.ops[op].stream == LEGACY && !s.ops[op].done && s.global_capture().is_some() {
                return s.check_capture(LEGACY, "host wait");
            }
        }
        s.host_wait(recorded, "an event wait")
    }

    fn create_pool(&self, _device: i32) -> CuResult<Pool> {
        let mut s = self.note("create_pool");
        let handle = s.next_handle;
        s.next_handle += 1;
        s.pools.insert(handle, PoolState { follow_event_deps: true, opportunistic: true, ..PoolState::default() });
        Ok(Pool(handle as *mut c_void))
    }

    fn create_shareable_pool(&self, device: i32) -> CuResult<Pool> {
        self.create_pool(device)
    }

    fn default_pool(&self, device: i32) -> CuResult<Pool> {
        self.create_pool(device)
    }

    fn create_host_pool(&self, device: i32) -> CuResult<Pool> {
        self.create_pool(device)
    }

    fn destroy_pool(&self, pool: Pool) -> CuResult<()> {
        let mut s = self.note("destroy_pool");
        s.pools.remove(&(pool.0 as usize));
        Ok(())
    }

    fn set_release_threshold(&self, _pool: Pool, _bytes: u64) -> CuResult<()> {
        drop(self.note("set_release_threshold"));
        Ok(())
    }

    fn set_reuse_policies(&self, pool: Pool, follow: bool, opportunistic: bool, internal: bool) -> CuResult<()> {
        let mut s = self.note("set_reuse_policies");
        if internal {
            s.violations.misuse.push("internal dependencies are not modelled".into());
        }
        if let Some(p) = s.pools.get_mut(&(pool.0 as usize)) {
            p.follow_event_deps = follow;
            p.opportunistic = opportunistic;
        }
        Ok(())
    }

    fn pool_bytes(&self, pool: Pool, counter: PoolCounter) -> CuResult<u64> {
        let s = self.note("pool_bytes");
        let p = s.pools.get(&(pool.0 as usize)).ok_or(INVALID_VALUE)?;
        Ok(match counter {
            PoolCounter::ReservedNow => p.reserved,
            PoolCounter::ReservedHigh => p.reserved_high,
            PoolCounter::UsedNow => p.used,
            PoolCounter::UsedHigh => p.used_high,
        })
    }

    fn set_peer_access(&self, _pool: Pool, _accessor: i32, _allowed: bool) -> CuResult<()> {
        drop(self.note("set_peer_access"));
        Ok(())
    }

    fn trim(&self, pool: Pool, keep: u64) -> CuResult<()> {
        let mut s = self.note("trim");
        let done: Vec<bool> = s.ops.iter().map(|op| op.done).collect();
        if let Some(p) = s.pools.get_mut(&(pool.0 as usize)) {
            let mut reserved = p.reserved;
            p.freed.retain(|b| {
                let release = done[b.free_op] && reserved >= keep.max(1);
                if release {
                    reserved -= b.size;
                }
                !release
            });
            p.reserved = reserved;
        }
        Ok(())
    }

    fn reset_used_high(&self, pool: Pool) -> CuResult<()> {
        let mut s = self.note("reset_used_high");
        let p = s.pools.get_mut(&(pool.0 as usize)).ok_or(INVALID_VALUE)?;
        p.used_high = p.used;
        Ok(())
    }

    fn alloc_from_pool(&self, size: u64, pool: Pool, stream: Stream) -> CuResult<u64> {
        let mut s = self.note("alloc_from_pool");
        let key = stream.0 as usize;
        s.check_capture(key, "pool allocation")?;
        let pool_key = pool.0 as usize;
        let Some(p) = s.pools.get(&pool_key) else { return Err(INVALID_VALUE) };
        let (follow, opportunistic) = (p.follow_event_deps, p.opportunistic);
        let waits_for = s.streams.get(&key).and_then(|st| st.last).map(|last| s.ancestors(last)).unwrap_or_default();
        let p = &s.pools[&pool_key];
        let reusable = |b: &FreedBlock| {
            b.stream == key || (opportunistic && s.ops[b.free_op].done) || (follow && waits_for.contains(&b.free_op))
        };
        let same_size = p.freed.iter().position(|b| b.size == size && reusable(b));
        // The driver maps freed memory of other sizes anew for a request:
        // those blocks the rules let it reuse, the oldest first, then fresh
        // memory for the rest (what is left of the last stays freed).
        let mut absorbed = Vec::new();
        let mut covered = 0;
        if same_size.is_none() {
            for (index, b) in p.freed.iter().enumerate().filter(|(_, b)| reusable(b)) {
                if covered >= size {
                    break;
                }
                absorbed.push(index);
                covered += b.size;
            }
        }
        let ptr = match same_size {
            Some(index) => s.pools.get_mut(&pool_key).expect("found").freed.swap_remove(index).ptr,
            None => {
                let fresh = size.saturating_sub(covered);
                let reserved: u64 = s.pools.values().map(|p| p.reserved).sum();
                if reserved + s.real_bytes + fresh > s.capacity {
                    return Err(OUT_OF_MEMORY);
                }
                let ptr = s.next_address;
                s.next_address += size.next_multiple_of(512);
                let left = s.next_address;
                s.next_address += covered.saturating_sub(size).next_multiple_of(512);
                // The memory's new addresses inherit what must finish before
                // its reuse: generation 1 there waits as the next generation
                // of each absorbed block would have (`complete`).
                let inherited: Vec<OpId> = absorbed
                    .iter()
                    .flat_map(|&index| {
                        let b = &s.pools[&pool_key].freed[index];
                        let generation = s.generations.get(&b.ptr).copied().unwrap_or(0);
                        s.before_reuse.get(&(b.ptr, generation)).cloned().unwrap_or_default()
                    })
                    .collect();
                let p = s.pools.get_mut(&pool_key).expect("found");
                let removed: Vec<FreedBlock> = absorbed.into_iter().rev().map(|index| p.freed.remove(index)).collect();
                // What is left is freed as late as the latest of them.
                if let Some(latest) = removed.into_iter().max_by_key(|b| b.free_op).filter(|_| covered > size) {
                    p.freed.push(FreedBlock { ptr: left, size: covered - size, ..latest });
                }
                p.reserved += fresh;
                p.reserved_high = p.reserved_high.max(p.reserved);
                if !inherited.is_empty() {
                    s.before_reuse.insert((left, 0), inherited.clone());
                    s.before_reuse.insert((ptr, 0), inherited);
                }
                ptr
            }
        };
        s.handed_out.push(ptr);
        if s.allocated.insert(ptr, (pool_key, size)).is_some() {
            s.violations.misuse.push(format!("the pool handed out the live block {ptr:#x} twice"));
        }
        s.issue(key, None, &[]);
        let p = s.pools.get_mut(&pool_key).expect("found");
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        Ok(ptr)
    }

    fn free_async(&self, ptr: u64, stream: Stream) -> CuResult<()> {
        let mut s = self.note("free_async");
        let key = stream.0 as usize;
        s.check_capture(key, "pool free")?;
        let Some((pool_key, size)) = s.allocated.remove(&ptr) else {
            s.violations.misuse.push(format!("free of {ptr:#x}, not a live pool block"));
            return Err(INVALID_VALUE);
        };
        let free_op = s.issue(key, None, &[]);
        if let Some(p) = s.pools.get_mut(&pool_key) {
            p.used -= size;
            p.freed.push(FreedBlock { ptr, size, free_op, stream: key });
        }
        Ok(())
    }

    fn free_now(&self, ptr: u64) -> CuResult<()> {
        let mut s = self.note("free_now");
        let Some((pool_key, size)) = s.allocated.remove(&ptr) else {
            return Err(INVALID_VALUE);
        };
        if pool_key == REAL_ALLOCATOR {
            // The shim waits for the device before it frees a block of its
            // own: work still on it would write memory handed out again.
            if s.ops.iter().any(|op| !op.done && op.touch.is_some_and(|t| t.ptr == ptr)) {
                s.violations.early_reuse.push(format!("the real free of {ptr:#x} while work on it runs"));
            }
            s.real_bytes -= size;
        } else if let Some(p) = s.pools.get_mut(&pool_key) {
            p.used -= size;
            p.reserved -= size;
        }
        Ok(())
    }

    fn alloc_now(&self, size: u64) -> CuResult<u64> {
        let mut s = self.note("alloc_now");
        if let Some(capturing) = s.global_capture() {
            s.violations.capture.push("the shim's real allocation during a global capture".into());
            s.streams.get_mut(&capturing).expect("found").capture = None;
            return Err(CAPTURE_UNSUPPORTED);
        }
        let reserved: u64 = s.pools.values().map(|p| p.reserved).sum();
        if reserved + s.real_bytes + size > s.capacity {
            return Err(OUT_OF_MEMORY);
        }
        let ptr = s.next_address;
        s.next_address += size.next_multiple_of(512);
        s.real_bytes += size;
        s.handed_out.push(ptr);
        s.allocated.insert(ptr, (REAL_ALLOCATOR, size));
        Ok(ptr)
    }
}
